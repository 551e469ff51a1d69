"""Parameter-server round trips against a raw-TCP baseline, and under concurrent clients.

Part 1 (latency): for payloads of 32 KB, 1 MB, 4 MB and 40 MB, one client
process does ``pull`` + ``commit`` round trips through the real stack (PSServer
+ Flask app + Store with DOWNPOUR, PSClient over HTTP: token, decoding,
validation, finite check, idempotency all on). In the same run a raw-TCP
loopback server and client move the same bytes (model down; model up and down)
with length-prefixed ``sendall``/``recv_into``; the two alternate three times.
Reported: medians, p90 and the ratio PS / raw. The commit alone (the steady-state exchange: its reply is the
next center) is reported too.

Part 2 (concurrency): 1, 4, 16 and 32 client processes commit a 1 MB model in a
loop for a fixed time; reported: commits applied per second, MB/s through the
PS (request + response bodies) and errors.

Clients are separate processes, as Spark executors are. Results go to
``benchmarks/results/ps_roundtrip.json`` and ``.png``.

Usage::

    python benchmarks/ps_roundtrip.py            # full run (a few minutes)
    python benchmarks/ps_roundtrip.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np

RUN, TOKEN = "bench", "bench-token"
SIZES = {"32KB": 32 * 1024, "1MB": 1 << 20, "4MB": 4 << 20, "40MB": 40 << 20}
REPEATS = {"32KB": 600, "1MB": 150, "4MB": 60, "40MB": 18}
ROUNDS = 3


def model(nbytes: int, parts: int = 4) -> list[np.ndarray]:
    n = nbytes // 4
    sizes = [n // parts] * (parts - 1) + [n - (n // parts) * (parts - 1)]
    return [np.full(k, 0.001, dtype=np.float32) for k in sizes]


def stats(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1e3
    return {"median_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)), "n": len(ms)}


# ------------------------------------------------------------------ raw TCP
def _recv_exact(sock: socket.socket, n: int) -> np.ndarray:
    buf = np.empty(n, dtype=np.uint8)
    view, position = memoryview(buf), 0
    while position < n:
        got = sock.recv_into(view[position:])
        if not got:
            raise EOFError
        position += got
    return buf


def _raw_server(listener: socket.socket, payload: np.ndarray) -> None:
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with conn:
        try:
            while True:
                size = int.from_bytes(_recv_exact(conn, 8).tobytes(), "little")
                _recv_exact(conn, size)  # the commit body (or nothing for a pull)
                conn.sendall(payload.nbytes.to_bytes(8, "little"))
                conn.sendall(memoryview(payload))
        except (EOFError, ConnectionError):
            pass


def _raw_client(port: int, nbytes: int, repeats: int, queue) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = np.full(nbytes, 1, dtype=np.uint8)

    def exchange(send: bool) -> None:
        sock.sendall((nbytes if send else 0).to_bytes(8, "little"))
        if send:
            sock.sendall(memoryview(out))
        _recv_exact(sock, int.from_bytes(_recv_exact(sock, 8).tobytes(), "little"))

    round_trips, commits = [], []
    for i in range(repeats + 3):
        t0 = time.perf_counter()
        exchange(False)
        t1 = time.perf_counter()
        exchange(True)
        t2 = time.perf_counter()
        if i >= 3:
            round_trips.append(t2 - t0)
            commits.append(t2 - t1)
    sock.close()
    queue.put({"round_trip": round_trips, "commit": commits})


def raw_tcp(nbytes: int, repeats: int) -> dict:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    server = threading.Thread(target=_raw_server, args=(listener, np.full(nbytes, 2, dtype=np.uint8)), daemon=True)
    server.start()
    result = _in_process(_raw_client, listener.getsockname()[1], nbytes, repeats)
    server.join(timeout=30)
    listener.close()
    return result


# ----------------------------------------------------------------------- PS
def _ps_client(url: str, nbytes: int, repeats: int, queue) -> None:
    from elephant.optimizers import Commit
    from elephant.ps import CommitKey, PSClient

    delta = model(nbytes)
    round_trips, commits = [], []
    with PSClient(url, TOKEN) as client:
        for i in range(repeats + 3):
            t0 = time.perf_counter()
            reply = client.pull(0)
            t1 = time.perf_counter()
            client.commit(CommitKey(RUN, 0, 0, i), i + 1, Commit(delta, 1, 1, reply.clock))
            t2 = time.perf_counter()
            if i >= 3:
                round_trips.append(t2 - t0)
                commits.append(t2 - t1)
    queue.put({"round_trip": round_trips, "commit": commits})


def _serve(nbytes: int, num_workers: int):
    from elephant.optimizers import Downpour
    from elephant.ps import PSServer, Store, create_app

    store = Store(model(nbytes), Downpour(), "asynchronous", num_workers, RUN)
    return store, PSServer(create_app(store, TOKEN, max_body_bytes=1 << 30)).start()


def ps_http(nbytes: int, repeats: int) -> dict:
    store, server = _serve(nbytes, 1)
    try:
        result = _in_process(_ps_client, server.url, nbytes, repeats)
    finally:
        server.stop()
    assert store.metrics()["commits_applied"] == repeats + 3
    return result


def _in_process(target, *args) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=target, args=(*args, queue))
    process.start()
    result = queue.get(timeout=600)
    process.join()
    return result


# -------------------------------------------------------------- concurrency
def _load_client(url: str, partition: int, nbytes: int, duration: float, start, queue) -> None:
    from elephant.optimizers import Commit
    from elephant.ps import CommitKey, PSClient

    delta = model(nbytes)
    done = errors = 0
    latencies, messages = [], []
    with PSClient(url, TOKEN) as client:
        base = client.pull(partition).clock
        start.wait()
        t_end = time.perf_counter() + duration
        step = 0
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            try:
                base = client.commit(CommitKey(RUN, 0, partition, step), 1, Commit(delta, 1, 1, base)).clock
                done += 1
                latencies.append(time.perf_counter() - t0)
            except Exception as exc:  # counted and reported, never hidden
                errors += 1
                messages.append(str(exc)[:300])
            step += 1
    queue.put({"commits": done, "errors": errors, "latencies": latencies, "messages": messages[:3]})


def concurrency(clients: int, nbytes: int, duration: float) -> dict:
    store, server = _serve(nbytes, clients)
    ctx = mp.get_context("spawn")
    start, queue = ctx.Event(), ctx.Queue()
    processes = [ctx.Process(target=_load_client, args=(server.url, p, nbytes, duration, start, queue))
                 for p in range(clients)]
    try:
        for process in processes:
            process.start()
        while store.metrics()["pulls"] < clients:  # every client connected and pulled
            time.sleep(0.05)
        before = store.metrics()
        t0 = time.perf_counter()
        start.set()
        results = [queue.get(timeout=duration + 300) for _ in processes]
        elapsed = time.perf_counter() - t0
        after = store.metrics()
        for process in processes:
            process.join()
    finally:
        server.stop()
    applied = after["commits_applied"] - before["commits_applied"]
    moved = (after["bytes_in"] + after["bytes_out"] - before["bytes_in"] - before["bytes_out"]) / 1e6
    latencies = [x for r in results for x in r["latencies"]]
    return {
        "clients": clients,
        "threads": server.threads,
        "commits_applied": applied,
        "commits_per_s": applied / elapsed,
        "mb_per_s": moved / elapsed,
        "errors": sum(r["errors"] for r in results),
        "error_messages": [m for r in results for m in r["messages"]][:5],
        "commit_latency": stats(latencies) if latencies else None,
        "elapsed_s": elapsed,
    }


# -------------------------------------------------------------------- main
def environment() -> dict:
    from importlib.metadata import version

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        **{name: version(name) for name in ("numpy", "flask", "werkzeug", "requests", "urllib3")},
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = list(results["latency"])
    x = np.arange(len(labels))
    ps = [results["latency"][k]["ps"]["round_trip"]["median_ms"] for k in labels]
    raw = [results["latency"][k]["raw"]["round_trip"]["median_ms"] for k in labels]
    left.bar(x - 0.2, ps, 0.4, label="PS pull + commit (HTTP)")
    left.bar(x + 0.2, raw, 0.4, label="raw TCP, same bytes")
    for i, k in enumerate(labels):
        left.annotate(f"x{results['latency'][k]['ratio']:.2f}", (x[i] - 0.2, ps[i]), ha="center", va="bottom", fontsize=8)
    left.set_xticks(x, labels)
    left.set_yscale("log")
    left.set_ylabel("median round trip (ms, log)")
    left.set_title("Round trip vs payload")
    left.legend(fontsize=8)
    rows = results["concurrency"]
    right.plot([r["clients"] for r in rows], [r["commits_per_s"] for r in rows], "o-", label="commits/s")
    right.set_xlabel("concurrent client processes (1 MB model)")
    right.set_ylabel("commits applied / s")
    right.set_xscale("log", base=2)
    twin = right.twinx()
    twin.plot([r["clients"] for r in rows], [r["mb_per_s"] for r in rows], "s--", color="tab:orange", label="MB/s")
    twin.set_ylabel("MB/s through the PS")
    lines = right.get_lines() + twin.get_lines()
    right.legend(lines, [line.get_label() for line in lines], fontsize=8, loc="lower right")
    right.set_title(f"Throughput under concurrency (errors: {sum(r['errors'] for r in rows)})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repetitions, short load phases")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per concurrency level")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    scale = 0.1 if args.quick else 1.0
    duration = 2.0 if args.quick else args.duration

    results: dict = {"environment": environment(), "latency": {}, "concurrency": []}
    print(f"{'payload':>8} {'PS rt ms':>9} {'raw rt ms':>9} {'ratio':>6} {'PS p90':>8} {'PS commit':>9} {'raw commit':>10}")
    for label, nbytes in SIZES.items():
        repeats = max(3, int(REPEATS[label] * scale / ROUNDS))
        raw: dict = {"round_trip": [], "commit": []}
        ps: dict = {"round_trip": [], "commit": []}
        for _ in range(ROUNDS):  # interleaved, so drift on a shared machine hits both alike
            for total, part in ((raw, raw_tcp(nbytes, repeats)), (ps, ps_http(nbytes, repeats))):
                for key in total:
                    total[key] += part[key]
        entry = {
            "bytes": nbytes,
            "ps": {k: stats(v) for k, v in ps.items()},
            "raw": {k: stats(v) for k, v in raw.items()},
        }
        entry["ratio"] = entry["ps"]["round_trip"]["median_ms"] / entry["raw"]["round_trip"]["median_ms"]
        entry["commit_ratio"] = entry["ps"]["commit"]["median_ms"] / entry["raw"]["commit"]["median_ms"]
        results["latency"][label] = entry
        print(f"{label:>8} {entry['ps']['round_trip']['median_ms']:9.2f} {entry['raw']['round_trip']['median_ms']:9.2f} "
              f"{entry['ratio']:6.2f} {entry['ps']['round_trip']['p90_ms']:8.2f} "
              f"{entry['ps']['commit']['median_ms']:9.2f} {entry['raw']['commit']['median_ms']:10.2f}")

    print(f"\n{'clients':>7} {'threads':>7} {'commits/s':>10} {'MB/s':>8} {'errors':>6} {'p50 ms':>8} {'p90 ms':>8}")
    for clients in args.clients:
        row = concurrency(clients, SIZES["1MB"], duration)
        results["concurrency"].append(row)
        lat = row["commit_latency"] or {"median_ms": float("nan"), "p90_ms": float("nan")}
        print(f"{clients:7d} {row['threads']:7d} {row['commits_per_s']:10.1f} {row['mb_per_s']:8.1f} "
              f"{row['errors']:6d} {lat['median_ms']:8.2f} {lat['p90_ms']:8.2f}")
        for message in row["error_messages"]:
            print(f"        error: {message}")

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ps_roundtrip.json").write_text(json.dumps(results, indent=2))
    plot(results, args.out / "ps_roundtrip.png")
    print(f"\nwrote {args.out / 'ps_roundtrip.json'} and {args.out / 'ps_roundtrip.png'}")
    return results


if __name__ == "__main__":
    main()
