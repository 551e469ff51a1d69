"""Driver memory of synchronous rounds against the number of partitions (T25).

A synchronous round closes when every partition has committed its step, so a
server that keeps each commit until then holds ``partitions x model`` bytes.
This script serves a model of ``--mb`` megabytes from the real stack (PSServer,
Flask app, Store with model averaging, the default synchronous rule) and lets
1, 2, 4, 8 and 16 client processes (the executors) commit ``--rounds`` rounds.
Each count runs in a fresh server process, where a thread samples the resident
memory every 2 ms; reported: the peak above the level before the first
commit, in megabytes and in models.

Usage::

    python benchmarks/sync_memory.py                 # 16 MB model, 1-16 partitions
    python benchmarks/sync_memory.py --quick         # 4 MB, 1-4 partitions
    python benchmarks/sync_memory.py --compare       # also the server as it was before

Results go to ``benchmarks/results/sync_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import threading
import time
from pathlib import Path

import numpy as np

RUN, TOKEN = "sync-memory", "sync-memory-token"
PAGE = os.sysconf("SC_PAGE_SIZE")


def model(nbytes: int, parts: int = 4) -> list[np.ndarray]:
    n = nbytes // 4 // parts
    return [np.full(n, 0.001, dtype=np.float32) for _ in range(parts)]


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakSampler(threading.Thread):
    """Samples this process' RSS until stopped; ``peak`` is the highest seen."""

    def __init__(self, interval: float = 0.002):
        super().__init__(daemon=True)
        self.interval, self.peak, self._stop_event = interval, rss(), threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak = max(self.peak, rss())
            time.sleep(self.interval)

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return max(self.peak, rss())


def _client(url: str, partition: int, nbytes: int, rounds: int, start, queue) -> None:
    from elephant.optimizers import Commit
    from elephant.ps import CommitKey, PSClient

    delta = model(nbytes)
    with PSClient(url, TOKEN, read_timeout=600) as client:
        base = client.pull(partition).clock
        start.wait()
        for step in range(rounds):
            base = client.commit(CommitKey(RUN, 0, partition, step), 1, Commit(delta, 1, 1, base)).clock
    queue.put(base)


def measure(partitions: int, nbytes: int, rounds: int, held: bool = False, glibc_default: bool = False) -> dict:
    from elephant.optimizers import ModelAveraging
    from elephant.ps import PSServer, Store, create_app, server as server_module

    if glibc_default:  # leave glibc's adaptive mmap threshold as it is
        server_module.map_large_allocations = lambda *args: False
    rule = ModelAveraging(outer_momentum=0.0)
    if held:  # the same rule keeping every commit until its round closes
        rule.streams_rounds = False
    store = Store(model(nbytes), rule, "synchronous", partitions, RUN)
    server = PSServer(create_app(store, TOKEN, max_body_bytes=1 << 30), threads=partitions + 4).start()
    ctx = mp.get_context("spawn")
    start, queue = ctx.Event(), ctx.Queue()
    processes = [ctx.Process(target=_client, args=(server.url, p, nbytes, rounds, start, queue))
                 for p in range(partitions)]
    try:
        for process in processes:
            process.start()
        while store.metrics()["pulls"] < partitions:
            time.sleep(0.05)
        baseline = rss()
        sampler = PeakSampler()
        sampler.start()
        t0 = time.perf_counter()
        start.set()
        clocks = [queue.get(timeout=600) for _ in processes]
        elapsed = time.perf_counter() - t0
        peak = sampler.stop()
        for process in processes:
            process.join()
    finally:
        server.stop()
    assert clocks == [rounds] * partitions, clocks
    extra = (peak - baseline) / 1e6
    return {"partitions": partitions, "held": held, "glibc_default": glibc_default, "model_mb": nbytes / 1e6, "rounds": rounds, "peak_extra_mb": extra,
            "peak_extra_models": extra / (nbytes / 1e6), "seconds": elapsed}


def _measure_in(queue, *args) -> None:
    queue.put(measure(*args))


def measure_fresh(partitions: int, nbytes: int, rounds: int, held: bool, glibc_default: bool) -> dict:
    """:func:`measure` in a new server process: memory freed by an earlier run stays resident
    in the allocator and would hide the next run's peak."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=_measure_in, args=(queue, partitions, nbytes, rounds, held, glibc_default))
    process.start()
    row = queue.get(timeout=900)
    process.join()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=16.0)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tag", default="")
    parser.add_argument("--compare", action="store_true",
                        help="also run with every commit held until its round closes, and with glibc's adaptive "
                             "mmap threshold left alone (the server before streamed rounds)")
    args = parser.parse_args()
    if args.quick:
        args.mb, args.partitions = 4.0, [1, 2, 4]
    nbytes = int(args.mb * 1e6) // 16 * 16
    variants = [(False, False)]
    if args.compare:
        variants += [(True, False), (False, True), (True, True)]
    rows = []
    for held, glibc_default in variants:
        print(f"commits {'held until the round closes' if held else 'summed on arrival'}, "
              f"glibc mmap threshold {'adaptive' if glibc_default else 'fixed at 1 MiB'}:")
        for partitions in args.partitions:
            row = measure_fresh(partitions, nbytes, args.rounds, held, glibc_default)
            rows.append(row)
            print(f"  partitions {partitions:3d}: peak +{row['peak_extra_mb']:7.1f} MB = "
                  f"{row['peak_extra_models']:5.2f} models of {row['model_mb']:.0f} MB ({row['seconds']:.1f} s)",
                  flush=True)
    out = Path(__file__).parent / "results" / f"sync_memory{'_' + args.tag if args.tag else ''}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(), "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
