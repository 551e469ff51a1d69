"""Where a distributed fit's first epoch loses against plain Keras: a head of plain Keras steps, then the default.

Beyond 4 workers under an adaptive optimizer the defaults' first epoch trails plain Keras
(docs/convergence.md, "The first epoch at 16 workers: where it loses"). This script splits the first epoch in
two to find which part costs: its first ``--head`` steps are trained by plain Keras on the
global batch (what synchronous gradient averaging would train), and the rest of the epoch by
:func:`elephant.optimizers.simulate_fit` with a mode's default, starting from the head's weights
and optimizer state. Variants, each from the seed's initial weights over the same split:

* ``plain``: plain Keras for the rest too (the yardstick of the row);
* ``sync`` / ``async``: the mode's default for the rest, its workers' factor ramped up as usual;
* ``sync-noramp`` / ``async-noramp``: the same with the factor at ``√K`` from the rest's first
  step (``elephant.optimizers.local.ramped_rates`` patched; the short warm-up windows kept).

``--head 0`` gives the defaults' own first epoch against a plain one-epoch fit as they trained it before
their own head (``elephant.fit.head``, which this script measured the case for): the rest's fit runs
without it (``HEAD_STEPS`` 0), ramping the factor where the plan says so.

Run::

    python benchmarks/first_epoch.py --workloads textures-conv2d sequences-gru --workers 16 --seeds 0 1 2 \\
        --head 128 --variants plain sync async-noramp --tag head128

``--full`` trains the workload's own epochs over all its samples after the head instead (the
head's samples are then trained twice in the first epoch, so only the last epoch says anything:
whether the fit stays stable without the ramp).

Results go to ``benchmarks/results/first_epoch_<tag>.json`` (one row per workload, seed, workers,
head, variant, ``full`` and ``--frequency``: the test score after each epoch, seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import workloads as WL  # noqa: E402
from convergence import with_rate  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
VARIANTS = ("plain", "sync", "async", "sync-noramp", "async-noramp")


def first_epoch(wl, seed: int, workers: int, head: int, variant: str, full: bool = False,
                frequency: int | None = None) -> dict:
    """Test scores after ``head`` plain Keras steps on a random subset and ``variant`` on the rest of the first
    epoch; with ``full``, ``variant`` trains the workload's epochs over all the samples after the head (the head's
    samples a second time in the first: for stability, not for a first epoch's gap). ``frequency`` fixes the
    default's window (None: the window it decides)."""
    import elephant.fit.head as fit_head
    import elephant.optimizers.local as local
    from elephant.optimizers import simulate_fit

    order = np.random.default_rng(1000 + seed).permutation(len(wl.x))
    first, rest = order[: head * wl.batch_size], order[head * wl.batch_size :]
    if full:
        rest = np.arange(len(wl.x))
    epochs = wl.epochs if full else 1
    t0 = time.perf_counter()
    model = wl.build(seed)
    if head:
        model.fit(wl.x[first], wl.y[first], batch_size=wl.batch_size, epochs=1, verbose=0, shuffle=False)
    curve = []

    def score():
        logs = model.evaluate(wl.x_test, wl.y_test, batch_size=wl.batch_size, verbose=0, return_dict=True)
        return wl.score(logs)

    if variant == "plain":
        for _ in range(epochs):
            model.fit(wl.x[rest], wl.y[rest], batch_size=wl.batch_size, epochs=1, verbose=0, shuffle=True)
            curve.append(score())
    else:
        mode, _, ramp = variant.partition("-")
        ramped, head_steps = local.ramped_rates, fit_head.HEAD_STEPS
        if ramp == "noramp":  # every step of the pass at the full factor
            local.ramped_rates = lambda rate, scale, steps: [rate * scale] * max(int(steps), 1)
        fit_head.HEAD_STEPS = 0  # the rest as the defaults trained before their own head: the ramp where it applies
        try:
            fit = simulate_fit(model, wl.x[rest], wl.y[rest], epochs=epochs, batch_size=wl.batch_size,
                               num_workers=workers, seed=seed, validation_data=(wl.x_test, wl.y_test),
                               frequency=frequency, mode={"sync": "synchronous", "async": "asynchronous"}[mode])
        finally:
            local.ramped_rates, fit_head.HEAD_STEPS = ramped, head_steps
        curve = fit.history["val_" + wl.metric]
    return {"score": curve[-1], "curve": curve, "seconds": time.perf_counter() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=["textures-conv2d", "sequences-gru"], choices=list(WL.NAMES))
    parser.add_argument("--workers", nargs="+", type=int, default=[16])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--head", type=int, default=128, help="plain Keras steps before the distributed rest")
    parser.add_argument("--variants", nargs="+", default=["plain", "sync", "sync-noramp"], choices=VARIANTS)
    parser.add_argument("--rate-multiplier", type=float, default=1.0,
                        help="compile every model at this many times its workload's rate (as convergence.py)")
    parser.add_argument("--full", action="store_true",
                        help="after the head, train the workload's epochs over all its samples (a stability check)")
    parser.add_argument("--frequency", type=int, default=None, help="fix the default's window (local steps)")
    parser.add_argument("--tag", default="", help="suffix of the results file")
    args = parser.parse_args()
    path = os.path.join(RESULTS, f"first_epoch{'_' + args.tag if args.tag else ''}.json")
    saved = json.load(open(path)) if os.path.exists(path) else {"meta": {}, "rows": []}
    rows, what = saved["rows"], saved["meta"].get("what")  # a description written into the file outlives the runs
    done = {(r["workload"], r["seed"], r["workers"], r["head"], r["variant"], r.get("full", False),
             r.get("frequency")) for r in rows}
    for name in args.workloads:
        wl = WL.make(name)
        name = with_rate(wl, args.rate_multiplier)
        for seed in args.seeds:
            for workers in args.workers:
                for variant in args.variants:
                    frequency = None if variant == "plain" else args.frequency
                    key = (name, seed, 0 if variant == "plain" else workers, args.head, variant, args.full, frequency)
                    if key in done:
                        continue
                    row = dict(zip(("workload", "seed", "workers", "head", "variant", "full", "frequency"), key))
                    row.update(first_epoch(wl, seed, workers, args.head, variant, args.full, frequency))
                    rows.append(row)
                    done.add(key)
                    print(f"{name} seed {seed} K={key[2]} head {args.head} {variant:13s} {row['score']:.4f} "
                          f"{'(all epochs) ' if args.full else ''}in {row['seconds']:.0f}s", flush=True)
                    _save(path, rows, what)


def _save(path: str, rows: list, what: str | None) -> None:
    meta = {"script": "first_epoch.py", "time": time.strftime("%Y-%m-%d %H:%M"), **({"what": what} if what else {})}
    os.makedirs(RESULTS, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
