"""A pruned elephant sweep against hyperopt's SparkTrials on the same local Spark, side by side.

Tasks (``--task``), each split 75/25 (stratified, ``random_state=0``) into training data
and the validation set every trial is scored on (accuracy after its last epoch):

- ``digits``: scikit-learn's digits (1,797 8x8 images, 10 classes);
- ``cancer``: scikit-learn's breast cancer (569 samples, 30 features standardised on the
  training part, 2 classes);
- ``generated``: ``make_classification`` (8,000 samples, 40 features of which 12
  informative, 6 classes, 2 clusters per class, 3 % flipped labels, ``random_state=0``).

The latter two are held out: the benchmark and the defaults were built on digits.
One space for both arms: an MLP's width (16-128 units), Adam's learning rate
(log-uniform 1e-4 to 0.3) and the batch size (16, 32 or 64); every trial trains up to
``--epochs`` epochs (9).

- **elephant**: ``minimize(..., pruner="asha", parallelism=2)``, ASHA with rungs at 1, 3
  and 9 epochs (reduction factor 3), one worker per trial committing once per epoch.
- **SparkTrials**: ``fmin(..., trials=SparkTrials(parallelism=2))``, each trial a plain
  Keras ``fit`` of all the epochs inside one Spark task, no pruning.

``--points same`` (default): both arms evaluate the same points, trial *i* the *i*-th
random draw of the seed whichever arm asks (one hyperopt suggest function, given to
``fmin`` as ``algo`` and to ``minimize`` as ``sampler``), so a gap in best accuracy is
what pruning cost and nothing else. ``--points tpe``: each arm asks hyperopt's TPE (with
16 trials still in its random start-up, so random points, but not the same ones).
``--samplers cmaes,gp`` adds elephant arms with those Optuna samplers (ASHA too; their
own points), reported beside the two but not in the ratio.

All arms run ``--trials`` trials (16) on one ``local[2]`` session, TensorFlow at one
thread per process, after a warm-up that starts the Python workers and imports
TensorFlow in them; the two compared arms alternate which goes first from seed to seed.
Reported per seed: wall time of each arm, the ratio, the best validation accuracy of
each and the epochs trained. The figure: best-so-far validation accuracy against wall
time (the ASHA paper's figure type), each seed on the left, the median and range over
seeds on the right; pruned trials are left out of elephant's curve.

Usage::

    python benchmarks/sweeps.py [--task digits] [--seeds 0,1] [--trials 16] [--epochs 9]
                                [--points same|tpe] [--samplers cmaes,gp]

Writes ``benchmarks/results/<output>.json`` and ``.png`` (``--output``, default ``sweeps``).
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
TASKS = ("digits", "cancer", "generated")


def load_task(name: str):
    """``(x_train, x_val, y_train, y_val)`` of a task, float32 features."""
    from sklearn import datasets
    from sklearn.model_selection import train_test_split

    if name == "digits":
        x, y = datasets.load_digits(return_X_y=True)
        x = x / 16.0
    elif name == "cancer":
        x, y = datasets.load_breast_cancer(return_X_y=True)
    elif name == "generated":
        x, y = datasets.make_classification(n_samples=8000, n_features=40, n_informative=12, n_redundant=8,
                                            n_classes=6, n_clusters_per_class=2, flip_y=0.03, random_state=0)
    else:
        raise ValueError(f"--task must be one of {TASKS}; received {name!r}")
    x_train, x_val, y_train, y_val = train_test_split(x.astype("float32"), y, test_size=0.25, random_state=0,
                                                      stratify=y)
    if name != "digits":  # standardised on the training part only
        mean, std = x_train.mean(axis=0), x_train.std(axis=0) + 1e-8
        x_train, x_val = (x_train - mean) / std, (x_val - mean) / std
    return x_train.astype("float32"), x_val.astype("float32"), y_train, y_val


def space():
    from hyperopt import hp

    return {"units": hp.choice("units", [16, 32, 64, 128]),
            "lr": hp.loguniform("lr", np.log(1e-4), np.log(0.3)),
            "batch_size": hp.choice("batch_size", [16, 32, 64])}


def builder(features: int, classes: int):
    def build(units, lr):
        import keras

        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(units, activation="relu"),
                                  keras.layers.Dense(classes, activation="softmax")])
        model.compile(keras.optimizers.Adam(lr), "sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    return build


def same_points(seed: int):
    """A hyperopt suggest function giving trial ``i`` the ``i``-th random point of ``seed``, whoever asks.

    hyperopt's ``rand.suggest`` draws from a generator seeded by its ``seed``
    argument alone; seeding it per trial id makes the point a function of
    ``(seed, trial id)``, so SparkTrials (which asks for two points at a time)
    and elephant's study (one at a time) see the same sequence.
    """
    from hyperopt import rand

    def suggest(new_ids, domain, trials, _seed):
        return [doc for tid in new_ids for doc in rand.suggest([tid], domain, trials, seed=seed * 100_003 + tid)]

    suggest.__module__ = "benchmarks.sweeps"
    return suggest


def run_elephant(spark, task, seed: int, trials: int, epochs: int, parallelism: int, sampler) -> dict:
    from elephant.search import minimize

    x_train, x_val, y_train, y_val = task["data"]
    t0 = time.perf_counter()
    result = minimize(task["build"], space(), x_train, y_train, max_evals=trials, parallelism=parallelism,
                      pruner="asha", sampler=sampler, metric="val_accuracy", mode="max",
                      validation_data=(x_val, y_val), epochs=epochs, num_workers=1, frequency="epoch", seed=seed,
                      verbose=0, spark=spark)
    seconds = time.perf_counter() - t0
    done = sorted((t.start + t.duration, t.score) for t in result.trials if t.status == "ok")
    return {"seconds": seconds, "best_val_accuracy": result.best_score,
            "epochs_trained": int(sum(t.epochs for t in result.trials)),
            "statuses": {s: sum(t.status == s for t in result.trials) for s in ("ok", "pruned", "failed", "timeout")},
            "points": [_point(t.params) for t in sorted(result.trials, key=lambda t: t.number)],
            "trials": [{"status": t.status, "epochs": t.epochs, "score": t.score,
                        "val_accuracy": [float(v) for v in (t.history or {}).get("val_accuracy", [])]}
                       for t in sorted(result.trials, key=lambda t: t.number)],
            "curve": _best_so_far(done)}


def run_spark_trials(spark, task, seed: int, trials: int, epochs: int, parallelism: int, algo) -> dict:
    from hyperopt import STATUS_OK, SparkTrials, fmin, space_eval

    x_train, x_val, y_train, y_val = task["data"]
    build = task["build"]

    def objective(point):  # runs in a Spark task: a plain Keras fit of every epoch
        model = build(point["units"], point["lr"])
        history = model.fit(x_train, y_train, epochs=epochs, batch_size=point["batch_size"],
                            validation_data=(x_val, y_val), verbose=0)
        curve = [float(v) for v in history.history["val_accuracy"]]
        return {"loss": -curve[-1], "status": STATUS_OK, "ended": time.time(), "val_accuracy": curve}

    spark_trials = SparkTrials(parallelism=parallelism, spark_session=spark)
    t0, wall0 = time.perf_counter(), time.time()
    fmin(objective, space(), algo=algo, max_evals=trials, trials=spark_trials,
         rstate=np.random.default_rng(seed), show_progressbar=False)
    seconds = time.perf_counter() - t0
    ok = [r for r in spark_trials.results if r.get("status") == STATUS_OK]
    done = sorted((r["ended"] - wall0, -r["loss"]) for r in ok)
    points = [_point(space_eval(space(), {label: v[0] for label, v in t["misc"]["vals"].items() if v}))
              for t in sorted(spark_trials.trials, key=lambda t: t["tid"])]
    return {"seconds": seconds, "best_val_accuracy": max(-r["loss"] for r in ok) if ok else None,
            "epochs_trained": len(ok) * epochs,
            "statuses": {"ok": len(ok), "failed": len(spark_trials.results) - len(ok)},
            "points": points,
            "trials": [{"status": "ok" if t["result"].get("status") == STATUS_OK else "failed", "epochs": epochs,
                        "score": -t["result"]["loss"] if "loss" in t["result"] else None,
                        "val_accuracy": t["result"].get("val_accuracy", [])}
                       for t in sorted(spark_trials.trials, key=lambda t: t["tid"])],
            "curve": _best_so_far(done)}


def _point(params) -> dict:
    """A trial's point (width, rate, batch size) for the record."""
    return {k: round(float(v), 10) for k, v in sorted(params.items())}


def _best_so_far(done) -> list[list[float]]:
    curve, best = [], -np.inf
    for at, score in done:
        best = max(best, score)
        curve.append([float(at), float(best)])
    return curve


def warm_up(spark, task) -> float:
    """Start both Python workers and import TensorFlow in them, and on the driver; seconds."""
    from elephant import SparkModel

    x_train, _, y_train, _ = task["data"]
    t0 = time.perf_counter()
    spark.sparkContext.parallelize(range(2), 2).map(lambda _: __import__("keras").__version__).collect()
    SparkModel(task["build"](16, 1e-3), num_workers=1, spark=spark, frequency="epoch").fit(
        x_train, y_train, epochs=1, batch_size=32, verbose=0)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="digits", choices=TASKS)
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds, one pair of sweeps each")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=9)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--points", default="same", choices=("same", "tpe"),
                        help="same: both arms evaluate the seed's random points in order; tpe: each asks TPE")
    parser.add_argument("--samplers", default="", help="comma-separated Optuna samplers for extra elephant arms")
    parser.add_argument("--output", default="sweeps", help="file stem under benchmarks/results")
    parser.add_argument("--plot-only", action="store_true", help="redraw <output>.png from <output>.json")
    args = parser.parse_args()
    if args.plot_only:
        with open(os.path.join(RESULTS, f"{args.output}.json")) as f:
            saved = json.load(f)
        _plot(saved["results"], os.path.join(RESULTS, f"{args.output}.png"), saved["meta"]["task"].split(",")[0])
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    extra = [s for s in args.samplers.split(",") if s]

    from hyperopt import tpe

    from elephant.session import local_session

    load_before = os.getloadavg()
    spark = local_session(f"local[{args.parallelism}]", "elephant-bench-sweeps")
    data = load_task(args.task)
    task = {"data": data, "build": builder(data[0].shape[1], int(np.max(data[2])) + 1)}
    warmup = warm_up(spark, task)
    rows = []
    for i, seed in enumerate(seeds):
        same = same_points(seed) if args.points == "same" else None
        runs = {"elephant asha": lambda: run_elephant(spark, task, seed, args.trials, args.epochs, args.parallelism,
                                                      same or "hyperopt-tpe"),
                "SparkTrials": lambda: run_spark_trials(spark, task, seed, args.trials, args.epochs,
                                                        args.parallelism, same or tpe.suggest)}
        for name in extra:
            runs[f"elephant asha {name}"] = (lambda name=name: run_elephant(
                spark, task, seed, args.trials, args.epochs, args.parallelism, name))
        order = [*(ARMS if i % 2 == 0 else ARMS[::-1]), *(f"elephant asha {name}" for name in extra)]
        by_arm = {}
        for arm in order:
            load = os.getloadavg()[0]
            by_arm[arm] = {"arm": arm, "seed": seed, "load_1min_at_start": load, **runs[arm]()}
            print(f"seed {seed} {arm}: {by_arm[arm]['seconds']:.1f}s, best val accuracy "
                  f"{by_arm[arm]['best_val_accuracy']:.4f}, {by_arm[arm]['epochs_trained']} epochs", flush=True)
        theirs = by_arm["SparkTrials"]
        for arm in by_arm:
            if arm != "SparkTrials":
                by_arm[arm]["time_ratio"] = by_arm[arm]["seconds"] / theirs["seconds"]
                by_arm[arm]["accuracy_delta_pp"] = 100 * (by_arm[arm]["best_val_accuracy"]
                                                          - theirs["best_val_accuracy"])
        if same is not None:
            ours = by_arm["elephant asha"]
            ours["same_points_as_sparktrials"] = ours["points"] == theirs["points"]
        rows += [by_arm[arm] for arm in order if arm in ARMS] + [by_arm[arm] for arm in order if arm not in ARMS]
    load_after = os.getloadavg()
    spark.stop()

    print(f"\n{args.task}, {args.trials} trials of up to {args.epochs} epochs, parallelism {args.parallelism}, "
          f"points {args.points} (warm-up {warmup:.1f}s, not included); load average {load_before[0]:.1f} before, "
          f"{load_after[0]:.1f} after")
    print(f"{'seed':>4}  {'arm':<22}{'seconds':>9}{'best val acc':>14}{'epochs':>8}{'x SparkTrials':>15}"
          f"{'Δacc pp':>9}")
    for r in rows:
        print(f"{r['seed']:>4}  {r['arm']:<22}{r['seconds']:>9.1f}{r['best_val_accuracy']:>14.4f}"
              f"{r['epochs_trained']:>8}{r.get('time_ratio', 1.0):>15.2f}{r.get('accuracy_delta_pp', 0.0):>9.2f}")
    summary = {"target": "time ratio <= 0.7 with best val accuracy no more than 0.5 point below SparkTrials'"}
    for arm in sorted({r["arm"] for r in rows} - {"SparkTrials"}):
        mine = [r for r in rows if r["arm"] == arm]
        summary[arm] = {"median_time_ratio": float(np.median([r["time_ratio"] for r in mine])),
                        "median_accuracy_delta_pp": float(np.median([r["accuracy_delta_pp"] for r in mine])),
                        "worst_accuracy_delta_pp": float(min(r["accuracy_delta_pp"] for r in mine))}
        figures = summary[arm]
        print(f"{arm}: median time ratio {figures['median_time_ratio']:.2f}, accuracy delta median "
              f"{figures['median_accuracy_delta_pp']:+.2f} pp, worst {figures['worst_accuracy_delta_pp']:+.2f}")

    import hyperopt
    import optuna
    import pyspark

    meta = {"task": f"{args.task}, stratified 75/25 split (random_state=0), val accuracy after the last epoch",
            "trials": args.trials, "max_epochs": args.epochs, "parallelism": args.parallelism, "seeds": seeds,
            "points": args.points, "samplers": extra, "warmup_seconds": warmup, "tf_threads_per_process": 1,
            "versions": {"pyspark": pyspark.__version__, "hyperopt": hyperopt.__version__,
                         "optuna": optuna.__version__},
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                        "load_average_before": load_before, "load_average_after": load_after,
                        "note": "a shared machine: the load average at each arm's start is in its row"}}
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"{args.output}.json"), "w") as f:
        json.dump({"meta": meta, "summary": summary, "results": rows}, f, indent=2)
    _plot(rows, os.path.join(RESULTS, f"{args.output}.png"), args.task)


COLORS = {"elephant asha": "tab:blue", "SparkTrials": "tab:orange"}


def _step(curve, grid):
    """A best-so-far curve as a step function on ``grid`` (NaN before its first completed trial)."""
    out = np.full(len(grid), np.nan)
    for at, best in curve:
        out[grid >= at] = best  # held after the sweep's end: the best it returned
    return out


def _plot(rows, path: str, task: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    styles = ["-", "--", ":", "-."]
    seeds = sorted({r["seed"] for r in rows})
    arms = sorted({r["arm"] for r in rows}, key=lambda a: (a not in ARMS, a))
    colors = {a: COLORS.get(a, f"C{2 + i}") for i, a in enumerate(arms)}
    for r in rows:
        if not r["curve"]:
            continue
        at, best = zip(*r["curve"])
        first = r["seed"] == min(q["seed"] for q in rows if q["arm"] == r["arm"])
        left.step([0.0, *at, r["seconds"]], [np.nan, *best, best[-1]], where="post", color=colors[r["arm"]],
                  ls=styles[seeds.index(r["seed"]) % len(styles)], label=r["arm"] if first else None)
    grid = np.linspace(0.0, max(r["seconds"] for r in rows), 400)
    for arm in arms:
        curves = np.array([_step(r["curve"], grid) for r in rows if r["arm"] == arm])
        with np.errstate(all="ignore"), __import__("warnings").catch_warnings():
            __import__("warnings").simplefilter("ignore", RuntimeWarning)  # columns before any trial ended: all NaN
            # the median once every seed has a result
            median = np.where(np.isnan(curves).any(axis=0), np.nan, np.median(curves, axis=0))
            low, high = np.nanmin(curves, axis=0), np.nanmax(curves, axis=0)
        ends = sorted(r["seconds"] for r in rows if r["arm"] == arm)
        right.plot(grid, median, color=colors[arm], label=f"{arm}: median over {len(curves)} seeds")
        right.fill_between(grid, low, high, color=colors[arm], alpha=0.2, step=None)
        right.axvline(float(np.median(ends)), color=colors[arm], ls=":", lw=1)
    for ax, title in ((left, "each seed (line style: seed)"),
                      (right, "median once every seed has a result, range (dotted: median end)")):
        ax.set_xlabel("wall time (s)")
        ax.set_title(f"{task}: {title}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    left.set_ylabel("best validation accuracy so far")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
