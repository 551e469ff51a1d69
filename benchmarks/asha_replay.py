"""What pruning would have cost: Optuna's pruners replayed over the full learning curves of a sweep.

``benchmarks/sweeps.py`` records, for its SparkTrials arm, every trial's validation
accuracy at every epoch (no trial is pruned there). This script feeds those curves,
trial by trial in the order they were drawn, to Optuna's own pruners through a real
study (``trial.report`` then ``trial.should_prune`` at each epoch end, the last epoch
recorded but not put to the pruner, as elephant's search does), and reports per pruner
setting the best final accuracy kept against the best of all trials, and the epochs
trained. It isolates the pruning rule from everything a live sweep adds (fit-to-fit
noise, the order in which concurrent trials reach a rung), and costs seconds, so
settings can be compared over every task and seed a sweep run left.

Usage::

    python benchmarks/asha_replay.py benchmarks/results/sweeps_digits.json [more.json ...]

Writes ``benchmarks/results/asha_replay.json``.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

SETTINGS = {  # name: (pruner class name, arguments)
    "asha eta=3 r=1 (elephant's)": ("SuccessiveHalvingPruner", {"min_resource": 1, "reduction_factor": 3}),
    "asha eta=4 r=1": ("SuccessiveHalvingPruner", {"min_resource": 1, "reduction_factor": 4}),
    "asha eta=2 r=1": ("SuccessiveHalvingPruner", {"min_resource": 1, "reduction_factor": 2}),
    "asha eta=3 r=2": ("SuccessiveHalvingPruner", {"min_resource": 2, "reduction_factor": 3}),
    "asha eta=3 r=3": ("SuccessiveHalvingPruner", {"min_resource": 3, "reduction_factor": 3}),
    "hyperband eta=3": ("HyperbandPruner", {"min_resource": 1, "reduction_factor": 3}),
    "median": ("MedianPruner", {}),
}


def replay(curves: list[list[float]], pruner) -> tuple[float, int]:
    """(best final accuracy among the trials that completed, epochs trained) under ``pruner``."""
    import optuna

    study = optuna.create_study(direction="maximize", pruner=pruner)
    best, epochs = -np.inf, 0
    for curve in curves:
        trial = study.ask()
        for epoch, value in enumerate(curve):
            trial.report(float(value), epoch + 1)
            epochs += 1
            if epoch < len(curve) - 1 and trial.should_prune():
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                break
        else:
            study.tell(trial, float(curve[-1]))
            best = max(best, float(curve[-1]))
    return best, epochs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="sweeps.py result files")
    parser.add_argument("--output", default="asha_replay")
    args = parser.parse_args()

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sweeps = []  # (task, seed, curves)
    for path in args.results:
        with open(path) as f:
            data = json.load(f)
        for row in data["results"]:
            if row["arm"] == "SparkTrials" and row.get("trials"):
                sweeps.append((data["meta"]["task"].split(",")[0], row["seed"],
                               [t["val_accuracy"] for t in row["trials"]]))
    rows = []
    print(f"{len(sweeps)} sweeps: " + ", ".join(f"{task} seed {seed}" for task, seed, _ in sweeps))
    print(f"{'setting':<30}{'median Δ pp':>12}{'worst Δ pp':>11}{'kept best':>10}{'epochs (of all)':>17}")
    for name, (cls, kwargs) in SETTINGS.items():
        per = []
        for task, seed, curves in sweeps:
            max_epochs = len(curves[0])
            extra = {"max_resource": max_epochs} if cls == "HyperbandPruner" else {}
            best, epochs = replay(curves, getattr(optuna.pruners, cls)(**kwargs, **extra))
            full = max(c[-1] for c in curves)
            per.append({"task": task, "seed": seed, "delta_pp": 100 * (best - full), "epochs": epochs,
                        "all_epochs": sum(len(c) for c in curves)})
        deltas = [p["delta_pp"] for p in per]
        share = np.mean([p["epochs"] / p["all_epochs"] for p in per])
        rows.append({"setting": name, "pruner": cls, "arguments": kwargs, "per_sweep": per,
                     "median_delta_pp": float(np.median(deltas)), "worst_delta_pp": float(min(deltas)),
                     "kept_best": int(sum(d == 0 for d in deltas)), "epoch_share": float(share)})
        print(f"{name:<30}{np.median(deltas):>+12.2f}{min(deltas):>+11.2f}{rows[-1]['kept_best']:>6}/{len(per):<3}"
              f"{100 * share:>16.0f}%")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"{args.output}.json"), "w") as f:
        json.dump({"sources": [os.path.basename(p) for p in args.results], "settings": rows}, f, indent=2)


if __name__ == "__main__":
    main()
