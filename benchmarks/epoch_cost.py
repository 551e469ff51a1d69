"""Where a tiny fit's epoch goes: the driver before the job, Spark, the worker, the driver after it.

The workload is the sweep's (``benchmarks/sweeps.py``): scikit-learn's digits, a
stratified 75/25 split whose 25 % is ``validation_data``, a one-hidden-layer MLP
(64 units, Adam), ``batch_size=32``. On one ``local[2]`` session (loopback, UI
off, TensorFlow at one thread per process), after a warm-up fit, it runs
``SparkModel(num_workers=W, frequency="epoch").fit(..., epochs=E)`` for W = 1
and 2 (each fit at another learning rate, 2e-3 and 3e-3, as a sweep's trials),
and a plain Keras ``fit`` of the same model on the same data with the same
validation, timing every epoch. Each elephant epoch is split as:

* ``before job``: the epoch's first callback to the job's start (learning rate,
  ``TaskSpec``, the progress thread);
* ``launch``: the job's start to the first task entering ``run_partition``
  (Spark's scheduling, the closure's pickling, task launch, the PS client);
* ``worker``: first ``run_partition`` start to last end, itself split (slowest
  partition) into ``setup`` (replica from the cache, threads), ``pull``,
  ``train`` (the steps) and ``commit`` (time blocked on the server);
* ``return``: the last task's end to ``collect()`` returning on the driver;
* ``after job``: to the validation pass (logs, window re-check, center into the model);
* ``validation``: the driver's ``model.evaluate``;
* ``callbacks``: to the epoch's last callback (metrics, staleness, callbacks);
* ``to next``: from there to the next epoch's first callback.

The worker's bounds come from the ``started_at``/``ended_at`` its partition
stats carry (wall clocks, one machine). Where the driver's validation overlaps
the next epoch (a fit as one job, ``fit_plan["validation_overlap"]``), that
epoch's tasks start before the driver reaches its job: its ``launch`` is
negative by as much. The first epoch (tracing) is left out
of the medians; ``fit start`` and ``fit end`` are the call to the first epoch
and the last epoch to the return. With ``--profile`` one more fit runs under
cProfile on the driver's thread and its top functions are printed.

``--base DIR`` runs the same measurement on another checkout of elephant
(e.g. ``git archive <commit> | tar -x -C DIR``), alternating with this one, each
in its own process and session, so that both are measured under the same load.

Usage::

    python benchmarks/epoch_cost.py [--epochs 8] [--repeats 2] [--base DIR | --job-per-epoch] [--profile]
        [--units 64] [--backend tensorflow|jax|torch]

Writes ``benchmarks/results/epoch_cost.json`` (``--output`` names another stem).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from checkouts import run_child  # noqa: E402


def shown(path: str) -> str:
    """A path as the results show it: relative to the checkout or to site-packages, never the machine's."""
    if path.startswith(ROOT):
        return os.path.relpath(path, ROOT)
    if "site-packages" in path:
        return path[path.index("site-packages"):]
    if "/lib/python" in path:  # the standard library
        return path[path.index("/lib/python") + len("/lib/"):]
    if "/elephant/" in path:  # another checkout's package (--base)
        return path[path.index("/elephant/") + 1:]
    return os.path.basename(path.rstrip(os.sep)) or path
RESULTS = os.path.join(HERE, "results")
PARTS = ("before job", "launch", "worker", "return", "after job", "validation", "callbacks", "to next")
WORKER_PARTS = ("setup", "pull", "train", "commit")


def _thread_env() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")


def build(units: int = 64, lr: float = 1e-3):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(units, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(lr), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def digits_split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    return train_test_split((x / 16.0).astype("float32"), y, test_size=0.25, random_state=0, stratify=y)


class Probe:
    """Wall-clock marks of each epoch of one fit, from callbacks and wrappers around the fit's own steps."""

    def __init__(self):
        self.epochs: dict[int, dict] = {}
        self.current = -1

    def mark(self, name: str, epoch: int | None = None) -> None:
        epoch = self.current if epoch is None else epoch
        self.epochs.setdefault(epoch, {})[name] = time.time()

    def callbacks(self):
        import keras

        probe = self

        class First(keras.callbacks.Callback):
            probe = True

            def on_epoch_begin(self, epoch, logs=None):
                probe.current = epoch
                probe.mark("begin", epoch)

        class Last(keras.callbacks.Callback):
            probe = True

            def on_epoch_end(self, epoch, logs=None):
                probe.mark("end", epoch)

        return First(), Last()


def install(probe: Probe):
    """Wrap the fit's job and ``Model.evaluate`` so that they mark ``probe``; returns the undo."""
    import keras

    import elephant.fit.loop as loop

    run_epoch, evaluate = loop.run_epoch, keras.Model.evaluate

    def timed_run_epoch(*args, **kwargs):
        probe.mark("job_start")
        results = run_epoch(*args, **kwargs)
        probe.mark("job_end")
        probe.epochs[probe.current]["stats"] = results
        return results

    def timed_evaluate(self, *args, **kwargs):
        probe.mark("eval_start")
        try:
            return evaluate(self, *args, **kwargs)
        finally:
            probe.mark("eval_end")

    loop.run_epoch, keras.Model.evaluate = timed_run_epoch, timed_evaluate
    overlaps = getattr(loop, "overlaps_validation", None)  # a checkout before the validation's overlap has none
    if overlaps is not None:  # the probe's own callbacks only read the clock: they leave the overlap as it would be
        loop.overlaps_validation = lambda callbacks, *a, **k: overlaps(
            [c for c in callbacks or () if not getattr(c, "probe", False)], *a, **k)

    def undo():
        loop.run_epoch, keras.Model.evaluate = run_epoch, evaluate
        if overlaps is not None:
            loop.overlaps_validation = overlaps

    return undo


def breakdown(marks: dict, next_begin: float) -> dict[str, float]:
    """One epoch's parts in seconds (see the module's docstring) from its marks."""
    stats = marks["stats"]
    first = min(s["started_at"] for s in stats)
    last = max(s["ended_at"] for s in stats)
    slow = max(stats, key=lambda s: s.get("seconds", 0.0))
    setup, pull, comm = slow.get("setup_seconds", 0.0), slow.get("pull_seconds", 0.0), slow.get("comm_seconds", 0.0)
    eval_start, eval_end = marks.get("eval_start", marks["job_end"]), marks.get("eval_end", marks["job_end"])
    row = {
        "before job": marks["job_start"] - marks["begin"], "launch": first - marks["job_start"],
        "worker": last - first, "return": marks["job_end"] - last, "after job": eval_start - marks["job_end"],
        "validation": eval_end - eval_start, "callbacks": marks["end"] - eval_end, "to next": next_begin - marks["end"],
        "setup": setup, "pull": pull, "train": slow["seconds"] - setup - pull - comm, "commit": comm,
    }
    row["total"] = next_begin - marks["begin"]
    return row


def timed_fit(spark, data, workers: int, epochs: int, batch_size: int, lr: float = 1e-3, units: int = 64) -> dict:
    from elephant import SparkModel

    x_train, x_val, y_train, y_val = data
    probe = Probe()
    undo = install(probe)
    try:
        sm = SparkModel(build(units, lr=lr), num_workers=workers, frequency="epoch", spark=spark)
        t_call = time.time()
        sm.fit(x_train, y_train, epochs=epochs, batch_size=batch_size, validation_data=(x_val, y_val),
               verbose=0, callbacks=list(probe.callbacks()))
        t_return = time.time()
    finally:
        undo()
    begins = [probe.epochs[e]["begin"] for e in range(epochs)] + [t_return]
    rows = [breakdown(probe.epochs[e], begins[e + 1]) for e in range(epochs)]
    return {"workers": workers, "lr": lr, "epochs": rows, "fit_start": begins[0] - t_call,
            "fit_end": t_return - probe.epochs[epochs - 1]["end"], "fit_seconds": t_return - t_call}


def plain_keras(data, epochs: int, batch_size: int, units: int = 64) -> list[float]:
    import keras

    x_train, x_val, y_train, y_val = data
    marks: list[float] = []

    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            marks.append(time.time())

    model = build(units)
    model.fit(x_train, y_train, epochs=epochs, batch_size=batch_size, validation_data=(x_val, y_val), verbose=0,
              callbacks=[Clock()])
    marks.append(time.time())
    return [b - a for a, b in zip(marks, marks[1:])]


def profile_fit(spark, data, workers: int, epochs: int, batch_size: int, top: int = 25) -> list[dict]:
    """The driver thread's top functions (by cumulative time) over one fit under cProfile."""
    import cProfile
    import pstats

    from elephant import SparkModel

    x_train, x_val, y_train, y_val = data
    sm = SparkModel(build(), num_workers=workers, frequency="epoch", spark=spark)
    profiler = cProfile.Profile()
    profiler.enable()
    sm.fit(x_train, y_train, epochs=epochs, batch_size=batch_size, validation_data=(x_val, y_val), verbose=0)
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = []
    for (path, line, name), (_, calls, tottime, cumtime, _) in stats.stats.items():
        rows.append({"function": f"{shown(path)}:{line}({name})",
                     "calls": calls, "tottime": tottime, "cumtime": cumtime})
    rows.sort(key=lambda r: -r["cumtime"])
    return rows[:top]


def child(args) -> dict:
    """One process's measurements (this checkout's elephant, or ``--base``'s via PYTHONPATH)."""
    _thread_env()
    import elephant
    from elephant.session import local_session

    if args.job_per_epoch:  # every epoch a Spark job of its own, as before a fit's epochs ran as one job
        from elephant.fit import resident

        resident.ONE_JOB = False

    spark = local_session("local[2]", "elephant-bench-epoch-cost")
    spark.sparkContext.setLogLevel("ERROR")
    data = digits_split()
    timed_fit(spark, data, 2, 2, args.batch_size, units=args.units)  # warm-up: both Python workers, the replicas, the driver's traces
    out = {"elephant": shown(os.path.dirname(os.path.dirname(elephant.__file__))), "load_at_start": os.getloadavg(),
           "keras_epochs": plain_keras(data, args.epochs, args.batch_size, args.units), "fits": [],
           "backend": os.environ.get("KERAS_BACKEND", "tensorflow")}
    for i, workers in enumerate(args.workers):  # each fit at its own learning rate, as the trials of a sweep
        out["fits"].append(timed_fit(spark, data, workers, args.epochs, args.batch_size, lr=1e-3 * (2 + i),
                                     units=args.units))
    if args.profile:
        out["profile"] = profile_fit(spark, data, 1, args.epochs, args.batch_size)
    out["load_at_end"] = os.getloadavg()
    spark.stop()
    return out


def summarise(runs: list[dict]) -> dict:
    """Median seconds of each part over the steady epochs (all but the first) of every run, per worker count."""
    summary: dict = {"keras epoch": statistics.median(s for r in runs for s in r["keras_epochs"][1:])}
    for workers in sorted({f["workers"] for r in runs for f in r["fits"]}):
        fits = [f for r in runs for f in r["fits"] if f["workers"] == workers]
        epochs = [row for f in fits for row in f["epochs"][1:]]
        entry = {part: statistics.median(row[part] for row in epochs) for part in (*PARTS, *WORKER_PARTS, "total")}
        entry["first epoch"] = {part: statistics.median(f["epochs"][0][part] for f in fits)
                                for part in (*PARTS, *WORKER_PARTS, "total")}
        entry["fit start"] = statistics.median(f["fit_start"] for f in fits)
        entry["fit end"] = statistics.median(f["fit_end"] for f in fits)
        summary[f"{workers} workers"] = entry
    return summary


def print_table(summaries: dict[str, dict]) -> None:
    """Seconds per part: steady epochs and the first epoch, for each worker count and checkout."""
    labels = list(summaries)
    keys = [k for k in summaries[labels[0]] if k != "keras epoch"]
    print("\nmedian seconds per epoch: steady (all but the first) | first; plain Keras epoch: "
          + ", ".join(f"{label} {s['keras epoch']:.3f}" for label, s in summaries.items()))
    columns = [(label, key) for key in keys for label in labels]
    print(f"{'part':<12}" + "".join(f"{label + ' ' + key.replace(' workers', 'w'):>20}" for label, key in columns))
    for part in (*PARTS, *(f"  {p}" for p in WORKER_PARTS), "total"):
        name = part.strip()
        cells = [f"{summaries[label][key][name]:.3f} | {summaries[label][key]['first epoch'][name]:.3f}"
                 for label, key in columns]
        print(f"{part:<12}" + "".join(f"{cell:>20}" for cell in cells))
    for name in ("fit start", "fit end"):
        print(f"{name:<12}" + "".join(f"{summaries[label][key][name]:>20.3f}" for label, key in columns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", default="1,2", type=lambda s: [int(w) for w in s.split(",")])
    parser.add_argument("--units", type=int, default=64,
                        help="the hidden layer's width (64: 4.8k parameters; 16384: 1.2M, a model of 4.8 MB)")
    parser.add_argument("--backend", choices=("tensorflow", "jax", "torch"),
                        help="Keras' backend in the measuring processes (default: KERAS_BACKEND, else tensorflow)")
    parser.add_argument("--repeats", type=int, default=2, help="processes per checkout, alternating")
    parser.add_argument("--base", help="another checkout of elephant to measure side by side ('base')")
    parser.add_argument("--profile", action="store_true", help="one more fit under cProfile on the driver")
    parser.add_argument("--output", default="epoch_cost", help="file stem under benchmarks/results")
    parser.add_argument("--job-per-epoch", action="store_true",
                        help="measure this checkout with a Spark job per epoch (elephant.fit.resident.ONE_JOB = "
                             "False), alternating with its fit as one job")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.backend:
        os.environ["KERAS_BACKEND"] = args.backend  # the children's, and their Spark workers'
    passed = ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--units", str(args.units),
              "--workers", ",".join(map(str, args.workers))] + (["--profile"] if args.profile else [])
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return
    checkouts = {"this": ROOT} if not args.base else {"base": os.path.abspath(args.base), "this": ROOT}
    if args.job_per_epoch:  # the same checkout twice: a job per epoch, and its fit as one job
        checkouts = {"per epoch": ROOT, "one job": ROOT}
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {label: [] for label in checkouts}
    for repeat in range(args.repeats):
        for label, path in (checkouts.items() if repeat % 2 == 0 else reversed(checkouts.items())):
            result = run_child(__file__, path, passed + (["--job-per-epoch"] if label == "per epoch" else []))
            runs[label].append(result)
            fits = ", ".join(f"{f['workers']}w {statistics.median(r['total'] for r in f['epochs'][1:]):.3f}s"
                             for f in result["fits"])
            print(f"repeat {repeat} {label}: median epoch {fits}; keras "
                  f"{statistics.median(result['keras_epochs'][1:]):.3f}s; load {result['load_at_start'][0]:.1f}",
                  flush=True)
    summaries = {label: summarise(r) for label, r in runs.items()}
    print_table(summaries)
    for label, r in runs.items():
        for top in [run["profile"] for run in r if "profile" in run][:1]:
            print(f"\n{label}: driver thread under cProfile, one fit of 1 worker, top by cumulative seconds")
            for row in top:
                print(f"{row['cumtime']:8.3f} {row['tottime']:8.3f} {row['calls']:7d}  {row['function']}")
    load_after = os.getloadavg()
    print(f"\nload average {load_before[0]:.2f} before, {load_after[0]:.2f} after ({os.cpu_count()} cpus)")
    meta = {"epochs": args.epochs, "batch_size": args.batch_size, "workers": args.workers, "repeats": args.repeats,
            "units": args.units, "backend": os.environ.get("KERAS_BACKEND", "tensorflow"),
            "checkouts": {label: shown(path) for label, path in checkouts.items()}, "load_average_before": load_before, "load_average_after": load_after,
            "cpus": os.cpu_count(), "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M"),
            "note": "a shared machine: other processes ran during the measurements, so times are noisy"}
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"{args.output}.json"), "w") as f:
        json.dump({"meta": meta, "summary": summaries, "runs": runs}, f, indent=2)


if __name__ == "__main__":
    main()
