"""Per-step time of elephant's backend stepper against plain ``model.fit``, on each Keras backend.

Two workloads: the digits MLP of ``benchmarks/workloads.py`` (64-64-32-10, Adam, batch
32) and the Conv1D of ``benchmarks/end_to_end.py`` (generated signals of length 64,
batch 64). Each backend runs in its own Python process (Keras fixes its backend at
import), from the same seeded data; the models' initial weights differ per backend.

For each backend and workload:

* ``fit ms/step``: plain ``model.fit(shuffle=False)``, the median epoch time (epochs
  after the first) divided by the steps per epoch;
* ``stepper ms/step``: the median over the steps of the passes after the first of one
  :func:`elephant.backends.stepper` step, its loss read as a float (as the worker
  checks it after every step);
* ``get ms``, ``set ms``: the median time of the stepper's flat read and write of all
  weights (a commit reads and writes once each).

Each process first calls ``elephant.replicas.limit_threads(--threads)`` (default 1), as a
Spark task does.

Run:  python benchmarks/backends.py [--epochs 4] [--signals 4096] [--threads 1] [--backends tensorflow,jax,torch]
Writes benchmarks/results/backends.json (``--out`` another file). Each row names the device the
step ran on: a backend that finds a GPU uses it, so the same script measures a GPU machine. Timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
BACKENDS = ("tensorflow", "jax", "torch")
FRAMEWORK = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}


def _workloads(signals: int):
    """``(name, x, y, build, batch_size)`` for the digits MLP and the end-to-end Conv1D."""
    sys.path.insert(0, HERE)
    import end_to_end
    import workloads

    digits = workloads.make("digits-mlp")
    x, y = end_to_end.make_signals(signals)
    return [("digits-mlp", digits.x, digits.y, lambda: digits.build(0), 32),
            ("end-to-end-conv1d", x, y, end_to_end.build_model, 64)]


def _fit_ms_per_step(build, x, y, batch_size: int, epochs: int) -> float:
    import keras

    class EpochTimes(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.t0)

    times = EpochTimes()
    build().fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0, callbacks=[times])
    steps = -(-len(x) // batch_size)
    return 1e3 * statistics.median(times.seconds[1:]) / steps


def _stepper_ms(build, x, y, batch_size: int, epochs: int) -> dict[str, float]:
    from elephant.backends import stepper

    model = build()
    s = stepper(model)
    step_ms, get_ms, set_ms = [], [], []
    for epoch in range(epochs):
        s.begin_pass()
        for start in range(0, len(x), batch_size):
            t0 = time.perf_counter()
            logs = s.step((x[start:start + batch_size], y[start:start + batch_size], None))
            float(logs["loss"])
            t1 = time.perf_counter()
            weights = s.get_weights()
            t2 = time.perf_counter()
            s.set_weights(weights)
            t3 = time.perf_counter()
            if epoch:  # the first pass traces and compiles
                step_ms.append(1e3 * (t1 - t0))
                get_ms.append(1e3 * (t2 - t1))
                set_ms.append(1e3 * (t3 - t2))
    s.sync_to_model()
    return {"stepper_ms_per_step": statistics.median(step_ms), "get_ms": statistics.median(get_ms),
            "set_ms": statistics.median(set_ms), "stepper": type(s).__name__}


def _device(backend: str) -> str:
    """Where Keras runs the step on this backend: ``"cpu"``, or the accelerator's platform (``"gpu"``, ``"cuda"``)."""
    if backend == "jax":
        import jax

        return jax.devices()[0].platform
    if backend == "torch":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    import tensorflow as tf

    return "gpu" if tf.config.list_physical_devices("GPU") else "cpu"


def child(backend: str, epochs: int, signals: int, threads: int) -> None:
    """Measure every workload under ``backend`` (already in ``KERAS_BACKEND``); print one JSON line."""
    from elephant.replicas import limit_threads

    limit_threads(threads)  # as a Spark task with spark.task.cpus=threads does, before the framework runs
    import keras

    assert keras.backend.backend() == backend, (keras.backend.backend(), backend)
    device = _device(backend)
    rows = []
    for name, x, y, build, batch_size in _workloads(signals):
        row = {"backend": backend, "device": device, "workload": name, "threads": threads, "samples": len(x),
               "batch_size": batch_size,
               "steps_per_epoch": -(-len(x) // batch_size)}
        row["fit_ms_per_step"] = _fit_ms_per_step(build, x, y, batch_size, epochs)
        row.update(_stepper_ms(build, x, y, batch_size, epochs))
        row["stepper_over_fit"] = row["stepper_ms_per_step"] / row["fit_ms_per_step"]
        rows.append(row)
    print("ROWS " + json.dumps(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4, help="passes per measurement; the first is warm-up")
    parser.add_argument("--signals", type=int, default=4096, help="samples of the Conv1D workload")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--threads", type=int, default=1,
                        help="elephant.replicas.limit_threads(THREADS) in each backend's process, as a task does")
    parser.add_argument("--out", default=os.path.join(RESULTS, "backends.json"), help="the results file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.epochs, args.signals, args.threads)
        return

    rows, skipped = [], {}
    for backend in args.backends.split(","):
        if importlib.util.find_spec(FRAMEWORK[backend]) is None:
            skipped[backend] = f"{FRAMEWORK[backend]} is not installed"
            continue
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
                   PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", backend, "--epochs",
                              str(args.epochs), "--signals", str(args.signals), "--threads", str(args.threads)],
                             capture_output=True, text=True, env=env, timeout=1800)
        lines = [line for line in out.stdout.splitlines() if line.startswith("ROWS ")]
        if out.returncode or not lines:
            skipped[backend] = f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}"
            continue
        rows += json.loads(lines[-1][5:])

    print(f"{'backend':<12}{'device':<8}{'workload':<20}{'fit ms/step':>12}{'stepper ms/step':>16}{'x fit':>7}"
          f"{'get ms':>8}{'set ms':>8}")
    for r in rows:
        print(f"{r['backend']:<12}{r['device']:<8}{r['workload']:<20}{r['fit_ms_per_step']:>12.2f}{r['stepper_ms_per_step']:>16.2f}"
              f"{r['stepper_over_fit']:>7.2f}{r['get_ms']:>8.3f}{r['set_ms']:>8.3f}")
    for backend, why in skipped.items():
        print(f"{backend}: skipped ({why})")

    from importlib.metadata import version

    versions = {name: version(name) for name in ("keras", *FRAMEWORK.values()) if importlib.util.find_spec(name)}
    meta = {"epochs": args.epochs, "signals": args.signals, "threads": args.threads, "versions": versions,
            "skipped": skipped,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                        "load_average_at_end": os.getloadavg()},
            "note": ("Medians on a shared 2-core machine whose other users' load varied during the run: "
                     "repeated runs moved single figures by up to 3-4x, so compare the figures of one row, and "
                     "backends only as rough orders. Threads capped by elephant.replicas.limit_threads(threads), "
                     "as in a Spark task (JAX is capped only at 1 thread, through XLA_FLAGS). Uncapped, torch's 2 "
                     "OpenMP threads took 205 ms per digits step on this oversubscribed host against 2.9 ms with "
                     "1. The stepper's step includes reading the loss as a float; fit's per-step figure is an "
                     "epoch's time over its steps, callbacks included.")}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
