"""Scaling efficiency on 2 cores: plain Keras pinned to one core against elephant with 2 workers of one core each.

What: the headline figure of data-parallel training, K workers against one worker's resources, for K = 2. Each
workload is fitted four ways, from the same seeded data and initial weights, for the same epochs at the same
``batch_size``, with the user's own ``Adam()`` compiled as a user would:

* ``plain Keras, 1 core``: ``model.fit`` in a process under ``taskset -c 0`` with the backend's thread pools at 1
  (TensorFlow: ``TF_NUM_INTRAOP_THREADS=1``, ``TF_NUM_INTEROP_THREADS=1`` and ``tf.config.threading``; JAX:
  ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``; torch:
  ``torch.set_num_threads(1)``): the baseline;
* ``plain Keras, 2 cores``: the same under ``taskset -c 0,1`` with the backend's own thread pools (a side figure:
  one process's threads on both cores, not a scaled-out run);
* ``elephant sync, 2 workers`` and ``elephant async, 2 workers``: ``SparkModel(model, mode=..., num_workers=2)``
  with every other argument at its default, in a ``local[2]`` session (127.0.0.1, UI off,
  ``PYSPARK_PYTHON=sys.executable``) under ``taskset -c 0,1``; each task caps its backend's threads at its one core
  (``elephant.replicas.limit_threads``). Both again with ``elephant.fit.resident.ONE_JOB = False``
  (``..., a job per epoch``): what running the fit's epochs as one Spark job buys.

How: every fit runs in a fresh process (Keras fixes its backend and thread pools at import, and a replica cached by
an earlier fit of the same model would flatter the next one). An elephant process first fits a different, tiny
model once, so that both Python workers run and have imported the backend (``warmup_seconds``, paid once per
session, not in the fit's time). The time is ``fit``'s call to its return; test accuracy is ``evaluate``'s
afterwards. ``speedup`` = plain-1-core seconds / seconds and ``efficiency`` = speedup / cores.

Where an elephant fit's time goes comes from the stats each task returns (``elephant.worker.run_partition``) of
the epoch's slowest task, summed over the epochs: ``setup+pull`` (replica, threads, first pull), ``steps`` (its
training steps: seconds - setup - pull - comm), ``commits`` (time blocked on the parameter server: commits and
synchronous waits), ``fixed`` (per epoch: the epoch's wall time, Keras' ``on_epoch_begin`` to the next, minus the
slowest task's time) and ``fit start`` (call to the first epoch: the plan's measurements, the steps the driver's
head trains, the server's start): the five add up to the fit's time. ``steps/worker`` is each worker's steps at its
batch (``batch_size`` split between the workers), against plain Keras' steps at ``batch_size``. The stats
are read by wrapping ``elephant.fit.loop.run_epoch`` for the fit (as ``epoch_cost.py`` does); elephant keeps
no record of them.

Workloads (``benchmarks/workloads.py``'s ``waves`` generator: 1-D signals of length 64 in 10 classes):
``conv1d-8k``, a Conv1D net of 8,202 parameters, 40,000 training samples, 10 epochs, batch 64; ``mlp-1m``, a
64-1024-1024-10 MLP (1.13M parameters, 4.5 MB) on the same data, 2 epochs, batch 64.

Run:  python benchmarks/scaling.py [--workloads conv1d-8k mlp-1m] [--repeats 1] [--backend tensorflow] [--quick]
(``--table FILE`` prints a results file's tables again).
Writes benchmarks/results/scaling.json (``--output`` another stem; another backend: ``scaling_<backend>``;
``--quick``: ``scaling_quick``, so that a smoke run never replaces a measurement).
Timings need a quiet machine: another process on either core moves every figure.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, HERE)

import workloads as WL  # noqa: E402

BACKENDS = ("tensorflow", "jax", "torch")
#: workload -> its epochs (batch 64 and Adam() for both; the layers: ``workload``).
WORKLOADS = {"conv1d-8k": 10, "mlp-1m": 2}
QUICK = {"samples": 4000, "epochs": {"conv1d-8k": 2, "mlp-1m": 1}}
BATCH_SIZE = 64
#: config -> (label, cores it may use, what runs)
CONFIGS = {
    "plain-1": ("plain Keras, 1 core (pinned)", 1, "plain"),
    "plain-2": ("plain Keras, 2 cores (side figure)", 2, "plain"),
    "sync": ("elephant sync, 2 workers", 2, "synchronous"),
    "async": ("elephant async, 2 workers", 2, "asynchronous"),
    "sync-epochs": ("elephant sync, a job per epoch", 2, "synchronous"),
    "async-epochs": ("elephant async, a job per epoch", 2, "asynchronous"),
}
PARTS = ("fit start", "setup+pull", "steps", "commits", "fixed")


# ---------------------------------------------------------------- pure helpers


def data_size(train_samples: int, test_fraction: float = 0.1) -> int:
    """How many samples ``workloads.waves`` must generate for at least ``train_samples`` on the training side."""
    n = math.ceil(train_samples / (1 - test_fraction))
    while int(n * (1 - test_fraction)) < train_samples:
        n += 1
    return n


def epoch_parts(stats: list[dict], wall: float) -> dict[str, float]:
    """One epoch's seconds by part (see the module's docstring) from its tasks' stats and its wall time.

    The slowest task's ``seconds`` are split into ``setup+pull``, ``steps`` and ``commits``; ``fixed`` is the rest
    of ``wall``. ``worker steps`` and ``idle`` are means over the tasks: steps time, and time short of the slowest.
    """
    slow = max(stats, key=lambda s: s.get("seconds", 0.0))
    setup = slow.get("setup_seconds", 0.0) + slow.get("pull_seconds", 0.0)
    comm = slow.get("comm_seconds", 0.0)
    steps = [s.get("seconds", 0.0) - s.get("setup_seconds", 0.0) - s.get("pull_seconds", 0.0)
             - s.get("comm_seconds", 0.0) for s in stats]
    return {"setup+pull": setup, "steps": slow["seconds"] - setup - comm, "commits": comm,
            "fixed": wall - slow["seconds"], "worker steps": statistics.fmean(steps),
            "idle": statistics.fmean(slow["seconds"] - s.get("seconds", 0.0) for s in stats),
            "steps count": sum(s.get("steps", 0) for s in stats)}


def fit_parts(called: float, begins: list[float], returned: float, epochs: list[list[dict]]) -> dict[str, float]:
    """A fit's seconds by part, summed over its epochs: ``epochs[e]`` is epoch e's task stats, ``begins[e]`` its
    ``on_epoch_begin`` time; the last epoch ends at the fit's return. The parts of ``PARTS`` add up to the fit."""
    ends = begins[1:] + [returned]
    total = {"fit start": begins[0] - called}
    for stats, begin, end in zip(epochs, begins, ends):
        for part, seconds in epoch_parts(stats, end - begin).items():
            total[part] = total.get(part, 0.0) + seconds
    total["fit"] = returned - called
    return total


def scaling_rows(runs: dict[str, list[dict]]) -> list[dict]:
    """One row per configuration: median seconds and accuracy, speedup against ``plain-1`` and efficiency."""
    base = statistics.median(r["seconds"] for r in runs["plain-1"]) if runs.get("plain-1") else None
    rows = []
    for config, results in runs.items():
        if not results:
            continue
        label, cores, _ = CONFIGS[config]
        seconds = statistics.median(r["seconds"] for r in results)
        speedup = base / seconds if base else None
        rows.append({"config": config, "label": label, "cores": cores, "seconds": seconds,
                     "accuracy": statistics.median(r["accuracy"] for r in results), "speedup": speedup,
                     "efficiency": None if speedup is None else speedup / cores,
                     "all_seconds": [r["seconds"] for r in results]})
    return rows


def default_output(backend: str, quick: bool) -> str:
    """The results' file stem: ``scaling``, ``_<backend>`` for another than TensorFlow, ``_quick`` for a smoke run."""
    return "scaling" + ("" if backend == "tensorflow" else f"_{backend}") + ("_quick" if quick else "")


def thread_env(base: dict, backend: str, one_core: bool) -> dict:
    """The environment of a fit's process: the backend, and at one core its thread pools at one thread."""
    env = {k: v for k, v in base.items() if k not in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS",
                                                          "XLA_FLAGS", "OMP_NUM_THREADS")}
    env.update(KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, base.get("PYTHONPATH")) if p))
    if one_core:
        env.update(TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1", OMP_NUM_THREADS="1",
                   XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    return env


# ---------------------------------------------------------------- one fit, in its own process


def workload(name: str, samples: int):
    """``(x, y, x_test, y_test, build)`` of a workload; ``build()`` returns the compiled model at seed 0."""
    w = WL.waves(n=data_size(samples))
    x, y = w.x[:samples], w.y[:samples]

    def build(seed: int = 0):
        import keras

        keras.utils.set_random_seed(seed)
        if name == "conv1d-8k":
            layers = [keras.Input(x.shape[1:]), keras.layers.Conv1D(16, 7, activation="relu"),
                      keras.layers.MaxPooling1D(2), keras.layers.Conv1D(32, 5, activation="relu"),
                      keras.layers.Conv1D(32, 5, activation="relu"), keras.layers.GlobalAveragePooling1D(),
                      keras.layers.Dense(10, activation="softmax")]
        else:
            layers = [keras.Input(x.shape[1:]), keras.layers.Flatten(), keras.layers.Dense(1024, activation="relu"),
                      keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10, activation="softmax")]
        model = keras.Sequential(layers)
        model.compile(keras.optimizers.Adam(), "sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    return x, y, w.x_test, w.y_test, build


def one_thread(backend: str) -> None:
    """The backend's thread pools at one thread, in-process (the environment did the rest)."""
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    elif backend == "torch":
        import torch

        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)


def plain_fit(args, build, x, y) -> tuple[object, dict]:
    if CONFIGS[args.config][1] == 1:
        one_thread(args.backend)
    model = build()
    t0 = time.perf_counter()
    model.fit(x, y, epochs=args.epochs, batch_size=BATCH_SIZE, verbose=0)
    return model, {"seconds": time.perf_counter() - t0}


def elephant_fit(args, build, x, y) -> tuple[object, dict]:
    import keras

    import elephant.fit.loop as loop
    from elephant import SparkModel
    from elephant.session import local_session

    os.environ["PYSPARK_PYTHON"] = sys.executable  # the tasks' Python: this one
    spark = local_session("local[2]", "elephant-bench-scaling")
    spark.sparkContext.setLogLevel("ERROR")
    t0 = time.perf_counter()  # both Python workers up, the backend imported there: a different, tiny model
    keras.utils.set_random_seed(1)
    tiny = keras.Sequential([keras.Input(x.shape[1:]), keras.layers.Flatten(), keras.layers.Dense(10)])
    tiny.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    SparkModel(tiny, num_workers=2, spark=spark, frequency="epoch").fit(x[:512], y[:512], epochs=1, batch_size=64,
                                                                        verbose=0)
    warmup = time.perf_counter() - t0

    epochs: list[list[dict]] = []
    begins: list[float] = []
    run_epoch = loop.run_epoch

    def recorded(*a, **kw):
        results = run_epoch(*a, **kw)
        epochs.append(results)
        return results

    class Begins(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            begins.append(time.time())

    if args.config.endswith("-epochs"):  # the fit's epochs as a job each, as before they ran as one job
        from elephant.fit import resident

        resident.ONE_JOB = False
    sm = SparkModel(build(), mode=CONFIGS[args.config][2], num_workers=2, spark=spark)
    loop.run_epoch = recorded
    try:
        called = time.time()
        t0 = time.perf_counter()
        sm.fit(x, y, epochs=args.epochs, batch_size=BATCH_SIZE, verbose=0, callbacks=[Begins()])
        seconds = time.perf_counter() - t0
        returned = time.time()
    finally:
        loop.run_epoch = run_epoch
    parts = fit_parts(called, begins, returned, epochs) if len(epochs) == len(begins) and epochs else None
    metrics = sm.last_metrics or {}
    out = {"seconds": seconds, "warmup_seconds": warmup, "parts": parts, "plan": sm.fit_plan,
           "commits": metrics.get("commits_applied"), "rounds": metrics.get("rounds_applied")}
    return sm.model, out


def child(args) -> dict:
    x, y, x_test, y_test, build = workload(args.workload, args.samples)
    run = plain_fit if CONFIGS[args.config][2] == "plain" else elephant_fit
    model, out = run(args, build, x, y)
    evaluated = model.evaluate(x_test, y_test, batch_size=1024, verbose=0, return_dict=True)
    import keras

    out.update(config=args.config, workload=args.workload, accuracy=float(evaluated["accuracy"]),
               loss=float(evaluated["loss"]), parameters=int(model.count_params()), backend=keras.config.backend(),
               cpus=sorted(os.sched_getaffinity(0)), samples=len(x), test_samples=len(x_test), epochs=args.epochs)
    return out


def run_child(args, workload_name: str, config: str, epochs: int) -> dict:
    cores = CONFIGS[config][1]
    pin = ["taskset", "-c", "0" if cores == 1 else "0,1"] if shutil.which("taskset") else []
    command = [*pin, sys.executable, os.path.abspath(__file__), "--child", "--config", config, "--workload",
               workload_name, "--samples", str(args.samples), "--epochs", str(epochs), "--backend", args.backend]
    proc = subprocess.run(command, env=thread_env(dict(os.environ), args.backend, cores == 1), capture_output=True,
                          text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{workload_name} / {config} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


# ---------------------------------------------------------------- the driver of the runs


def print_tables(name: str, rows: list[dict], runs: dict[str, list[dict]]) -> None:
    first = next(r for results in runs.values() for r in results)
    print(f"\n{name}: {first['parameters']:,} parameters, {first['samples']:,} samples x {first['epochs']} epochs, "
          f"batch {BATCH_SIZE}, Adam(), {first['backend']}; test accuracy on {first['test_samples']:,}")
    print(f"{'configuration':<36}{'seconds':>9}{'accuracy':>10}{'speedup':>9}{'efficiency':>12}")
    for r in rows:
        speedup = "" if r["speedup"] is None else f"{r['speedup']:.2f}"
        efficiency = "" if r["efficiency"] is None else f"{r['efficiency']:.0%}"
        print(f"{r['label']:<36}{r['seconds']:>9.1f}{r['accuracy']:>10.4f}{speedup:>9}{efficiency:>12}")
    elephant = {c: rs for c, rs in runs.items() if CONFIGS[c][2] != "plain" and rs and rs[0].get("parts")}
    if not elephant:
        return
    plain_steps = math.ceil(first["samples"] / BATCH_SIZE) * first["epochs"]
    print("where an elephant fit's time goes (seconds, the slowest task of each epoch, summed; median of runs); "
          f"steps per worker at its batch, against plain Keras' {plain_steps} at {BATCH_SIZE}; commits applied")
    print(f"{'configuration':<36}" + "".join(f"{p:>11}" for p in (*PARTS, "fit", "idle"))
          + f"{'steps/worker':>14}{'commits':>9}")
    for config, results in elephant.items():
        med = {p: statistics.median(r["parts"][p] for r in results) for p in (*PARTS, "fit", "idle")}
        last, workers = results[-1], (results[-1]["plan"] or {}).get("num_workers", 2)
        steps = f"{last['parts']['steps count'] / workers:.0f} at {(last['plan'] or {}).get('worker_batch_size')}"
        commits = last["commits"] if last["commits"] is not None else last["rounds"]
        print(f"{CONFIGS[config][0]:<36}" + "".join(f"{med[p]:>11.2f}" for p in (*PARTS, "fit", "idle"))
              + f"{steps:>14}{commits if commits is not None else '':>9}")
    base = runs.get("plain-1")
    if base:
        print(f"plain 1 core / 2 = {statistics.median(r['seconds'] for r in base) / 2:.1f} s: a perfect 2-way split")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--samples", type=int, default=40_000, help="training samples (the test set is 1/9 of it)")
    parser.add_argument("--epochs", type=int, default=None, help="every workload's epochs (default: its own)")
    parser.add_argument("--repeats", type=int, default=1, help="processes per configuration, in rotated order")
    parser.add_argument("--backend", default="tensorflow", choices=BACKENDS)
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK['samples']} samples, 1-2 epochs")
    parser.add_argument("--output", default=None, help="file stem under benchmarks/results (default: scaling, "
                        "scaling_<backend>, with _quick for --quick)")
    parser.add_argument("--table", metavar="JSON", help="print the tables of a results file again, and run nothing")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return
    if args.table:
        with open(args.table) as f:
            for name, measured in json.load(f)["workloads"].items():
                print_tables(name, measured["rows"], measured["runs"])
        return
    if importlib.util.find_spec(args.backend) is None:
        print(f"skipped: the {args.backend} backend is not installed in this environment ({sys.executable}); "
              f"install it (e.g. pip install {args.backend}) to measure it. Nothing was written.")
        return
    if args.quick:
        args.samples = QUICK["samples"]
    output = args.output or default_output(args.backend, args.quick)
    started, load_before = time.perf_counter(), os.getloadavg()
    results: dict = {}
    for name in args.workloads:
        epochs = args.epochs or (QUICK["epochs"][name] if args.quick else WORKLOADS[name])
        runs: dict[str, list[dict]] = {config: [] for config in args.configs}
        for repeat in range(args.repeats):
            shift = repeat % len(args.configs)
            for config in args.configs[shift:] + args.configs[:shift]:
                r = run_child(args, name, config, epochs)
                runs[config].append(r)
                print(f"{name} repeat {repeat} {config}: {r['seconds']:.1f}s, accuracy {r['accuracy']:.4f}, "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
        rows = scaling_rows(runs)
        print_tables(name, rows, runs)
        results[name] = {"rows": rows, "runs": runs}
    load_after, total = os.getloadavg(), time.perf_counter() - started
    print(f"\n{total / 60:.1f} min; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after "
          f"({os.cpu_count()} cpus)")
    meta = {"backend": args.backend, "samples": args.samples, "batch_size": BATCH_SIZE, "repeats": args.repeats,
            "quick": args.quick, "cpus": os.cpu_count(), "taskset": bool(shutil.which("taskset")),
            "python": platform.python_version(), "platform": platform.platform(),
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "load_average_before": load_before, "load_average_after": load_after, "minutes": total / 60}
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"{output}.json"), "w") as f:
        json.dump({"meta": meta, "workloads": results}, f, indent=2)


if __name__ == "__main__":
    main()
