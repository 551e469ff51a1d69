"""How far the streaming shuffle's order is from a full shuffle, in accuracy after plain Keras' epochs.

One worker's partition is the whole training set, read as blocks of ``--block`` samples in
the order the data are laid out: (a) shuffled, as most tables are, and (b) sorted by label,
the worst case for a buffer. Each epoch trains the samples in the order
:func:`elephant.stream.stream_order` gives them (a buffer of a fraction of the partition,
with the default ``carry``) or in a full permutation (today's per-partition shuffle), with
plain ``model.fit(..., shuffle=False)`` from the same initial weights; the score is the
workload's test metric after its usual epochs. Orders and seeds vary together (seed s seeds
the weights and every epoch's order).

Writes ``benchmarks/results/shuffle_quality.json``.

Usage::

    python benchmarks/shuffle_quality.py [--workloads digits-mlp shapes-conv2d] [--seeds 0 1 2] [--buffers 0.03 0.125 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import workloads  # noqa: E402

from elephant.stream import stream_order  # noqa: E402


def epoch_orders(n: int, layout_order: np.ndarray, block: int, buffer: float | None, seed: int, epochs: int):
    """Each epoch's order of the training rows: a full permutation (``buffer`` None) or the stream's."""
    sizes = [min(block, n - start) for start in range(0, n, block)]
    for epoch in range(epochs):
        epoch_seed = seed * 1000 + epoch
        if buffer is None:
            yield np.random.default_rng(epoch_seed).permutation(n)
        else:
            yield layout_order[stream_order(sizes, max(1, int(buffer * n)), epoch_seed)]


def run(name: str, layout: str, buffer: float | None, seed: int, block: int) -> dict:
    w = workloads.make(name)
    n = len(w.x)
    layout_order = np.argsort(w.y, kind="stable") if layout == "sorted" else np.random.default_rng(99).permutation(n)
    model = w.build(seed)
    started = time.perf_counter()
    for order in epoch_orders(n, layout_order, block, buffer, seed, w.epochs):
        model.fit(w.x[order], w.y[order], batch_size=w.batch_size, epochs=1, shuffle=False, verbose=0)
    logs = model.evaluate(w.x_test, w.y_test, verbose=0, return_dict=True)
    return {"workload": w.name, "layout": layout, "buffer": buffer, "seed": seed, "block": block, "samples": n,
            "epochs": w.epochs, "score": w.score(logs), "seconds": round(time.perf_counter() - started, 2)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["digits-mlp", "shapes-conv2d"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--buffers", nargs="+", type=float, default=[1 / 32, 1 / 8, 1 / 2],
                        help="buffer sizes as fractions of the partition")
    parser.add_argument("--block", type=int, default=64, help="samples per block as read")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "shuffle_quality.json"))
    args = parser.parse_args(argv)
    rows = []
    for name in args.workloads:
        for layout in ("shuffled", "sorted"):
            for buffer in [None, *args.buffers]:
                for seed in args.seeds:
                    rows.append(run(name, layout, buffer, seed, args.block))
                scores = [r["score"] for r in rows[-len(args.seeds):]]
                label = "full shuffle" if buffer is None else f"buffer {buffer:.3g} of the partition"
                print(f"{rows[-1]['workload']:14s} {layout:9s} {label:32s} "
                      f"mean {np.mean(scores):.4f}  seeds {' '.join(f'{s:.4f}' for s in scores)}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"block": args.block, "carry": 0.5, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
