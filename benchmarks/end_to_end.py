"""End to end: plain Keras ``model.fit`` vs elephant on local Spark, same cores, one run.

A fixed, seeded, generated workload: 1-D signals (length 64) in 4 classes that differ in
frequency and phase structure, under noise; a small Conv1D net. Every configuration
trains the same architecture from the same initial weights for the same epochs; we
report wall time, samples per second, test accuracy and the ratio to plain Keras.

Run:  python benchmarks/end_to_end.py [--samples 100000] [--epochs 3] [--workers 2]
Writes benchmarks/results/end_to_end.json and .png (``--output STEM`` other names). Keras'
backend is the process's (``KERAS_BACKEND``); the fit gives the executors the same one.
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

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

CONFIGS = [
    ("synchronous (default)", dict(mode="synchronous")),
    ("asynchronous (default)", dict(mode="asynchronous")),
    ("hogwild (default)", dict(mode="hogwild")),
    ("synchronous/epoch", dict(mode="synchronous", frequency="epoch")),
    ("asynchronous/epoch", dict(mode="asynchronous", frequency="epoch")),
    ("asynchronous/window 8", dict(mode="asynchronous", frequency=8)),
    ("asynchronous/window 5", dict(mode="asynchronous", frequency=5)),
    ("asynchronous/batch", dict(mode="asynchronous", frequency="batch")),
    # the same with commits overlapping training (SparkModel(overlap=True))
    ("synchronous (default), overlap", dict(mode="synchronous", overlap=True)),
    ("hogwild, overlap", dict(mode="hogwild", overlap=True)),
    ("asynchronous/window 8, overlap", dict(mode="asynchronous", frequency=8, overlap=True)),
    ("asynchronous/window 5, overlap", dict(mode="asynchronous", frequency=5, overlap=True)),
    ("asynchronous/batch, overlap", dict(mode="asynchronous", frequency="batch", overlap=True)),
]


def make_signals(n: int, length: int = 64, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, size=n)
    t = np.linspace(0.0, 1.0, length, dtype=np.float32)
    freq = np.array([3.0, 5.0, 7.0, 9.0], dtype=np.float32)[y] + rng.normal(0, 0.4, n).astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi, n).astype(np.float32)
    x = np.sin(2 * np.pi * freq[:, None] * t[None, :] + phase[:, None])
    x += rng.normal(0, 0.8, size=x.shape).astype(np.float32)
    return x[..., None].astype(np.float32), y.astype(np.int64)


def build_model(length: int = 64):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((length, 1)),
        keras.layers.Conv1D(16, 7, activation="relu"),
        keras.layers.MaxPooling1D(2),
        keras.layers.Conv1D(16, 5, activation="relu"),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(4, activation="softmax"),
    ])
    model.compile(keras.optimizers.Adam(2e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def accuracy(model, x, y) -> float:
    return float(np.mean(np.argmax(model.predict(x, batch_size=1024, verbose=0), axis=1) == y))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--only", default=None, help="comma-separated config names to run")
    parser.add_argument("--output", default="end_to_end", help="file stem of the results under benchmarks/results")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    from elephant import SparkModel

    x, y = make_signals(args.samples + 10_000)
    x_train, y_train, x_test, y_test = x[:args.samples], y[:args.samples], x[args.samples:], y[args.samples:]
    spark = (SparkSession.builder.master(f"local[{args.workers}]").appName("elephant-bench")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.ui.showConsoleProgress", "false")
             .config("spark.python.daemon.module", "elephant.daemon").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    # Warm-up: start the Python workers and import TensorFlow there once (reported separately).
    t0 = time.perf_counter()
    SparkModel(build_model(), num_workers=args.workers, spark=spark, frequency="epoch").fit(
        x_train[:2000], y_train[:2000], epochs=1, batch_size=args.batch_size, verbose=0)
    warmup = time.perf_counter() - t0

    rows = []
    model = build_model()
    t0 = time.perf_counter()
    model.fit(x_train, y_train, epochs=args.epochs, batch_size=args.batch_size, verbose=0)
    plain = time.perf_counter() - t0
    rows.append({"name": "plain keras", "seconds": plain, "accuracy": accuracy(model, x_test, y_test)})

    wanted = set(args.only.split(",")) if args.only else None
    for name, kwargs in CONFIGS:
        if wanted and name not in wanted:
            continue
        sm = SparkModel(build_model(), num_workers=args.workers, spark=spark, **kwargs)
        t0 = time.perf_counter()
        sm.fit(x_train, y_train, epochs=args.epochs, batch_size=args.batch_size, verbose=0)
        seconds = time.perf_counter() - t0
        rows.append({"name": name, "seconds": seconds, "accuracy": accuracy(sm.model, x_test, y_test),
                     "commits": sm.last_metrics.get("commits_applied"), "rounds": sm.last_metrics.get("rounds_applied"),
                     "worker_batch_size": (sm.fit_plan or {}).get("worker_batch_size")})
    for r in rows:
        r["samples_per_second"] = args.samples * args.epochs / r["seconds"]
        r["ratio_to_plain"] = r["seconds"] / plain
        r["accuracy_delta_pp"] = 100 * (r["accuracy"] - rows[0]["accuracy"])

    print(f"\n{args.samples} samples x {args.epochs} epochs, batch {args.batch_size}, {args.workers} workers "
          f"(worker warm-up {warmup:.1f}s, not included)")
    print(f"{'configuration':<32}{'seconds':>9}{'samples/s':>11}{'accuracy':>10}{'x plain':>9}{'Δacc pp':>9}")
    for r in rows:
        print(f"{r['name']:<32}{r['seconds']:>9.1f}{r['samples_per_second']:>11.0f}{r['accuracy']:>10.4f}"
              f"{r['ratio_to_plain']:>9.2f}{r['accuracy_delta_pp']:>9.2f}")
    os.makedirs(RESULTS, exist_ok=True)
    import keras

    meta = {"keras_backend": keras.config.backend(), "samples": args.samples, "epochs": args.epochs, "workers": args.workers, "batch_size": args.batch_size,
            "warmup_seconds": warmup, "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                                   "platform": platform.platform()}}
    with open(os.path.join(RESULTS, f"{args.output}.json"), "w") as f:
        json.dump({"meta": meta, "results": rows}, f, indent=2)
    _plot(rows, os.path.join(RESULTS, f"{args.output}.png"))
    spark.stop()


def _plot(rows, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    names = [r["name"] for r in rows]
    a1.barh(names, [r["ratio_to_plain"] for r in rows], color="tab:blue")
    a1.axvline(1.0, color="k", lw=0.8)
    a1.set_xlabel("wall time / plain keras")
    a2.barh(names, [r["accuracy"] for r in rows], color="tab:green")
    a2.set_xlim(min(r["accuracy"] for r in rows) - 0.05, 1.0)
    a2.set_xlabel("test accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
