"""Every registered distributed optimizer on one generated task, with 2, 4 and 8 workers.

A fixed, seeded, generated workload (no downloads): ``sklearn.datasets.make_classification``
with 20 features (10 informative, 5 redundant), 5 classes of 2 clusters each and 1 % label
noise, ``random_state=0``; 16 000 training and 4 000 held-out test samples, standardised
with the training statistics. Model: a 20-64-32-5 ReLU MLP, the same seeded initial weights
for every run, batch size 32.

Each algorithm runs in ``"synchronous"`` mode if it declares it, else ``"asynchronous"``,
with the frequency and local Keras optimizer that the integration tests use
(``tests/integration/test_optimizers_spark.py``). Per run we record the test accuracy after
every epoch (``validation_data`` is evaluated on the driver), the fit's wall time, the
commits applied and, for asynchronous runs, the mean staleness. A single-process
``model.fit`` with the same model, data and epochs is reported as a reference.

Spark runs as ``local[8]``: synchronous mode runs barrier stages, which need every worker in
a task slot at once, so 8 workers need 8 slots, whatever the core count (on a 2-core
machine the 8 slots share 2 cores; the benchmark measures the algorithms, not speed-up).

Run::

    python benchmarks/optimizers.py                 # full grid (~15 min on 2 cores)
    python benchmarks/optimizers.py --quick         # 2 epochs, 5 000 samples, 2 workers
    python benchmarks/optimizers.py --epochs 3 --algorithms downpour,easgd --workers 2 4

The full default grid writes ``benchmarks/results/optimizers.json`` and ``.png`` and the
table in ``benchmarks/README.md``; any smaller run writes ``results/optimizers_quick.*``
(or ``--out PREFIX``) and leaves the README alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import sys
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
README = os.path.join(HERE, "README.md")
BEGIN, END = "<!-- optimizers:begin -->", "<!-- optimizers:end -->"

DEFAULTS = {"epochs": 5, "samples": 16_000, "test_samples": 4_000, "workers": [2, 4, 8], "batch_size": 32, "slots": 8}

# name -> (frequency, (local optimizer, learning rate)): the integration tests' settings,
# except DC-ASGD. Normalising rules (AGN, ADAG) commit one *average* step per window, so
# they get a short window and a larger learning rate; DC-ASGD recovers gradients from deltas,
# which is exact only with plain SGD and window 1 (its `learning_rate` must equal the SGD
# one; the integration test uses Adam, where the compensation is approximate, because plain
# SGD varied more across runs on digits); EAMSGD's momentum is the local Nesterov SGD.
# A rule with no entry runs with its own default window and DEFAULT_SETTINGS' optimizer.
SETTINGS = {
    "modelaveraging": (8, ("adam", 3e-3)),
    "easgd": (8, ("adam", 3e-3)),
    "downpour": (5, ("adam", 1e-3)),
    "dynsgd": (5, ("adam", 2e-3)),
    "agn": (2, ("adam", 5e-3)),
    "adag": (2, ("adam", 5e-3)),
    "aeasgd": (8, ("adam", 3e-3)),
    "eamsgd": (8, ("nesterov", 0.05)),
    "dcasgd": ("batch", ("sgd", 0.1)),
}
DEFAULT_SETTINGS = (None, ("adam", 2e-3))
BASELINE_LOCAL = ("adam", 1e-3)


def make_data(samples: int, test_samples: int):
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=samples + test_samples, n_features=20, n_informative=10,
                               n_redundant=5, n_classes=5, n_clusters_per_class=2, class_sep=1.0,
                               flip_y=0.01, random_state=0)
    x = x.astype(np.float32)
    y = y.astype(np.int64)
    x_train, y_train, x_test, y_test = x[:samples], y[:samples], x[samples:], y[samples:]
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    return (x_train - mean) / std, y_train, (x_test - mean) / std, y_test


def local_optimizer(local):
    import keras

    kind, lr = local
    if kind == "adam":
        return keras.optimizers.Adam(lr)
    if kind == "nesterov":
        return keras.optimizers.SGD(lr, momentum=0.9, nesterov=True)
    return keras.optimizers.SGD(lr)


def build_model(local):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((20,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(5, activation="softmax"),
    ])
    model.compile(local_optimizer(local), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def describe_local(local) -> str:
    kind, lr = local
    return {"adam": f"Adam {lr:g}", "nesterov": f"SGD {lr:g} nesterov 0.9", "sgd": f"SGD {lr:g}"}[kind]


def _epoch_timer():
    import keras

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self._t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self._t0)

    return EpochTimer()


def _floats(values) -> list[float | None]:
    return [None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v) for v in values]


def run_one(name: str, workers: int, spark, data, epochs: int, batch_size: int) -> dict:
    from elephant import SparkModel
    from elephant import optimizers as O

    x_train, y_train, x_test, y_test = data
    frequency, local = SETTINGS.get(name, DEFAULT_SETTINGS)
    optimizer = O.get(name, learning_rate=local[1]) if name == "dcasgd" else O.get(name)
    mode = "synchronous" if "synchronous" in optimizer.modes else "asynchronous"
    row = {"algorithm": name, "workers": workers, "mode": mode, "frequency": frequency,
           "local_optimizer": describe_local(local)}
    timer = _epoch_timer()
    sm = SparkModel(build_model(local), mode=mode, frequency=frequency, optimizer=optimizer,
                    num_workers=workers, spark=spark)
    row["window"] = sm.window
    t0 = time.perf_counter()
    try:
        history = sm.fit(x_train, y_train, epochs=epochs, batch_size=batch_size,
                         validation_data=(x_test, y_test), callbacks=[timer], verbose=0)
    except Exception as exc:  # noqa: BLE001 - one failed run must not lose the others
        row.update(seconds=time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
        return row
    seconds = time.perf_counter() - t0
    h = history.history
    metrics = sm.last_metrics or {}
    row.update(
        seconds=seconds,
        epoch_seconds=timer.seconds,
        val_accuracy=_floats(h.get("val_accuracy", [])),
        val_loss=_floats(h.get("val_loss", [])),
        train_loss=_floats(h.get("loss", [])),
        train_accuracy=_floats(h.get("accuracy", [])),
        final_accuracy=float(h["val_accuracy"][-1]),
        commits_applied=metrics.get("commits_applied"),
        rounds_applied=metrics.get("rounds_applied"),
    )
    if mode != "synchronous":
        row["staleness_per_epoch"] = _floats(h.get("staleness", []))
        row["staleness_mean"] = metrics.get("staleness_mean")
        row["staleness_max"] = metrics.get("staleness_max")
    return row


def run_baseline(data, epochs: int, batch_size: int) -> dict:
    x_train, y_train, x_test, y_test = data
    model = build_model(BASELINE_LOCAL)
    t0 = time.perf_counter()
    h = model.fit(x_train, y_train, epochs=epochs, batch_size=batch_size, validation_data=(x_test, y_test),
                  verbose=0).history
    return {"algorithm": "plain keras (1 process)", "local_optimizer": describe_local(BASELINE_LOCAL),
            "seconds": time.perf_counter() - t0, "val_accuracy": _floats(h["val_accuracy"]),
            "val_loss": _floats(h["val_loss"]), "final_accuracy": float(h["val_accuracy"][-1])}


# --------------------------------------------------------------------- table
def _cell(row, key, fmt):
    if row is None:
        return "–"
    if "error" in row:
        return "failed"
    value = row.get(key)
    return "–" if value is None else format(value, fmt)


def table_lines(rows: list[dict], workers: list[int], markdown: bool) -> list[str]:
    by = {(r["algorithm"], r["workers"]): r for r in rows}
    names = list(dict.fromkeys(r["algorithm"] for r in rows))
    head = ["algorithm", "mode", "window", "local optimizer"]
    for w in workers:
        head += [f"acc @{w}", f"s @{w}", f"τ̄ @{w}"]
    body = []
    for name in names:
        first = next(r for r in rows if r["algorithm"] == name)
        window = first.get("window")
        mode = "sync" if first["mode"] == "synchronous" else "async"
        cells = [name, mode, "epoch" if window is None else str(window), first["local_optimizer"]]
        for w in workers:
            r = by.get((name, w))
            cells += [_cell(r, "final_accuracy", ".3f"), _cell(r, "seconds", ".1f"),
                      _cell(r, "staleness_mean", ".2f") if r is None or r.get("mode") != "synchronous" else "–"]
        body.append(cells)
    if markdown:
        align = ["---"] * 4 + ["---:"] * (3 * len(workers))
        return ["| " + " | ".join(c) + " |" for c in [head, align] + body]
    widths = [max(len(str(x[i])) for x in [head] + body) for i in range(len(head))]

    def fmt(cells):
        return "  ".join(str(c).ljust(wd) if i < 4 else str(c).rjust(wd) for i, (c, wd) in enumerate(zip(cells, widths)))

    return [fmt(head), fmt(["-" * wd for wd in widths])] + [fmt(c) for c in body]


def update_readme(meta: dict, rows: list[dict], baseline: dict | None, json_name: str, png_name: str) -> None:
    m = meta["machine"]
    lines = [
        BEGIN,
        (f"Measured {meta['date']} on {m['cpus']} CPU cores (`os.cpu_count()`), {m['platform']}, "
         f"Python {m['python']}, Spark `{meta['spark_master']}` ({meta['slots']} task slots on "
         f"{m['cpus']} cores: synchronous barrier stages need `num_workers` ≤ slots). Other processes "
         "may have been running; wall times are indicative."),
        "",
        (f"{meta['train_samples']} training / {meta['test_samples']} test samples, {meta['epochs']} epochs, "
         f"batch {meta['batch_size']}; full run {meta['total_seconds'] / 60:.1f} min "
         f"(worker warm-up {meta['warmup_seconds']:.1f} s, not in the per-run times). "
         "`acc` = test accuracy after the last epoch, `s` = wall seconds of the whole `fit` "
         "(including per-epoch validation on the driver), `τ̄` = mean staleness of the applied "
         "commits (asynchronous modes only)."),
        "",
        *table_lines(rows, meta["workers"], markdown=True),
        "",
    ]
    if baseline:
        lines.append(f"Reference: plain Keras `model.fit` in one process ({baseline['local_optimizer']}), "
                     f"test accuracy {baseline['final_accuracy']:.3f} in {baseline['seconds']:.1f} s.")
        lines.append("")
    lines += [f"![optimizers](results/{png_name})", "", f"Raw figures: [results/{json_name}](results/{json_name}).",
              END]
    block = "\n".join(lines)
    text = ""
    if os.path.exists(README):
        with open(README) as f:
            text = f.read()
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.DOTALL)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    with open(README, "w") as f:
        f.write(text)


# ---------------------------------------------------------------------- plot
def plot(rows: list[dict], baseline: dict | None, workers: list[int], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["algorithm"] for r in rows))
    colors = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}
    fig = plt.figure(figsize=(5 * len(workers), 8.5))
    grid = fig.add_gridspec(2, len(workers), height_ratios=[1.25, 1])
    top = [fig.add_subplot(grid[0, i]) for i in range(len(workers))]
    for ax in top[1:]:
        ax.sharey(top[0])
    for ax, w in zip(top, workers):
        for r in rows:
            if r["workers"] != w or not r.get("val_accuracy"):
                continue
            sync = r["mode"] == "synchronous"
            ax.plot(range(1, len(r["val_accuracy"]) + 1), r["val_accuracy"], marker="s" if sync else "o", ms=4,
                    ls="-" if sync else "--", color=colors[r["algorithm"]],
                    label=r["algorithm"])
        if baseline:
            ax.plot(range(1, len(baseline["val_accuracy"]) + 1), baseline["val_accuracy"], color="k", lw=1.5,
                    ls=":", label="plain keras")
        ax.set_title(f"{w} workers")
        ax.set_xlabel("epoch")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    top[0].set_ylabel("test accuracy")
    top[-1].legend(fontsize=8, loc="lower right")
    bars = fig.add_subplot(grid[1, :])
    width = 0.8 / len(workers)
    for i, w in enumerate(workers):
        xs, ys = [], []
        for j, n in enumerate(names):
            r = next((r for r in rows if r["algorithm"] == n and r["workers"] == w and "error" not in r), None)
            if r is not None:
                xs.append(j + (i - (len(workers) - 1) / 2) * width)
                ys.append(r["seconds"])
        bars.bar(xs, ys, width, label=f"{w} workers")
    if baseline:
        bars.axhline(baseline["seconds"], color="k", ls=":", lw=1, label="plain keras")
    bars.set_xticks(range(len(names)), names)
    bars.set_ylabel("wall seconds per fit")
    bars.legend(fontsize=8)
    bars.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------- main
def main() -> None:
    from elephant import optimizers as O

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=DEFAULTS["epochs"])
    parser.add_argument("--samples", type=int, default=DEFAULTS["samples"], help="training samples")
    parser.add_argument("--test-samples", type=int, default=DEFAULTS["test_samples"])
    parser.add_argument("--workers", type=int, nargs="+", default=DEFAULTS["workers"])
    parser.add_argument("--algorithms", default=None,
                        help=f"comma-separated subset of {','.join(O.registered_names())}")
    parser.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"])
    parser.add_argument("--slots", type=int, default=DEFAULTS["slots"], help="Spark master local[N]")
    parser.add_argument("--quick", action="store_true", help="2 epochs, 5000 samples, 2 workers")
    parser.add_argument("--no-baseline", action="store_true", help="skip the plain Keras reference")
    parser.add_argument("--out", default=None, help="output path prefix (without .json/.png)")
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.samples, args.workers = 2, 5_000, [2]

    names = list(O.registered_names())
    for name in sorted(set(names) - set(SETTINGS)):
        print(f"{name}: no entry in SETTINGS; running it with its default window and {DEFAULT_SETTINGS[1]}")
    if args.algorithms:
        wanted = [a.strip() for a in args.algorithms.split(",") if a.strip()]
        unknown = set(wanted) - set(names)
        if unknown:
            raise SystemExit(f"unknown algorithm(s) {sorted(unknown)}; registered: {names}")
        names = [n for n in names if n in wanted]
    full = (names == list(O.registered_names()) and args.epochs == DEFAULTS["epochs"]
            and args.samples == DEFAULTS["samples"] and args.test_samples == DEFAULTS["test_samples"]
            and args.workers == DEFAULTS["workers"] and args.batch_size == DEFAULTS["batch_size"]
            and args.slots == DEFAULTS["slots"] and not args.no_baseline)
    prefix = args.out or os.path.join(RESULTS, "optimizers" if full else "optimizers_quick")
    too_many = [w for w in args.workers if w > args.slots]
    if too_many:
        print(f"note: synchronous runs with {too_many} workers exceed local[{args.slots}] and will be skipped")

    from pyspark.sql import SparkSession

    from elephant import SparkModel

    start = time.perf_counter()
    data = make_data(args.samples, args.test_samples)
    master = f"local[{args.slots}]"
    spark = (SparkSession.builder.master(master).appName("elephant-bench-optimizers")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.ui.showConsoleProgress", "false")
             .config("spark.python.worker.reuse", "true")
             .config("spark.python.daemon.module", "elephant.daemon").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    cpus = os.cpu_count()
    print(f"Spark {master}: {args.slots} task slots on {cpus} CPU cores ({platform.platform()}); "
          f"{args.samples} train / {args.test_samples} test samples, {args.epochs} epochs, batch {args.batch_size}")

    # Warm-up: start every Python worker and build a model there once (reported separately).
    t0 = time.perf_counter()
    warm_workers = min(max(args.workers), args.slots)
    SparkModel(build_model(BASELINE_LOCAL), num_workers=warm_workers, spark=spark, frequency="epoch",
               optimizer="dynsgd").fit(data[0][:4000], data[1][:4000], epochs=1, batch_size=args.batch_size, verbose=0)
    warmup = time.perf_counter() - t0
    print(f"worker warm-up {warmup:.1f}s (not included)")

    initial = float(build_model(BASELINE_LOCAL).evaluate(data[2], data[3], verbose=0, return_dict=True)["accuracy"])
    baseline = None
    if not args.no_baseline:
        baseline = run_baseline(data, args.epochs, args.batch_size)
        print(f"plain keras: acc {baseline['final_accuracy']:.3f}  {baseline['seconds']:.1f}s")

    rows = []
    for workers in args.workers:
        for name in names:
            if "synchronous" in O.get(name).modes and workers > args.slots:
                continue
            row = run_one(name, workers, spark, data, args.epochs, args.batch_size)
            rows.append(row)
            tau = row.get("staleness_mean")
            print(f"{name:>15} x{workers}: " + (f"FAILED {row['error']}" if "error" in row else
                  f"acc {row['final_accuracy']:.3f}  {row['seconds']:6.1f}s  commits {row['commits_applied']}"
                  + (f"  staleness {tau:.2f}" if tau is not None else "")), flush=True)
    spark.stop()
    total = time.perf_counter() - start

    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "task": "make_classification(n_features=20, n_informative=10, n_redundant=5, n_classes=5, "
                "n_clusters_per_class=2, class_sep=1.0, flip_y=0.01, random_state=0), standardised",
        "model": "Dense 64 relu - Dense 32 relu - Dense 5 softmax, keras.utils.set_random_seed(0)",
        "train_samples": args.samples, "test_samples": args.test_samples, "epochs": args.epochs,
        "batch_size": args.batch_size, "workers": args.workers, "algorithms": names,
        "spark_master": master, "slots": args.slots, "warmup_seconds": warmup, "total_seconds": total,
        "initial_accuracy": initial,
        "machine": {"cpus": cpus, "python": platform.python_version(), "platform": platform.platform(),
                    "processor": platform.processor() or platform.machine()},
        "settings": {n: {"frequency": SETTINGS.get(n, DEFAULT_SETTINGS)[0],
                         "local_optimizer": describe_local(SETTINGS.get(n, DEFAULT_SETTINGS)[1])}
                     for n in names},
    }
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    with open(prefix + ".json", "w") as f:
        json.dump({"meta": meta, "baseline": baseline, "results": rows}, f, indent=2)
    plot(rows, baseline, list(args.workers), prefix + ".png")

    print(f"\n{master} ({args.slots} task slots on {cpus} cores), {args.samples} samples x {args.epochs} epochs, "
          f"batch {args.batch_size}; acc = final test accuracy, s = wall seconds, τ̄ = mean staleness (async)")
    for line in table_lines(rows, args.workers, markdown=False):
        print(line)
    if baseline:
        print(f"plain keras (1 process): acc {baseline['final_accuracy']:.3f}, {baseline['seconds']:.1f}s")
    print(f"total {total / 60:.1f} min; wrote {prefix}.json and {prefix}.png")
    if full:
        update_readme(meta, rows, baseline, os.path.basename(prefix) + ".json", os.path.basename(prefix) + ".png")
        print(f"updated {README}")
    else:
        print("partial grid: README not updated")


if __name__ == "__main__":
    main()
