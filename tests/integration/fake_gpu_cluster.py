"""A local-cluster session with two fake GPUs, probed by plain jobs and by a tiny fit; prints JSON.

Run in its own process by ``test_gpu_placement.py`` (a process has one
SparkContext, and the integration suite's is ``local[2,4]``): one executor with
2 cores and GPUs ``0`` and ``1`` from a discovery script, one GPU per task.
CPU builds of the frameworks ignore CUDA devices that do not exist, so the fit
trains on the CPU whatever ``CUDA_VISIBLE_DEVICES`` says.

First a one-epoch fit of 2 workers starts the Python workers (the warm-up is
off), then probe jobs of two tasks run in them.

Usage: ``python fake_gpu_cluster.py OUT.json [ROUNDS]``.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import tempfile
import time
from pathlib import Path

ROUNDS = 4  # probe jobs after the fit, in the Python workers it started


def discovery_script(directory: Path) -> Path:
    """A GPU discovery script that reports GPUs 0 and 1, as a real one (nvidia-smi) would."""
    path = directory / "gpus.sh"
    path.write_text('#!/usr/bin/env bash\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def session(script: Path):
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    return (
        SparkSession.builder.master("local-cluster[1,2,1024]")
        .appName("elephant-fake-gpus")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.daemon.module", "elephant.daemon")
        .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "3")
        .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        .config("spark.elephant.warmUp", "false")
        .config("spark.worker.resource.gpu.amount", "2")
        .config("spark.worker.resource.gpu.discoveryScript", str(script))
        .config("spark.executor.resource.gpu.amount", "2")
        .config("spark.task.resource.gpu.amount", "1")
        .getOrCreate()
    )


def probe(round_: int, backend: str):
    """A task that places itself as a fit's task does, imports Keras, and reports what it saw."""

    def task(_):
        from pyspark import TaskContext

        from elephant import framework
        from elephant.errors import ConfigError

        ctx = TaskContext.get()
        row = {"round": round_, "partition": ctx.partitionId(), "pid": os.getpid(),
               "addresses": list(ctx.resources()["gpu"].addresses), "device": None, "error": None}
        try:
            row["device"] = framework.enter_task(backend, f"probe task {ctx.partitionId()} of round {round_}")
            import keras  # the framework has started in this process from now on

            row["keras_backend"] = keras.config.backend()
        except ConfigError as exc:
            row["error"] = str(exc)
        row["visible"] = os.environ.get("CUDA_VISIBLE_DEVICES")
        row["keras_backend_env"] = os.environ.get("KERAS_BACKEND")
        # So that the two tasks of a round run at once, in two Python workers; gpu:0's task ends last, so
        # the worker that had gpu:1 is idle first and is likely handed the next round's first task (gpu:0).
        time.sleep(1.0 if row["addresses"] != ["0"] else 1.5)
        row["end"] = time.time()
        yield row

    return task


def tiny_fit(spark) -> dict:
    """A one-epoch asynchronous fit of 2 workers on the fake GPUs: its outcome and the devices its tasks logged."""
    import keras
    import numpy as np

    from elephant import SparkModel

    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    for name in ("elephant.fit.loop",):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    outcome = {"error": None}
    try:
        history = SparkModel(model, mode="asynchronous", num_workers=2, spark=spark).fit(
            x, y, epochs=1, batch_size=32, verbose=0)
        outcome["loss"] = float(history.history["loss"][-1])
    except Exception as exc:  # reported, and judged by the test
        outcome["error"] = f"{type(exc).__name__}: {exc}"
    outcome["log"] = [line for line in records if "devices:" in line or "tasks ran on" in line]
    return outcome


def main(out: str, rounds: int = ROUNDS) -> None:
    import keras

    backend = keras.config.backend()
    with tempfile.TemporaryDirectory() as tmp:
        spark = session(discovery_script(Path(tmp)))
        try:
            sc = spark.sparkContext
            result = {"backend": backend, "driver_resources": sorted(sc.resources), "rounds": []}
            result["fit"] = tiny_fit(spark)  # ships the backend (sc.environment) and starts the workers
            for r in range(rounds):
                result["rounds"].append(sc.parallelize(range(2), 2).mapPartitions(probe(r, backend)).collect())
        finally:
            spark.stop()
    Path(out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else ROUNDS)
