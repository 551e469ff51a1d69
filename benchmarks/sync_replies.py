"""Synchronous rounds with dense and with compressed replies, side by side, through loopback and shaped links.

K worker processes run synchronous rounds against one parameter-server process (the real
``Store`` + ``create_app`` + ``PSServer``, model averaging, as the synchronous default's
server): each round every worker sends its commit and waits for the round's reply. Three
configurations of the same P-byte float32 model, one after the other in the same run:

* ``fp32``: dense commits and replies (``ModelAveraging``);
* ``int8``: int8 commits with error feedback, dense replies (``Compressed(codec="int8")``);
* ``int8+r``: int8 commits and int8 replies, the round's change of the workers' view of the
  center (``Compressed(codec="int8", replies=True)``).

Each worker's local window is not simulated (``--compute`` seconds of sleep between rounds,
default 0): what is timed is the round, from the workers' sends to the last reply. Reported
per configuration and link: the median and p90 round time, bytes the server sent and received
per round, and the server's CPU seconds per round. With ``--rates`` the server runs in a
network namespace behind a veth pair shaped with ``tc tbf`` (:mod:`shaped_link`, root only),
so the replies' K·P bytes cross a link of that rate, as they cross a driver's NIC.

Run::

    python benchmarks/sync_replies.py                                   # 17 MB, K = 4, loopback
    python benchmarks/sync_replies.py --mb 17 --workers 4 --rates 1gbit  # and through a 1 Gbit/s link

Results: ``benchmarks/results/sync_replies.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from ps_roundtrip import model as _model  # noqa: E402

RUN, TOKEN = "sync-replies", "sync-replies-token"
TENSORS = 16  # the model's float32 tensors, of equal size
CONFIGS = {
    "fp32": {"name": "modelaveraging", "config": {"window": 1}},
    "int8": {"name": "compressed", "config": {"inner": {"name": "modelaveraging", "config": {"window": 1}},
                                              "codec": "int8"}},
    "int8+r": {"name": "compressed", "config": {"inner": {"name": "modelaveraging", "config": {"window": 1}},
                                                "codec": "int8", "replies": True}},
}


def _serve() -> None:
    """The ``--serve`` entry: one server process; settings on stdin, its URL and CPU on stdout."""
    from elephant.optimizers import get
    from elephant.ps import PSServer, Store, create_app
    from elephant.ps.app import max_body_bytes

    settings = json.loads(sys.stdin.readline())
    k = settings["workers"]
    store = Store(_model(settings["nbytes"], TENSORS), get(settings["rule"]), "synchronous", k, RUN)
    app = create_app(store, TOKEN, max_body_bytes=max_body_bytes(store.commit_template))
    with PSServer(app, host=settings["host"], threads=2 * k + 4) as server:
        print(json.dumps({"url": server.url}), flush=True)
        sys.stdin.readline()  # the parent's mark: the rounds begin
        cpu0 = time.process_time()
        before = store.metrics()
        print(json.dumps({"started": True}), flush=True)
        sys.stdin.readline()  # the rounds are over
        after = store.metrics()
        print(json.dumps({"cpu_s": time.process_time() - cpu0,
                          "bytes_out": after["bytes_out"] - before["bytes_out"],
                          "bytes_in": after["bytes_in"] - before["bytes_in"],
                          "rounds": after["rounds_applied"] - before["rounds_applied"]}), flush=True)


def _worker(url: str, rule: dict, nbytes: int, partition: int, rounds: int, compute: float, out, go) -> None:
    """One worker process: pull, then ``rounds`` commits of a fresh random delta, each waiting for its round."""
    from elephant.optimizers import get
    from elephant.protocol import Commit, CommitKey
    from elephant.ps.client import PSClient

    opt = get(rule)
    rng = np.random.default_rng(partition)
    times = []
    with PSClient(url, TOKEN, read_timeout=600) as client:
        reply = client.pull(partition, epoch=0)
        state, pulled, base = opt.worker_init(reply.center), reply.center, reply.clock
        out.put(("ready", partition))
        go.wait()
        for step in range(rounds):
            if compute:
                time.sleep(compute)
            weights = [p + rng.standard_normal(p.shape, np.float32) * np.float32(1e-3) for p in pulled]
            layout, state = opt.make_commit(state, weights, pulled, 1)
            t0 = time.perf_counter()
            reply = client.commit(CommitKey(RUN, 0, partition, step), 0, Commit(layout, 1, 32, base))
            times.append(time.perf_counter() - t0)
            _, state = opt.on_reply(state, weights, reply)
            pulled, base = reply.center, reply.clock
        client.finish(RUN, 0, partition, 0)
    out.put(("times", partition, times))


def run_one(config: str, nbytes: int, workers: int, rounds: int, compute: float, link) -> dict:
    host = link.server_address if link is not None else "127.0.0.1"
    argv = [sys.executable, str(Path(__file__).resolve()), "--serve"]
    server = subprocess.Popen(link.command(argv) if link is not None else argv, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        server.stdin.write(json.dumps({"workers": workers, "nbytes": nbytes, "rule": CONFIGS[config],
                                       "host": host}) + "\n")
        server.stdin.flush()
        url = json.loads(server.stdout.readline())["url"]
        ctx = mp.get_context("spawn")
        out, go = ctx.Queue(), ctx.Event()
        procs = [ctx.Process(target=_worker, args=(url, CONFIGS[config], nbytes, k, rounds, compute, out, go))
                 for k in range(workers)]
        for p in procs:
            p.start()
        for _ in range(workers):
            assert out.get(timeout=600)[0] == "ready"
        server.stdin.write("go\n")
        server.stdin.flush()
        json.loads(server.stdout.readline())
        go.set()
        t0 = time.perf_counter()
        times = {}
        for _ in range(workers):
            _, k, t = out.get(timeout=1800)
            times[k] = t
        wall = time.perf_counter() - t0
        for p in procs:
            p.join(timeout=60)
        server.stdin.write("done\n")
        server.stdin.flush()
        stats = json.loads(server.stdout.readline())
    finally:
        server.stdin.close()
        server.wait(timeout=60)
    # A round's time: from the first send to the last reply, per round, over the workers; skip the first.
    per_round = np.max(np.asarray([times[k] for k in sorted(times)]), axis=0)[1:]
    rounds_done = max(stats["rounds"], 1)
    return {"config": config, "model_mb": nbytes / 2**20, "workers": workers, "rounds": rounds,
            "round_median_ms": float(np.median(per_round) * 1000), "round_p90_ms": float(np.percentile(per_round, 90) * 1000),
            "wall_s": wall, "server_cpu_ms_per_round": stats["cpu_s"] / rounds_done * 1000,
            "bytes_out_per_round": stats["bytes_out"] / rounds_done, "bytes_in_per_round": stats["bytes_in"] / rounds_done}


def table(rows: list[dict]) -> str:
    lines = ["| link | config | round median ms | p90 ms | MB out per round | MB in per round | server CPU ms per round |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['link']} | {r['config']} | {r['round_median_ms']:.0f} | {r['round_p90_ms']:.0f} | "
                     f"{r['bytes_out_per_round'] / 2**20:.2f} | {r['bytes_in_per_round'] / 2**20:.2f} | "
                     f"{r['server_cpu_ms_per_round']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mb", type=float, default=17.0, help="model size in MB (2^20 bytes); default 17")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--compute", type=float, default=0.0, help="seconds each worker sleeps between rounds")
    parser.add_argument("--rates", nargs="*", default=[], help="shaped link rates, e.g. 1gbit (root only)")
    parser.add_argument("--repeats", type=int, default=2, help="passes over the configurations, interleaved")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "sync_replies.json")
    args = parser.parse_args()
    if args.serve:
        _serve()
        return
    import shaped_link

    nbytes = int(args.mb * 2**20)
    rows = []
    for rate in [None, *args.rates]:
        link = None
        if rate is not None:
            why = shaped_link.unavailable()
            if why:
                print(f"shaped link {rate} skipped: {why}")
                continue
            link = shaped_link.ShapedLink(shaped_link.parse_rate(rate)).open()
        try:
            for repeat in range(args.repeats):
                for config in CONFIGS:
                    row = run_one(config, nbytes, args.workers, args.rounds, args.compute, link)
                    row.update(link=rate or "loopback", repeat=repeat)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            if link is not None:
                link.close()
    meta = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "load_average": os.getloadavg(), "time": time.strftime("%Y-%m-%d %H:%M"), "args": vars(args) | {"out": None}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
