"""DataFrames against numpy: the same data, the same model, side by side in one run.

A generated classification set (``--rows`` rows, 40 float features, 10 classes
from a random linear map under noise) is written once to Parquet and read back,
as a user's table would be; a 40-64-10 MLP (Adam, batch 256) trains one epoch
on 2 workers:

* ``fit(x, y)`` on the numpy arrays, then ``fit(df)`` on the DataFrame (an
  ``array<float>`` features column; ``--vector`` adds a run on a Vector column
  made by ``VectorAssembler``); each from the same initial weights;
* ``predict(x)`` on numpy, then ``predict(df)`` forced by a ``noop`` write of
  the returned DataFrame (every column computed, nothing collected), then of its
  prediction column alone (the features are read for the model but not written
  out), after a warm-up of both paths on 5,000 rows; and a ``noop`` write of
  the features column with no model, the floor of any DataFrame path.

Each is measured ``--repeats`` times (3), the paths alternating; the median run
is reported, with every run's seconds beside it. ``--base DIR`` measures another
checkout of elephant side by side (``git archive <commit> | tar -x -C DIR``): a
process per checkout and repeat, alternating, each importing its checkout's
elephant, and reports this checkout's seconds over the base's.

Reported: seconds, ratios DataFrame / numpy, the test accuracy of each fit,
and the driver's peak resident memory while the DataFrame is fitted (the
driver must not hold the dataset). Writes ``benchmarks/results/dataframe.json``.

Usage::

    python benchmarks/dataframe.py                 # 1M rows
    python benchmarks/dataframe.py --rows 200000   # quicker
    python benchmarks/dataframe.py --base DIR --base-label COMMIT --tag base   # against another checkout
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from checkouts import run_child  # noqa: E402

FEATURES, CLASSES = 40, 10


def make_data(rows: int, seed: int = 0):
    w = np.random.default_rng(1234).normal(size=(FEATURES, CLASSES)).astype(np.float32)  # the task, fixed
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    y = np.argmax(x @ w + rng.normal(scale=2.0, size=(rows, CLASSES)), axis=1).astype(np.int64)
    return x, y


def build_model(seed: int = 0):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(CLASSES, activation="softmax")])
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def write_parquet(spark, x, y, path: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    offsets = np.arange(0, x.size + 1, FEATURES, dtype=np.int32)
    features = pa.ListArray.from_arrays(pa.array(offsets), pa.array(x.ravel()))
    pq.write_table(pa.table({"features": features, "label": pa.array(y)}), path, row_group_size=100_000)
    return spark.read.parquet(path)


class PeakRSS:
    """The driver's peak resident memory (MB) while the block runs, sampled every 10 ms."""

    def __enter__(self):
        self.peak, self._done = _rss_mb(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._done.wait(0.01):
            self.peak = max(self.peak, _rss_mb())

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def measure(args) -> dict:
    """Every run of every measurement, in this process, and where the driver's and the tasks' elephant come from."""
    import elephant
    from elephant import SparkModel
    from elephant.session import local_session

    spark = local_session(f"local[{args.workers}]", "elephant-dataframe-benchmark")
    spark.sparkContext.setLogLevel("ERROR")
    x, y = make_data(args.rows)
    x_test, y_test = make_data(20_000, seed=1)  # the same task, other samples
    runs: dict[str, list[dict]] = {}
    where = {"elephant": os.path.dirname(elephant.__file__),
             "task_elephant": spark.sparkContext.parallelize([0], 1).map(
                 lambda _: os.path.dirname(__import__("elephant").__file__)).first()}

    def accuracy(model):
        return float(np.mean(np.argmax(model.predict(x_test, batch_size=4096, verbose=0), axis=1) == y_test))

    def fit(data, label=None, **kwargs):
        sm = SparkModel(build_model(), num_workers=args.workers, spark=spark)
        with PeakRSS() as rss:
            _, seconds = timed(lambda: sm.fit(data, label, epochs=1, batch_size=args.batch_size, verbose=0, **kwargs))
        return sm, {"seconds": seconds, "accuracy": accuracy(sm.model), "driver_peak_rss_mb": rss.peak}

    with tempfile.TemporaryDirectory() as tmp:
        df = write_parquet(spark, x, y, os.path.join(tmp, "data.parquet"))
        # start the Python workers, import TensorFlow and warm the JVM's Parquet and Arrow paths before timing
        fit(x[:5000], y[:5000])
        fit(df.limit(5000))
        fits = {"fit numpy": lambda: fit(x, y), "fit DataFrame": lambda: fit(df)}
        if args.vector:
            from pyspark.ml.feature import VectorAssembler
            from pyspark.sql import functions as F

            wide = df.select(*[F.col("features")[i].alias(f"f{i}") for i in range(FEATURES)], "label")
            vectors = VectorAssembler(inputCols=[f"f{i}" for i in range(FEATURES)], outputCol="features").transform(wide)
            fits["fit DataFrame (Vector)"] = lambda: fit(vectors.select("features", "label"))
        models = {}
        for _ in range(args.repeats):  # the paths alternate, so a slow spell of the machine hits each alike
            for name, run in fits.items():
                models[name], measured = run()
                runs.setdefault(name, []).append(measured)
        sm = models["fit numpy"]

        def noop(frame):
            return {"seconds": timed(lambda: frame.write.format("noop").mode("overwrite").save())[1]}

        sm.predict(x[:5000], batch_size=1024)  # both paths warm: the workers' inference model is built
        noop(sm.predict(df.limit(5000).select("features"), batch_size=1024))
        predicted = sm.predict(df.select("features"), batch_size=1024)
        predicts = {"predict numpy": lambda: {"seconds": timed(lambda: sm.predict(x, batch_size=1024))[1]},
                    "predict DataFrame": lambda: noop(predicted),
                    "predict DataFrame (prediction only)": lambda: noop(predicted.select("prediction")),
                    "scan DataFrame (no model)": lambda: noop(df.select("features"))}
        for _ in range(args.repeats):
            for name, run in predicts.items():
                runs.setdefault(name, []).append(run())
    spark.stop()
    return {"runs": runs, **where}


def summary(runs: dict[str, list[dict]], label: str = "") -> dict[str, dict]:
    """Each measurement's median run, every run's seconds beside it, and its ratio to the numpy path; printed."""
    out = {}
    for name, measured in runs.items():
        ordered = sorted(measured, key=lambda m: m["seconds"])
        out[name] = {**ordered[len(ordered) // 2], "runs_seconds": [m["seconds"] for m in measured]}
    base_fit, base_predict = out["fit numpy"]["seconds"], out["predict numpy"]["seconds"]
    for name, run in out.items():
        base = base_fit if name.startswith("fit") else base_predict  # the scan: a floor, against predict
        run["ratio"] = run["seconds"] / base
        extra = f", accuracy {run['accuracy']:.3f}, driver peak {run['driver_peak_rss_mb']:.0f} MB" if "accuracy" in run else ""
        print(f"{label}{name:24s} {run['seconds']:7.2f} s  {run['ratio']:5.2f}x{extra}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--vector", action="store_true", help="also fit from a VectorAssembler column")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each measurement; the median is reported")
    parser.add_argument("--base", help="another checkout of elephant, measured side by side ('base')")
    parser.add_argument("--base-label", default="", help="what the results call the base (its commit, say)")
    parser.add_argument("--tag", default="")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(measure(args)), flush=True)
        return

    results = {"rows": args.rows, "workers": args.workers, "batch_size": args.batch_size,
               "machine": platform.platform(), "cpus": os.cpu_count()}
    if not args.base:
        results["runs"] = summary(measure(args)["runs"])
    else:  # a process per checkout and repeat, alternating, each measuring every path once
        checkouts = {"base": os.path.abspath(args.base), "this": str(ROOT)}
        argv = ["--rows", str(args.rows), "--workers", str(args.workers), "--batch-size", str(args.batch_size),
                "--repeats", "1"] + (["--vector"] if args.vector else [])
        runs: dict[str, dict[str, list[dict]]] = {label: {} for label in checkouts}
        for _ in range(args.repeats):
            for label, path in checkouts.items():
                child = run_child(__file__, path, argv)
                imported = {child["elephant"], child["task_elephant"]}
                if imported != {os.path.join(path, "elephant")}:
                    raise SystemExit(f"the {label} measurement imported elephant from {sorted(imported)}, not {path}")
                for name, measured in child["runs"].items():
                    runs[label].setdefault(name, []).extend(measured)
        results["base"] = args.base_label or os.path.basename(checkouts["base"].rstrip(os.sep))
        results["checkouts"] = {label: {"runs": summary(runs[label], f"{label}: ")} for label in checkouts}
        this, base = (results["checkouts"][label]["runs"] for label in ("this", "base"))
        results["this_over_base"] = {name: this[name]["seconds"] / base[name]["seconds"] for name in this if name in base}
        for name, ratio in results["this_over_base"].items():
            print(f"this / base  {name:24s} {ratio:5.2f}x", flush=True)
    if "runs" in results:
        results["rows_per_s_predict"] = {k: args.rows / v["seconds"] for k, v in results["runs"].items()
                                         if k.startswith("predict")}
    out = Path(__file__).parent / "results" / f"dataframe{'_' + args.tag if args.tag else ''}.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
