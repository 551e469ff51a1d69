"""Connection floods against the parameter server (reliability plan T16).

Part 1 (the server alone): 4 client threads commit a 32 KB model in a loop
through the real stack (PSServer + Flask app + Store, PSClient over HTTP), first
quietly, then while an attacker holds 300 idle connections and 50 half-sent request
heads, sends 50 tokenless requests whose announced body never comes, and runs
a connect/close loop. Reported: commit latency p50/p99 in both phases, handler threads, open
file descriptors and the process's CPU seconds per second while idle after the
attack.

Part 2 (a fit): an asynchronous fit of a digits MLP on the embedded local Spark,
once quietly and once with the same attack started at the beginning of epoch 1
against its parameter server; reported: wall time and accuracy of both.

Usage::

    python benchmarks/flood.py            # both parts
    python benchmarks/flood.py --no-fit   # the server alone
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np

TOKEN = "flood-token"


class Attack:
    """Idle connections, half-sent requests and a connect/close loop against ``host:port``."""

    def __init__(self, host: str, port: int, idle: int = 300, half_sent: int = 50):
        self.address, self.idle, self.half_sent = (host, port), idle, half_sent
        self.sockets: list[socket.socket] = []
        self.refused = 0
        self.cycles = 0
        self._stop = threading.Event()
        self._loop = threading.Thread(target=self._connect_close, name="flood-loop", daemon=True)

    def start(self) -> Attack:
        for _ in range(self.idle):
            self.sockets.append(socket.create_connection(self.address))
        for _ in range(self.half_sent):  # a head that never ends
            s = socket.create_connection(self.address)
            s.sendall(b"POST /commit HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n")
            self.sockets.append(s)
        for _ in range(self.half_sent):  # a whole head without the token, and a body that never comes
            s = socket.create_connection(self.address)
            s.sendall(b"POST /commit HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"\0" * 100)
            self.sockets.append(s)
        self._loop.start()
        return self

    def _connect_close(self) -> None:
        while not self._stop.is_set():
            try:
                socket.create_connection(self.address, timeout=1).close()
                self.cycles += 1
            except OSError:
                time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._loop.join()
        for s in self.sockets:
            s.close()


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1e3
    return {"p50_ms": round(float(np.percentile(ms, 50)), 3), "p99_ms": round(float(np.percentile(ms, 99)), 3),
            "n": len(seconds)}


def server_alone(duration: float = 5.0) -> dict:
    from elephant.optimizers import Commit, Downpour
    from elephant.ps.app import create_app
    from elephant.ps.client import PSClient
    from elephant.ps.server import PSServer
    from elephant.ps.store import CommitKey, Store

    center = [np.zeros(8192, np.float32)]  # 32 KB
    store = Store(center, Downpour(), "asynchronous", 4, "flood")
    with PSServer(create_app(store, TOKEN), threads=12) as server:

        def clients(phase: str, seconds: float) -> list[float]:
            times: list[float] = []
            lock = threading.Lock()

            def one(worker: int) -> None:
                mine = []
                with PSClient(server.url, TOKEN) as client:
                    step, end = 0, time.monotonic() + seconds
                    while time.monotonic() < end:
                        commit = Commit([np.full(8192, 1e-6, np.float32)], 1, 1, store.clock)
                        t0 = time.perf_counter()
                        client.commit(CommitKey("flood", 0 if phase == "quiet" else 1, worker, step), worker, commit)
                        mine.append(time.perf_counter() - t0)
                        step += 1
                with lock:
                    times.extend(mine)

            threads = [threading.Thread(target=one, args=(w,)) for w in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return times

        quiet = clients("quiet", duration)
        fds_before = len(os.listdir("/proc/self/fd"))
        attack = Attack("127.0.0.1", server.port).start()
        try:
            attacked = clients("attacked", duration)
            held = server.connections_open
            handlers = len([t for t in threading.enumerate() if t.name.startswith("elephant-ps-handler")])
            fds_attack = len(os.listdir("/proc/self/fd"))
        finally:
            attack.stop()
        time.sleep(0.5)
        cpu = time.process_time()
        time.sleep(2.0)
        idle_cpu = (time.process_time() - cpu) / 2.0
        result = {
            "quiet": _percentiles(quiet), "attacked": _percentiles(attacked),
            "p99_ratio": round(float(np.percentile(attacked, 99) / np.percentile(quiet, 99)), 2),
            "connections_held_during_attack": held, "connect_close_cycles": attack.cycles,
            "handler_threads": handlers, "handler_pool": server.threads,
            "refused_without_token": server.connections_unauthorized,
            "fds_before": fds_before, "fds_during": fds_attack, "fds_after": len(os.listdir("/proc/self/fd")),
            "idle_cpu_seconds_per_second": round(idle_cpu, 4), "expired": server.connections_expired,
        }
    return result


def fit(attacked: bool) -> dict:
    import keras
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from elephant import SparkModel

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split((x / 16).astype("float32"), y, test_size=0.25,
                                                        random_state=0, stratify=y)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    sm = SparkModel(model, mode="asynchronous", frequency=4, num_workers=2)
    attacks: list[Attack] = []

    def on_epoch_begin(epoch, logs=None):
        if attacked and epoch == 0:
            host, port = sm.ps_url.removeprefix("http://").rsplit(":", 1)
            attacks.append(Attack(host, int(port)).start())

    t0 = time.perf_counter()
    try:
        sm.fit(x_train, y_train, epochs=5, batch_size=32, verbose=0,
               callbacks=[keras.callbacks.LambdaCallback(on_epoch_begin=on_epoch_begin)])
    finally:
        for a in attacks:
            a.stop()
    seconds = time.perf_counter() - t0
    accuracy = float(np.mean(np.argmax(sm.model.predict(x_test, verbose=0), axis=1) == y_test))
    return {"attacked": attacked, "seconds": round(seconds, 2), "accuracy": round(accuracy, 4),
            "commits": sm.last_metrics["commits_applied"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-fit", action="store_true")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "flood.json"))
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    results: dict = {"server": server_alone()}
    print(json.dumps(results["server"], indent=1), flush=True)
    if not args.no_fit:
        fit(False)  # Spark and its Python workers started, so the two timed fits compare
        results["fit"] = [fit(False), fit(True)]
        for row in results["fit"]:
            print(row, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
