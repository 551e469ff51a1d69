"""Executor loss on a real multi-process cluster (reliability plan T08).

Starts ``local-cluster[2,1,1024]`` (two executor JVMs from the pip wheel), fits
a digits MLP for 4 epochs (``--epochs``) with 2 workers, and SIGKILLs one executor
JVM 1 s (``--kill-after``) into epoch 2, in each mode asked for. The standalone worker starts a new
executor; Spark re-runs the lost tasks of an ordinary stage itself, and
elephant rolls a failed barrier (synchronous) epoch back and trains it again.
``--executor-shards`` adds an asynchronous fit whose parameter server is two
shards in the epoch's tasks (``ps_shards=2, ps_placement="executors"``): the
kill takes a shard's host with it, and the epoch is rolled back on both.

Reported per mode: whether the fit completed, updates applied twice (from the
ledger: each ``(epoch, partition, step)`` must be in the center once), epochs
rolled back, commits undone, test accuracy and wall time, next to a fault-free
fit of the same mode in the same session (``--no-baseline`` skips it).

Usage::

    python benchmarks/executor_loss.py                      # both modes, with baselines
    python benchmarks/executor_loss.py --modes synchronous --no-baseline --out result.json
    python benchmarks/executor_loss.py --modes --executor-shards --no-baseline   # the sharded fit alone
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path


def executor_pids(app_id: str) -> list[int]:
    """PIDs of this application's executor JVMs."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().split(b"\0")
        except OSError:
            continue
        if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmdline and app_id.encode() in cmdline:
            pids.append(int(pid))
    return sorted(pids)


def fit_once(spark, mode: str, kill: bool, data, seed: int = 0, kill_after: float = 2.0, epochs: int = 4,
             shards: int = 1, placement: str | None = None) -> dict:
    import keras
    import numpy as np

    from elephant import SparkModel

    x_train, x_test, y_train, y_test = data
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    sm = SparkModel(model, mode=mode, frequency=8, num_workers=2, ps_shards=shards, ps_placement=placement,
                    spark=spark)
    killed, timers, began = [], [], []
    app_id = spark.sparkContext.applicationId

    def kill_one():
        pids = executor_pids(app_id)
        if pids:
            os.kill(pids[0], signal.SIGKILL)
            killed.append((pids[0], len(began)))  # the pid, and the epoch (1-based) it landed in

    def on_epoch_begin(epoch, logs=None):
        began.append(epoch)
        if kill and epoch == 1:
            timers.append(threading.Timer(kill_after, kill_one))
            timers[-1].start()

    started = time.perf_counter()
    error = None
    try:
        sm.fit(x_train, y_train, epochs=epochs, batch_size=16, verbose=0,
               callbacks=[keras.callbacks.LambdaCallback(on_epoch_begin=on_epoch_begin)])
    except Exception as exc:  # reported, not raised: the figure is whether the fit survives
        error = f"{type(exc).__name__}: {str(exc)[:300]}"
    for timer in timers:
        timer.cancel()
    seconds = time.perf_counter() - started
    ledger = sm.last_ledger or []
    keys = Counter((k[1], k[2], k[3]) for k, _ in ledger)
    metrics = sm.last_metrics or {}
    accuracy = float(np.mean(np.argmax(sm.model.predict(x_test, verbose=0), axis=1) == y_test))
    return {
        "mode": mode, "config": mode if placement is None else f"{mode}, {shards} shards on the {placement}",
        "shards": shards, "placement": placement, "fault": kill, "killed_pid": killed[0][0] if killed else None,
        "killed_in_epoch": killed[0][1] if killed else None, "completed": error is None,
        "error": error, "seconds": round(seconds, 2), "accuracy": round(accuracy, 4),
        "applied_twice": sum(c - 1 for c in keys.values() if c > 1), "commits_applied": len(ledger),
        "epochs_rolled_back": metrics.get("epochs_rolled_back", 0),
        "commits_rolled_back": metrics.get("commits_rolled_back", 0),
        "replays_dropped": metrics.get("replays_dropped", 0),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="*", default=["asynchronous", "synchronous"])
    parser.add_argument("--executor-shards", action="store_true",
                        help="also an asynchronous fit with two parameter-server shards in the epochs' tasks")
    parser.add_argument("--no-baseline", action="store_true", help="skip the fault-free fits")
    parser.add_argument("--kill-after", type=float, default=1.0, help="seconds into epoch 2 (default 1)")
    parser.add_argument("--repeat", type=int, default=24, help="copies of the digits training set (default 24)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs of each fit, at least 3 (default 4)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "executor_loss.json"))
    args = parser.parse_args(argv)
    if args.epochs < 3:
        parser.error(f"--epochs must be at least 3 (an epoch after the one killed in); received {args.epochs}")

    os.environ["PYSPARK_PYTHON"] = sys.executable
    import numpy as np
    from pyspark.sql import SparkSession
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    spark = (SparkSession.builder.master("local-cluster[2,1,1024]").appName("elephant-executor-loss")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split((x / 16.0).astype("float32"), y, test_size=0.25,
                                                        random_state=0, stratify=y)
    # epochs long enough for the kill to land mid-epoch: the training set repeated, lightly jittered
    rng = np.random.default_rng(0)
    x_train = np.concatenate([x_train] + [np.clip(x_train + rng.normal(0, 0.05, x_train.shape), 0, 1)
                                          for _ in range(args.repeat - 1)]).astype("float32")
    y_train = np.tile(y_train, args.repeat)
    data = (x_train, x_test, y_train, y_test)
    rows = []
    try:
        fit_once(spark, "asynchronous", False, data, epochs=1)  # Python workers started, TensorFlow imported
        configs = [(mode, 1, None) for mode in args.modes]
        if args.executor_shards:
            configs.append(("asynchronous", 2, "executors"))
        for mode, shards, placement in configs:
            for kill in ([False, True] if not args.no_baseline else [True]):
                rows.append(fit_once(spark, mode, kill, data, kill_after=args.kill_after, epochs=args.epochs,
                                     shards=shards, placement=placement))
                print(json.dumps(rows[-1]), flush=True)
                deadline = time.monotonic() + 120  # the next fit starts with both executors back
                while len(executor_pids(spark.sparkContext.applicationId)) < 2 and time.monotonic() < deadline:
                    time.sleep(0.5)
    finally:
        spark.stop()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"cluster": "local-cluster[2,1,1024]", "runs": rows}, indent=1))
    print(f"{'config':>38} {'fault':>5} {'killed in':>9} {'done':>5} {'twice':>5} {'replays':>7} {'rolled':>6} "
          f"{'acc':>6} {'seconds':>8}")
    for r in rows:
        where = f"epoch {r['killed_in_epoch']}" if r["killed_pid"] else "-"
        print(f"{r['config']:>38} {str(r['fault']):>5} {where:>9} {str(r['completed']):>5} {r['applied_twice']:>5} "
              f"{r['replays_dropped']:>7} {r['epochs_rolled_back']:>6} {r['accuracy']:>6.3f} {r['seconds']:>8.1f}")
    print(f"wrote {args.out}")
    ok = all(r["completed"] and r["applied_twice"] == 0 and (r["killed_pid"] is not None) == r["fault"] for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
