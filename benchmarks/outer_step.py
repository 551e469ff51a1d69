"""Synchronous averaging's outer step at 4 to 16 simulated workers: block momentum and a norm-matched gain.

The synchronous default is model averaging with block momentum ``β = 1 − 1/K``: in steady
state the center moves ``K`` times the workers' mean delta. Under adaptive local
optimizers and one or two epochs that amplification overshoots at 8 workers on some
workloads (docs/convergence.md, "Where the defaults stop holding"). This script runs
``simulate_fit`` with a given outer step so that alternatives can be compared with the
default's rows of ``results/convergence_sim_*.json``:

* ``--beta B``: :class:`~elephant.optimizers.ModelAveraging` with ``outer_momentum=B``
  (``0.75`` caps the amplification at 4 for every K);
* ``--rule normmatched``: no outer momentum; each tensor's mean delta is scaled back to the
  workers' mean delta norm for that tensor (a gain between 1 and √K), the idea being that
  Adam's steps on a worker's noisier split batch carry less signal and averaging shrinks them.

Run::

    python benchmarks/outer_step.py --workload sequences-gru --workers 8 --window 35 --beta 0.75
    python benchmarks/outer_step.py --workload textures-conv2d --workers 8 --window 47 --rule normmatched

Each run appends one row (the test metric after every epoch) to ``results/outer_step.json``.
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

from elephant import weights as W  # noqa: E402
from elephant.optimizers.averaging import ModelAveraging  # noqa: E402


class _NormSum:
    """A round's sample-weighted sum of deltas and of each tensor's delta norm."""

    def __init__(self):
        self.sum, self.norms, self.total = W.WeightedSum(), None, 0.0

    def add(self, tensors, samples: int) -> None:
        self.sum.add(tensors, samples)
        if samples > 0:
            norms = np.array([float(np.linalg.norm(t)) for t in tensors]) * samples
            self.norms = norms if self.norms is None else self.norms + norms
            self.total += samples


class NormMatched(ModelAveraging):
    """Model averaging whose mean delta is scaled per tensor to the workers' mean delta norm (gain in [1, √K])."""

    name = "normmatched-benchmark"

    def __init__(self, window=None):
        super().__init__(window=window, outer_momentum=0.0)
        self.gains: list[float] = []

    def round_begin(self, num_workers):
        return _NormSum()

    def round_add(self, acc, worker, commit):
        acc.add(commit.tensors, commit.num_samples)
        return acc

    def round_end(self, state, center, clock, acc, workers):
        replies = {k: None for k in workers}
        if acc.total == 0:
            return center, replies, state
        mean = acc.sum.mean()
        norms = np.array([float(np.linalg.norm(t)) for t in mean])
        gains = np.clip(acc.norms / acc.total / np.maximum(norms, 1e-30), 1.0, np.sqrt(len(workers)))
        self.gains.append(float(np.median(gains)))
        center, state = self.outer.step(state, center, [(t * g).astype(t.dtype) for t, g in zip(mean, gains)])
        return center, replies, state


def main() -> None:
    import workloads as WL
    from elephant.optimizers import simulate_fit

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--window", type=int, required=True, help="local steps per round")
    parser.add_argument("--beta", type=float, help="block momentum (ModelAveraging's outer_momentum)")
    parser.add_argument("--rule", choices=["averaging", "normmatched"], default="averaging")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.rule == "normmatched":
        rule = NormMatched(window=args.window)
    else:
        rule = ModelAveraging(window=args.window, outer_momentum=args.beta)
    wl = WL.make(args.workload)
    t0 = time.perf_counter()
    fit = simulate_fit(wl.build(args.seed), wl.x, wl.y, epochs=wl.epochs, batch_size=wl.batch_size,
                       num_workers=args.workers, seed=args.seed, mode="synchronous", optimizer=rule,
                       validation_data=(wl.x_test, wl.y_test))
    row = {"workload": args.workload, "workers": args.workers, "seed": args.seed, "window": args.window,
           "rule": args.rule, "beta": args.beta, "curve": fit.history["val_" + wl.metric],
           "seconds": time.perf_counter() - t0}
    if args.rule == "normmatched":
        row["median_gains"] = rule.gains[:: max(1, len(rule.gains) // 4)]
    print(json.dumps(row), flush=True)
    path = os.path.join(HERE, "results", "outer_step.json")
    rows = json.load(open(path))["rows"] if os.path.exists(path) else []
    with open(path, "w") as f:
        json.dump({"rows": rows + [row]}, f, indent=1)


if __name__ == "__main__":
    main()
