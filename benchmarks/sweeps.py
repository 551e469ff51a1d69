"""A pruned elephant sweep against hyperopt's SparkTrials on the same local Spark, side by side.

The task: scikit-learn's digits (1,797 8x8 images, 10 classes), a stratified
75/25 split whose 25 % is the held-out validation set every trial is scored on
(accuracy after its last epoch). One space for both arms: an MLP's width
(16-128 units), Adam's learning rate (log-uniform 1e-4 to 0.3) and the batch size
(16, 32 or 64); every trial trains up to ``--epochs`` epochs (9).

- **elephant**: ``minimize(..., pruner="asha", parallelism=2)``, ASHA with rungs
  at 1, 3 and 9 epochs (reduction factor 3), one worker per trial committing once
  per epoch, the points drawn by hyperopt's TPE (``sampler="hyperopt-tpe"``).
- **SparkTrials**: ``fmin(..., algo=tpe.suggest, trials=SparkTrials(parallelism=2))``,
  each trial a plain Keras ``fit`` of all the epochs inside one Spark task, no pruning.

Both arms run ``--trials`` trials (16) on one ``local[2]`` session, TensorFlow at one
thread per process, after a warm-up that starts the Python workers and imports
TensorFlow in them; the arms alternate which goes first from seed to seed. With 16
trials hyperopt's TPE is still in its random start-up (20 trials), so both arms draw
random points from the seed (not the same points: SparkTrials asks for two at a time).
Reported per seed: wall time of each arm, the ratio, the best validation accuracy of
each and the epochs trained; the figure is best-so-far validation accuracy against
wall time (the ASHA paper's figure type), pruned trials left out of elephant's curve.

Usage::

    python benchmarks/sweeps.py [--seeds 0,1] [--trials 16] [--epochs 9]

Writes ``benchmarks/results/sweeps.json`` and ``benchmarks/results/sweeps.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")  # every process, driver and Python workers alike
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
ARMS = ("elephant asha", "SparkTrials")


def digits_split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    return train_test_split((x / 16.0).astype("float32"), y, test_size=0.25, random_state=0, stratify=y)


def space():
    from hyperopt import hp

    return {"units": hp.choice("units", [16, 32, 64, 128]),
            "lr": hp.loguniform("lr", np.log(1e-4), np.log(0.3)),
            "batch_size": hp.choice("batch_size", [16, 32, 64])}


def build(units, lr):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(units, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(lr), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def run_elephant(spark, data, seed: int, trials: int, epochs: int, parallelism: int) -> dict:
    from elephant.search import minimize

    x_train, x_val, y_train, y_val = data
    t0 = time.perf_counter()
    result = minimize(build, space(), x_train, y_train, max_evals=trials, parallelism=parallelism, pruner="asha",
                      sampler="hyperopt-tpe", metric="val_accuracy", mode="max", validation_data=(x_val, y_val),
                      epochs=epochs, num_workers=1, frequency="epoch", seed=seed, verbose=0, spark=spark)
    seconds = time.perf_counter() - t0
    done = sorted((t.start + t.duration, t.score) for t in result.trials if t.status == "ok")
    return {"seconds": seconds, "best_val_accuracy": result.best_score,
            "epochs_trained": int(sum(t.epochs for t in result.trials)),
            "statuses": {s: sum(t.status == s for t in result.trials) for s in ("ok", "pruned", "failed", "timeout")},
            "curve": _best_so_far(done)}


def run_spark_trials(spark, data, seed: int, trials: int, epochs: int, parallelism: int) -> dict:
    from hyperopt import STATUS_OK, SparkTrials, fmin, tpe

    x_train, x_val, y_train, y_val = data

    def objective(point):  # runs in a Spark task: a plain Keras fit of every epoch
        model = build(point["units"], point["lr"])
        history = model.fit(x_train, y_train, epochs=epochs, batch_size=point["batch_size"],
                            validation_data=(x_val, y_val), verbose=0)
        accuracy = float(history.history["val_accuracy"][-1])
        return {"loss": -accuracy, "status": STATUS_OK, "ended": time.time()}

    spark_trials = SparkTrials(parallelism=parallelism, spark_session=spark)
    t0, wall0 = time.perf_counter(), time.time()
    fmin(objective, space(), algo=tpe.suggest, max_evals=trials, trials=spark_trials,
         rstate=np.random.default_rng(seed), show_progressbar=False)
    seconds = time.perf_counter() - t0
    ok = [r for r in spark_trials.results if r.get("status") == STATUS_OK]
    done = sorted((r["ended"] - wall0, -r["loss"]) for r in ok)
    return {"seconds": seconds, "best_val_accuracy": max(-r["loss"] for r in ok) if ok else None,
            "epochs_trained": len(ok) * epochs,
            "statuses": {"ok": len(ok), "failed": len(spark_trials.results) - len(ok)}, "curve": _best_so_far(done)}


def _best_so_far(done) -> list[list[float]]:
    curve, best = [], -np.inf
    for at, score in done:
        best = max(best, score)
        curve.append([float(at), float(best)])
    return curve


def warm_up(spark, data) -> float:
    """Start both Python workers and import TensorFlow in them, and on the driver; seconds."""
    from elephant import SparkModel

    x_train, _, y_train, _ = data
    t0 = time.perf_counter()
    spark.sparkContext.parallelize(range(2), 2).map(lambda _: __import__("keras").__version__).collect()
    SparkModel(build(16, 1e-3), num_workers=1, spark=spark, frequency="epoch").fit(
        x_train, y_train, epochs=1, batch_size=32, verbose=0)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds, one pair of sweeps each")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=9)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--output", default="sweeps", help="file stem under benchmarks/results")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]

    from elephant.session import local_session

    load_before = os.getloadavg()
    spark = local_session(f"local[{args.parallelism}]", "elephant-bench-sweeps")
    data = digits_split()
    warmup = warm_up(spark, data)
    runners = {"elephant asha": run_elephant, "SparkTrials": run_spark_trials}
    rows = []
    for i, seed in enumerate(seeds):
        order = ARMS if i % 2 == 0 else ARMS[::-1]
        by_arm = {}
        for arm in order:
            load = os.getloadavg()[0]
            by_arm[arm] = {"arm": arm, "seed": seed, "load_1min_at_start": load,
                           **runners[arm](spark, data, seed, args.trials, args.epochs, args.parallelism)}
            print(f"seed {seed} {arm}: {by_arm[arm]['seconds']:.1f}s, best val accuracy "
                  f"{by_arm[arm]['best_val_accuracy']:.4f}", flush=True)
        ours, theirs = by_arm["elephant asha"], by_arm["SparkTrials"]
        ours["time_ratio"] = ours["seconds"] / theirs["seconds"]
        ours["accuracy_delta_pp"] = 100 * (ours["best_val_accuracy"] - theirs["best_val_accuracy"])
        rows += [by_arm[arm] for arm in ARMS]
    load_after = os.getloadavg()
    spark.stop()

    print(f"\ndigits, {args.trials} trials of up to {args.epochs} epochs, parallelism {args.parallelism} "
          f"(warm-up {warmup:.1f}s, not included); load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"{'seed':>4}  {'arm':<15}{'seconds':>9}{'best val acc':>14}{'epochs':>8}{'x SparkTrials':>15}"
          f"{'Δacc pp':>9}")
    for r in rows:
        print(f"{r['seed']:>4}  {r['arm']:<15}{r['seconds']:>9.1f}{r['best_val_accuracy']:>14.4f}"
              f"{r['epochs_trained']:>8}{r.get('time_ratio', 1.0):>15.2f}{r.get('accuracy_delta_pp', 0.0):>9.2f}")
    ratios = [r["time_ratio"] for r in rows if "time_ratio" in r]
    deltas = [r["accuracy_delta_pp"] for r in rows if "accuracy_delta_pp" in r]
    summary = {"median_time_ratio": float(np.median(ratios)), "median_accuracy_delta_pp": float(np.median(deltas)),
               "target": "time ratio <= 0.7 with best val accuracy no more than 0.5 point below SparkTrials'"}
    print(f"median time ratio {summary['median_time_ratio']:.2f}, median accuracy delta "
          f"{summary['median_accuracy_delta_pp']:+.2f} pp")

    import hyperopt
    import optuna
    import pyspark

    meta = {"task": "sklearn digits, stratified 75/25 split (random_state=0), val accuracy after the last epoch",
            "trials": args.trials, "max_epochs": args.epochs, "parallelism": args.parallelism, "seeds": seeds,
            "warmup_seconds": warmup, "tf_threads_per_process": 1,
            "versions": {"pyspark": pyspark.__version__, "hyperopt": hyperopt.__version__,
                         "optuna": optuna.__version__},
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                        "load_average_before": load_before, "load_average_after": load_after,
                        "note": "a shared machine: other processes ran during the measurements, so times are noisy"}}
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"{args.output}.json"), "w") as f:
        json.dump({"meta": meta, "summary": summary, "results": rows}, f, indent=2)
    _plot(rows, os.path.join(RESULTS, f"{args.output}.png"))


def _plot(rows, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {"elephant asha": "tab:blue", "SparkTrials": "tab:orange"}
    styles = ["-", "--", ":", "-."]
    seeds = sorted({r["seed"] for r in rows})
    for r in rows:
        if not r["curve"]:
            continue
        at, best = zip(*r["curve"])
        ax.step([0.0, *at, r["seconds"]], [np.nan, *best, best[-1]], where="post", color=colors[r["arm"]],
                ls=styles[seeds.index(r["seed"]) % len(styles)], label=f"{r['arm']}, seed {r['seed']}")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("best validation accuracy so far")
    ax.set_title("digits: ASHA-pruned elephant sweep vs SparkTrials")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
