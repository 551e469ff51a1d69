"""Plain Keras on one GPU vs elephant on every GPU of a cluster: same model, data and epochs.

For a cluster laid out as docs/cluster.md recommends, one executor per GPU
(``spark.executor.resource.gpu.amount=1``, ``spark.task.resource.gpu.amount=1``,
``spark.executor.cores`` = ``spark.task.cpus``). Both sides run on executors' GPUs:

- plain Keras: one Spark task (so it gets one GPU, placed as elephant places its
  tasks) builds the workload's model and runs ``model.fit`` on the whole training set;
- elephant: ``SparkModel(model, num_workers=<GPUs>).fit`` with the same seeded
  initial weights, epochs and batch size.

Both are scored on the same test set. Results (wall times, the figure of merit,
the speed-up, each task's device) go to a JSON file.

Run on the cluster (the session is spark-submit's)::

    spark-submit --conf spark.executor.resource.gpu.amount=1 \\
        --conf spark.executor.resource.gpu.discoveryScript=getGpusResources.sh \\
        --conf spark.task.resource.gpu.amount=1 --py-files benchmarks/workloads.py \\
        benchmarks/gpu.py --workload textures-conv2d --epochs 5

``--dry-run`` checks the script on a machine without GPUs or a cluster: a
``local-cluster[2,1,1024]`` session whose workers each report a fake GPU ``0``
(CPU builds of the frameworks ignore CUDA devices that do not exist), the small
digits workload for one epoch. Its timings mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import stat
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, HERE)

import workloads as WL  # noqa: E402


def fake_gpu_session(directory: str):
    """``local-cluster[2,1,1024]``: two executors, each with one fake GPU, one task each."""
    from pyspark.sql import SparkSession

    script = os.path.join(directory, "gpus.sh")
    with open(script, "w") as f:
        f.write('#!/usr/bin/env bash\necho \'{"name": "gpu", "addresses": ["0"]}\'\n')
    os.chmod(script, os.stat(script).st_mode | stat.S_IXUSR)
    here = os.path.dirname(HERE)
    return (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("elephant-gpu-benchmark-dry-run")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))
        .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "3")
        .config("spark.python.daemon.module", "elephant.daemon")
        .config("spark.worker.resource.gpu.amount", "1")
        .config("spark.worker.resource.gpu.discoveryScript", script)
        .config("spark.executor.resource.gpu.amount", "1")
        .config("spark.task.resource.gpu.amount", "1")
        .getOrCreate()
    )


def plain_keras_task(name: str, seed: int, epochs: int, batch_size: int, backend: str):
    """A Spark task: ``model.fit`` of the workload on this task's GPU; yields its figures."""

    def task(_):
        from elephant import framework

        device = framework.enter_task(backend, "the plain-Keras task")  # its GPU, before Keras starts
        import workloads

        wl = workloads.make(name)
        model = wl.build(seed)
        t0 = time.perf_counter()
        model.fit(wl.x, wl.y, epochs=epochs, batch_size=batch_size, verbose=0)
        seconds = time.perf_counter() - t0
        score = model.evaluate(wl.x_test, wl.y_test, verbose=0, return_dict=True)[wl.metric]
        yield {"device": device, "seconds": seconds, wl.metric: float(score)}

    return task


def run(spark, name: str, seed: int, epochs: int, batch_size: int, workers: int | None, mode: str) -> dict:
    import keras

    from elephant import SparkModel, gpu, session

    sc = spark.sparkContext
    conf = dict(sc.getConf().getAll())
    backend = keras.config.backend()
    workers = workers or session.task_slots(sc)
    sc.addPyFile(os.path.join(HERE, "workloads.py"))
    wl = WL.make(name)

    sc.setJobDescription("plain Keras on one GPU")
    baseline = sc.parallelize([0], 1).mapPartitions(
        plain_keras_task(name, seed, epochs, batch_size, backend)).collect()[0]

    model = wl.build(seed)  # the same seeded initial weights as the baseline's
    sm = SparkModel(model, mode=mode, num_workers=workers, spark=spark)
    t0 = time.perf_counter()
    sm.fit(wl.x, wl.y, epochs=epochs, batch_size=batch_size, verbose=0)
    seconds = time.perf_counter() - t0
    score = sm.model.evaluate(wl.x_test, wl.y_test, verbose=0, return_dict=True)[wl.metric]
    return {
        "workload": name, "metric": wl.metric, "epochs": epochs, "batch_size": batch_size, "seed": seed,
        "backend": backend, "master": sc.master, "gpus_per_task": gpu.describe_request(conf),
        "plain_keras_one_gpu": baseline,
        "elephant": {"workers": workers, "mode": mode, "seconds": seconds, wl.metric: float(score),
                     "plan": sm.fit_plan},
        "speedup": baseline["seconds"] / seconds,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="textures-conv2d", choices=WL.NAMES)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None, help="default: the cluster's task slots (its GPUs)")
    parser.add_argument("--mode", default="asynchronous", choices=["synchronous", "asynchronous", "hogwild"])
    parser.add_argument("--out", default=None, help="default: benchmarks/results/gpu.json (gpu_dry_run.json)")
    parser.add_argument("--dry-run", action="store_true", help="fake GPUs on local-cluster, digits, 1 epoch")
    args = parser.parse_args(argv)
    out = args.out or os.path.join(RESULTS, "gpu_dry_run.json" if args.dry_run else "gpu.json")

    with tempfile.TemporaryDirectory() as tmp:
        if args.dry_run:
            spark = fake_gpu_session(tmp)
            name, epochs = "digits-mlp", 1
        else:
            from elephant import session

            spark = session.get_or_create()
            name, epochs = args.workload, args.epochs
            if float(spark.sparkContext.getConf().get("spark.task.resource.gpu.amount", "0")) <= 0:
                parser.error("the session asks for no GPUs: set spark.task.resource.gpu.amount (docs/cluster.md)")
        try:
            result = run(spark, name, args.seed, epochs, args.batch_size, args.workers, args.mode)
        finally:
            spark.stop()
    result.update(dry_run=args.dry_run, python=platform.python_version(), when=time.strftime("%Y-%m-%d %H:%M:%S"))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(json.dumps({k: result[k] for k in ("plain_keras_one_gpu", "elephant", "speedup")}, default=str))
    return result


if __name__ == "__main__":
    main()
