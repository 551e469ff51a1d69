"""Convergence at equal epochs: every mode's default and every named rule against plain Keras.

Five workloads (``benchmarks/workloads.py``: digits MLP with Adam, generated signals with a
Conv1D and SGD-momentum, generated shapes with a Conv2D and RMSprop, Friedman regression
with Adam, overlapping tabular classes with SGD-momentum), each compiled as a user would
and never tuned per rule. For each workload and seed we train:

* plain Keras ``model.fit`` (the reference), and
* every configuration in ``CONFIGS``: each mode's default, ``frequency="epoch"`` in each
  mode, and every registered rule at its own default window and settings,

from the same initial weights for the same epochs, and record the test metric of the
center after every epoch. Two engines:

* ``--engine sim`` (default): :func:`elephant.optimizers.simulate_fit`, the in-process
  simulator with one Keras replica per worker (2, 4 and 8 workers, 3 seeds);
* ``--engine spark``: the real thing, ``SparkModel.fit`` on a local Spark session with
  as many task slots as workers, timed side by side with plain Keras on the same cores.
  Its rows are also compared with the simulator's (same configuration and seed).

Run::

    python benchmarks/convergence.py                       # simulator grid (~30 min on 2 cores)
    python benchmarks/convergence.py --engine spark        # defaults on Spark, 2 and 4 workers
    python benchmarks/convergence.py --engine spark --time-repeats 3   # each fit timed 3 times, median kept
    python benchmarks/convergence.py --large --workers 2 4 8 --seeds 0   # MB models, big data, 1-2 epochs
    python benchmarks/convergence.py --workloads sequences-gru-1pass textures-conv2d-1pass --workers 8 16 \
        --configs sync-default async-default --seeds 0        # one pass over big data (workloads.ONE_PASS)
    python benchmarks/convergence.py --report              # table, plots, README section only
    python benchmarks/convergence.py --workloads digits-mlp --workers 2 --seeds 0 --configs sync-default

With ``--time-repeats N`` (Spark only) plain Keras and every configuration are fitted N times from the same
weights (the first fit gives the curve, the others only their time): a row keeps every run's time in
``seconds_runs`` (plain Keras also ``wall_runs``) and their median in ``seconds`` (``wall``), so a time ratio is
then one of medians.

Results go to ``benchmarks/results/convergence_<engine>.json``; ``--report`` (also run at the
end of every full run) writes ``convergence.md`` and one PNG per workload.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
RESULTS = os.path.join(HERE, "results")

import workloads as WL  # noqa: E402

# name -> SparkModel keyword arguments (None optimizer: the mode's default).
CONFIGS: dict[str, dict] = {
    "sync-default": dict(mode="synchronous"),
    "sync-w8": dict(mode="synchronous", frequency=8),  # the synchronous default before windows were decided
    "sync-epoch": dict(mode="synchronous", frequency="epoch"),
    "async-default": dict(mode="asynchronous"),  # windows decided from the fit's costs on long passes
    "async-epoch": dict(mode="asynchronous", frequency="epoch"),  # also the asynchronous default before
    "downpour": dict(mode="asynchronous", optimizer="downpour"),
    "downpour-w5": dict(mode="asynchronous", optimizer={"name": "downpour", "config": {"window": 5}}),  # the old default
    "agn": dict(mode="asynchronous", optimizer="agn"),
    "adag": dict(mode="asynchronous", optimizer="adag"),
    "dynsgd": dict(mode="asynchronous", optimizer="dynsgd"),
    "easgd": dict(mode="synchronous", optimizer="easgd"),
    "aeasgd": dict(mode="asynchronous", optimizer="aeasgd"),
    "eamsgd": dict(mode="asynchronous", optimizer="eamsgd"),
    "modelaveraging": dict(mode="synchronous", optimizer="modelaveraging"),
    "dcasgd": dict(mode="asynchronous", optimizer="dcasgd"),
    # commits in flight while the worker trains on (SparkModel(overlap=True))
    "downpour-overlap": dict(mode="asynchronous", optimizer="downpour", overlap=True),
    "dcasgd-overlap": dict(mode="asynchronous", optimizer="dcasgd", overlap=True),
    "agn-overlap": dict(mode="asynchronous", optimizer="agn", overlap=True),
    "dynsgd-overlap": dict(mode="asynchronous", optimizer="dynsgd", overlap=True),
    "aeasgd-overlap": dict(mode="asynchronous", optimizer="aeasgd", overlap=True),
    # synchronous: the next window trains while the round closes
    "sync-default-overlap": dict(mode="synchronous", overlap=True),
    "modelaveraging-overlap": dict(mode="synchronous", optimizer="modelaveraging", overlap=True),
    "easgd-overlap": dict(mode="synchronous", optimizer="easgd", overlap=True),
}
DEFAULT_CONFIGS = ("sync-default", "sync-w8", "sync-epoch", "async-default", "async-epoch")


def _key(row) -> tuple:
    return (row["workload"], row["config"], row["workers"], row["seed"])


def repeat_timing(row: dict, again: Callable[[], dict], repeats: int, fields: tuple[str, ...] = ("seconds",)) -> dict:
    """``row`` (the first fit's result) timed ``repeats`` times: ``again()`` fits once more and returns its times;
    each of ``fields`` keeps every run's value in ``<field>_runs`` (the first fit's first) and becomes their median.
    With ``repeats`` 1 the row is left as it is (no ``_runs``)."""
    if repeats <= 1:
        return row
    runs = {field: [row[field]] for field in fields}
    for _ in range(repeats - 1):
        timing = again()
        for field in fields:
            runs[field].append(timing[field])
    for field in fields:
        row[f"{field}_runs"] = runs[field]
        row[field] = float(statistics.median(runs[field]))
    return row


def time_ratio(row: dict, plain: dict) -> tuple[float, float | None, float | None]:
    """A configuration's time over plain Keras' as the report reads it (its ``seconds`` over plain's ``wall``: both
    evaluate the test set after every epoch), the medians where fits were repeated; then the lowest and highest ratio
    of any one of its runs to any one plain run, or ``(None, None)`` where neither row has repeated runs."""
    ratio = row["seconds"] / plain["wall"]
    if "seconds_runs" not in row and "wall_runs" not in plain:
        return ratio, None, None
    runs, plain_runs = row.get("seconds_runs", [row["seconds"]]), plain.get("wall_runs", [plain["wall"]])
    return ratio, min(runs) / max(plain_runs), max(runs) / min(plain_runs)


def ratio_text(row: dict, plain: dict) -> str:
    """``"1.08x"``, or ``"1.08x (1.02-1.15)"`` with the range of :func:`time_ratio` where fits were repeated."""
    ratio, low, high = time_ratio(row, plain)
    return f"{ratio:.2f}x" if low is None else f"{ratio:.2f}x ({low:.2f}-{high:.2f})"


def plain_keras(wl, seed: int, order: int = 0) -> dict:
    """Plain ``model.fit`` from the seed's initial weights; ``order`` > 0 shuffles the samples in another order
    (the same weights, another random seed for the shuffles) to measure how far plain Keras itself moves."""
    model = wl.build(seed)
    if order:
        import keras

        keras.utils.set_random_seed(10_000 * order + seed)
    curve, t0 = [], time.perf_counter()
    train_seconds = 0.0
    for _ in range(wl.epochs):
        t = time.perf_counter()
        model.fit(wl.x, wl.y, batch_size=wl.batch_size, epochs=1, verbose=0, shuffle=True)
        train_seconds += time.perf_counter() - t
        curve.append(wl.score(model.evaluate(wl.x_test, wl.y_test, batch_size=wl.batch_size, verbose=0, return_dict=True)))
    return {"curve": curve, "final": curve[-1], "seconds": train_seconds, "wall": time.perf_counter() - t0}


def run_sim(wl, config: dict, workers: int, seed: int) -> dict:
    from elephant.optimizers import simulate_fit

    t0 = time.perf_counter()
    fit = simulate_fit(wl.build(seed), wl.x, wl.y, epochs=wl.epochs, batch_size=wl.batch_size, num_workers=workers,
                       seed=seed, validation_data=(wl.x_test, wl.y_test), **config)
    curve = fit.history["val_" + wl.metric]
    return {"curve": curve, "final": curve[-1], "seconds": time.perf_counter() - t0,
            "updates": int(sum(fit.history["updates"])), "window": fit.window, "optimizer": repr(fit.optimizer),
            "peak_rss_mb": _peak_rss_mb()}


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _spark(slots: int):
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    from elephant.session import local_session

    return local_session(f"local[{slots}]", "elephant-convergence")


def run_spark(wl, config: dict, workers: int, seed: int, spark) -> dict:
    from elephant import SparkModel

    sm = SparkModel(wl.build(seed), num_workers=workers, spark=spark, seed=seed, **config)
    t0 = time.perf_counter()
    history = sm.fit(wl.x, wl.y, epochs=wl.epochs, batch_size=wl.batch_size,
                     validation_data=(wl.x_test, wl.y_test), verbose=0)
    seconds = time.perf_counter() - t0
    curve = [float(v) for v in history.history["val_" + wl.metric]]
    # validation runs on the driver inside fit; subtract nothing: plain Keras' timing above
    # includes its own per-epoch evaluation in `wall`, and we compare fit-only seconds below.
    plan = sm.fit_plan or {}
    return {"curve": curve, "final": curve[-1], "seconds": seconds, "window": plan.get("window", sm.window),
            "optimizer": repr(sm.optimizer), "worker_batch_size": plan.get("worker_batch_size"),
            "window_choice": plan.get("window_choice"), "warmup_window": plan.get("warmup_window"),
            "head_steps": plan.get("head_steps")}


def _warm_up(spark, workers: int) -> None:
    """One tiny fit, so Python workers have started and imported TensorFlow before timing."""
    from elephant import SparkModel

    wl = WL.make("digits-mlp")
    SparkModel(wl.build(0), num_workers=workers, spark=spark).fit(wl.x[:256], wl.y[:256], epochs=1, verbose=0)


def with_rate(wl, multiplier: float) -> str:
    """Compile ``wl``'s model at ``multiplier`` times its rate (plain Keras and every configuration alike): a rate
    the defaults were not chosen at. Returns the name its rows are saved under."""
    if multiplier == 1.0:
        return wl.name
    build = wl.build

    def scaled(seed):
        model = build(seed)
        model.optimizer.learning_rate = float(model.optimizer.learning_rate.numpy()) * multiplier
        return model

    wl.build = scaled
    wl.name = f"{wl.name}-lr{multiplier:g}x"
    return wl.name


def run(args) -> None:
    path = os.path.join(RESULTS, f"convergence_{args.engine}{'_' + args.tag if args.tag else ''}.json")
    done, what = {}, None
    if os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)
        what = saved["meta"].get("what")  # a description written into the file by hand outlives the runs
        if not args.fresh:
            for row in saved["rows"]:
                done[_key(row)] = row
    spark = None
    for workload in args.workloads:
        wl = WL.make(workload)
        name = with_rate(wl, args.rate_multiplier)
        for seed in args.seeds:
            key = (name, "plain", 0, seed)
            if key not in done:
                # every timing run rebuilds the model from the seed: the same weights, the same shuffles
                fit = functools.partial(plain_keras, wl, seed)
                row = {"workload": name, "config": "plain", "workers": 0, "seed": seed,
                       **repeat_timing(fit(), fit, args.time_repeats, ("seconds", "wall"))}
                done[key] = row
                runs = f" (median of {', '.join(f'{v:.1f}' for v in row['seconds_runs'])})" \
                    if "seconds_runs" in row else ""
                print(f"{name} seed {seed} plain keras {row['final']:.4f} in {row['seconds']:.1f}s{runs}", flush=True)
            if args.plain_orders:
                _plain_orders(wl, name, seed, args.plain_orders, done)
                _save(path, args.engine, done, what)
            for workers in args.workers:
                if args.engine == "spark" and (spark is None or spark.sparkContext.defaultParallelism != workers):
                    spark = _spark(workers)
                    _warm_up(spark, workers)
                for config in args.configs:
                    key = (name, config, workers, seed)
                    if key in done:
                        continue
                    row = {"workload": name, "config": config, "workers": workers, "seed": seed, "engine": args.engine}
                    try:
                        if args.engine == "sim":
                            row.update(run_sim(wl, CONFIGS[config], workers, seed))
                        else:
                            fit = functools.partial(run_spark, wl, CONFIGS[config], workers, seed, spark)
                            row.update(repeat_timing(fit(), fit, args.time_repeats))
                    except Exception as exc:  # noqa: BLE001 - one failed run must not lose the others
                        traceback.print_exc()
                        row.update(error=f"{type(exc).__name__}: {exc}")
                    done[key] = row
                    plain = done[(name, "plain", 0, seed)]
                    final = row.get("final", float("nan"))
                    # the ratio (of medians, with its range) only where fits were repeated: the output is as before
                    ratio = f", {ratio_text(row, plain)} plain Keras' time" \
                        if args.time_repeats > 1 and "seconds" in row and "wall" in plain else ""
                    print(f"{name} seed {seed} K={workers} {config:15s} {final:.4f} ({final - plain['final']:+.4f}) "
                          f"in {row.get('seconds', float('nan')):.1f}s{ratio}", flush=True)
                    _save(path, args.engine, done, what)
    _save(path, args.engine, done, what)
    if spark is not None:
        spark.stop()


def _plain_orders(wl, name: str, seed: int, orders: int, done: dict) -> None:
    """Plain Keras from the seed's weights in ``orders`` more shuffle orders: one row ``plain-orders`` holding each
    order's curve (the report's yardstick for a gap: the spread plain Keras has on its own)."""
    key = (name, "plain-orders", 0, seed)
    row = done.setdefault(key, {"workload": name, "config": "plain-orders", "workers": 0, "seed": seed,
                                "orders": [], "finals": [], "curves": []})
    for order in range(len(row["orders"]) + 1, orders + 1):
        fit = plain_keras(wl, seed, order)
        row["orders"].append(order)
        row["finals"].append(fit["final"])
        row["curves"].append(fit["curve"])
        print(f"{name} seed {seed} plain keras, shuffle order {order}: {fit['final']:.4f}", flush=True)


def _save(path, engine, done, what: str | None = None) -> None:
    os.makedirs(RESULTS, exist_ok=True)
    meta = {"engine": engine, "python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%d %H:%M")}
    if what:
        meta["what"] = what
    with open(path + ".tmp", "w") as f:
        json.dump({"meta": meta, "rows": sorted(done.values(), key=lambda r: tuple(map(str, _key(r))))}, f, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=["sim", "spark"], default="sim")
    parser.add_argument("--workloads", nargs="+", default=list(WL.SMALL), choices=list(WL.NAMES))
    parser.add_argument("--large", action="store_true",
                        help=f"the megabyte models and big data ({', '.join(WL.LARGE)}) instead of the small workloads")
    parser.add_argument("--configs", nargs="*", default=None)
    parser.add_argument("--tag", default="", help="suffix of the results file, for runs in parallel processes")
    parser.add_argument("--workers", nargs="+", type=int, default=None)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--fresh", action="store_true", help="ignore rows already in the results file")
    parser.add_argument("--extra", nargs="*", default=[], metavar="NAME=JSON",
                        help='more configurations, e.g. \'ma-nesterov={"mode": "synchronous", "optimizer": '
                             '{"name": "modelaveraging", "config": {"outer_momentum": 0.9}}}\'')
    parser.add_argument("--rate-multiplier", type=float, default=1.0,
                        help="compile every model at this many times its workload's rate (rows saved as "
                             "<workload>-lr<x>x): the defaults at a rate they were not measured at")
    parser.add_argument("--plain-orders", type=int, default=0, metavar="N",
                        help="also fit plain Keras from each seed's weights in N other shuffle orders: how far plain "
                             "Keras moves on its own, against which the report reads each gap")
    parser.add_argument("--time-repeats", type=int, default=1, metavar="N",
                        help="Spark only: fit plain Keras and every configuration N times from the same weights "
                             "(the first fit gives the curve, the others only their time) and keep the median time, "
                             "with every run's in seconds_runs: time ratios of medians")
    parser.add_argument("--report", action="store_true", help="only write the report from saved results")
    args = parser.parse_args()
    for item in args.extra:
        name, _, spec = item.partition("=")
        CONFIGS[name] = json.loads(spec)
    if args.large:
        args.workloads = list(WL.LARGE)
    if args.configs is None:
        args.configs = list(CONFIGS) if args.engine == "sim" and not args.large else list(DEFAULT_CONFIGS)
    if args.workers is None:
        args.workers = [2, 4, 8] if args.engine == "sim" else [2, 4]
    args.configs = [*args.configs, *(item.partition("=")[0] for item in args.extra)]
    if args.time_repeats < 1:
        parser.error("--time-repeats must be at least 1")
    if args.time_repeats > 1 and args.engine != "spark":
        parser.error("--time-repeats times Spark's fits against plain Keras': use it with --engine spark")
    unknown = sorted(set(args.configs) - set(CONFIGS))
    if unknown:
        parser.error(f"unknown configurations {unknown}; known: {sorted(CONFIGS)}")
    if not args.report:
        run(args)
    import report_convergence

    report_convergence.write()
