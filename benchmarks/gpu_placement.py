"""What elephant's GPU placement changes on a real GPU, without Spark: devices seen and memory taken.

A Spark task given GPU address ``0`` calls :func:`elephant.gpu.place_task` before its
framework starts; this script applies the same decision (:func:`elephant.gpu.place`)
in a fresh process per backend, trains a few steps of a small model through the
worker's stepper (:func:`elephant.backends.stepper`), and reads from ``nvidia-smi``
how much GPU memory the process holds. Each backend runs twice: placed as a task is,
and unplaced (the framework's own defaults), side by side in one run.

Run on a machine with an NVIDIA GPU (no Spark needed)::

    python benchmarks/gpu_placement.py [--backends jax,torch,tensorflow] [--out FILE]

Writes ``benchmarks/results/gpu_placement.json`` by default.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
FRAMEWORK = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}
STEPS = 50


def _nvidia_smi(*args: str) -> str:
    """``nvidia-smi``'s output ("" on a machine without it)."""
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        return ""


def _process_gpu_mib(pid: int) -> float | None:
    """The GPU memory ``nvidia-smi`` reports for process ``pid`` (MiB), or None when it lists none."""
    out = _nvidia_smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    used = [float(mib) for line in out.splitlines() if line.strip()
            for p, mib in [line.split(",")[:2]] if p.strip() == str(pid)]
    return sum(used) if used else None


def _visible_devices(backend: str) -> list[str]:
    if backend == "jax":
        import jax

        return [str(d) for d in jax.devices()]
    if backend == "torch":
        import torch

        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    import tensorflow as tf

    return [d.name for d in tf.config.list_physical_devices("GPU")]


def _framework_memory(backend: str) -> dict:
    """The framework's own account of its GPU memory (bytes), where it gives one."""
    if backend == "jax":
        import jax

        stats = jax.devices()[0].memory_stats() or {}
        return {k: stats[k] for k in ("bytes_in_use", "bytes_reserved", "pool_bytes", "bytes_limit") if k in stats}
    if backend == "torch":
        import torch

        if torch.cuda.is_available():
            return {"memory_allocated": torch.cuda.memory_allocated(), "memory_reserved": torch.cuda.memory_reserved()}
    return {}


def child(backend: str, placed: bool) -> None:
    """One backend, placed or not; prints one JSON line."""
    from elephant import gpu

    variables: dict[str, str] = {}
    if placed:  # what place_task does for a task given address "0", before the framework starts
        _, variables = gpu.place(["0"], os.environ, os.environ.get(gpu.VISIBLE_DEVICES), None, False, "probe")
        os.environ.update(variables)
    import keras
    import numpy as np

    from elephant.backends import stepper

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64 * STEPS, 64)).astype("float32")
    y = rng.integers(0, 10, size=64 * STEPS).astype("int32")
    step = stepper(model)
    step.begin_pass()
    first = last = None
    for i in range(STEPS):
        logs = step.step((x[64 * i: 64 * (i + 1)], y[64 * i: 64 * (i + 1)], None))
        last = float(logs["loss"])
        first = last if first is None else first
    weights = step.get_weights()
    step.set_weights(weights)
    step.sync_to_model()
    row = {"backend": backend, "placed": placed, "set_variables": variables, "devices": _visible_devices(backend),
           "gpu_mib": _process_gpu_mib(os.getpid()), "framework_memory": _framework_memory(backend), "first_loss": first, "last_loss": last,
           "weights_roundtrip_equal": all(np.array_equal(a, b) for a, b in zip(weights, step.get_weights()))}
    print("ROW " + json.dumps(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="jax,torch,tensorflow")
    parser.add_argument("--out", default=os.path.join(RESULTS, "gpu_placement.json"))
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1] == "placed")
        return
    rows, skipped = [], {}
    for backend in args.backends.split(","):
        if importlib.util.find_spec(FRAMEWORK[backend]) is None:
            skipped[backend] = f"{FRAMEWORK[backend]} is not installed"
            continue
        for placed in ("placed", "unplaced"):
            env = {k: v for k, v in os.environ.items() if k not in ("TF_FORCE_GPU_ALLOW_GROWTH",
                                                                      "XLA_PYTHON_CLIENT_PREALLOCATE")}
            env.update(KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
                       PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", backend, placed],
                                 capture_output=True, text=True, env=env, timeout=600)
            lines = [line for line in out.stdout.splitlines() if line.startswith("ROW ")]
            if out.returncode or not lines:
                skipped[f"{backend}/{placed}"] = f"exit {out.returncode}: {out.stderr.strip().splitlines()[-3:]}"
                continue
            rows.append(json.loads(lines[-1][4:]))
    print(f"{'backend':<12}{'placed':<8}{'GPU MiB':>10}  {'loss first -> last':<22}devices")
    for r in rows:
        mib = "-" if r["gpu_mib"] is None else f"{r['gpu_mib']:.0f}"
        print(f"{r['backend']:<12}{str(r['placed']):<8}{mib:>10}  {r['first_loss']:.3f} -> {r['last_loss']:.3f}"
              f"{'':<8}{r['devices']}")
    for name, why in skipped.items():
        print(f"{name}: skipped ({why})")
    gpus = _nvidia_smi("--query-gpu=name,memory.total", "--format=csv,noheader").strip()
    meta = {"gpus": gpus, "python": platform.python_version(), "steps": STEPS, "skipped": skipped,
            "note": "GPU MiB: what nvidia-smi lists for the process after the steps (None: it listed none)"}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
