"""A soak run (reliability plan T24): per-batch commits from two executors plus 8 extra clients, for minutes.

On ``local-cluster[2,1,1024]`` an asynchronous fit of a digits MLP commits after
every batch (``frequency="batch"``) for ``--minutes``; meanwhile 8 threads in
the driver pull the center and read ``/metrics`` from its parameter server in
a loop. Every 10 s the driver's RSS, open file descriptors and threads are
sampled. Reported: commits applied, extra-client requests and errors, the RSS
slope over the second half of the run (MB per hour), and fds and threads at
the start and the end. Writes ``benchmarks/results/soak.json``.

Requests that fail after the fit has ended (its server is stopping while an extra
client finishes its loop) are not counted. The extra clients need the run's token, which elephant never exposes; the
script fixes it by replacing ``secrets.token_urlsafe`` in ``elephant.fit.loop``.

Usage::

    python benchmarks/soak.py --minutes 10
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

TOKEN = "soak-token"


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "soak.json"))
    args = parser.parse_args(argv)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    import keras
    from pyspark.sql import SparkSession
    from sklearn.datasets import load_digits

    from elephant import SparkModel
    from elephant.fit import loop as fit_loop
    from elephant.ps.client import PSClient

    fit_loop.secrets.token_urlsafe = lambda nbytes=None: TOKEN
    spark = (SparkSession.builder.master("local-cluster[2,1,1024]").appName("elephant-soak")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    sm = SparkModel(model, mode="asynchronous", frequency="batch", num_workers=2, spark=spark)

    stop = threading.Event()
    counts = {"requests": 0, "errors": 0}
    error_kinds: dict[str, int] = {}
    lock = threading.Lock()
    samples: list[dict] = []
    started = time.monotonic()
    deadline = started + args.minutes * 60

    def extra_client() -> None:
        while sm.ps_url is None and not stop.is_set():
            time.sleep(0.05)
        with PSClient(sm.ps_url, TOKEN, read_timeout=30) as client:
            while not stop.is_set():
                try:
                    client.pull(0)
                    client.metrics()
                    n, e = 2, 0
                except Exception as exc:  # counted: the figure is the error rate
                    if stop.is_set():
                        break  # the fit is over and its server stopping: not an error of the run
                    n, e = 1, 1
                    kind = f"{type(exc).__name__}: {str(exc)[:120]}"
                    with lock:
                        error_kinds[kind] = error_kinds.get(kind, 0) + 1
                with lock:
                    counts["requests"] += n
                    counts["errors"] += e

    def sampler() -> None:
        while not stop.wait(10.0):
            samples.append({"t": round(time.monotonic() - started, 1), "rss_mb": round(_rss_mb(), 1),
                            "fds": len(os.listdir("/proc/self/fd")), "threads": threading.active_count()})

    def on_epoch_end(epoch, logs=None):
        if time.monotonic() > deadline:
            sm.model.stop_training = True
            stop.set()  # the extra clients finish while the server is still up

    threads = [threading.Thread(target=extra_client, daemon=True) for _ in range(args.clients)]
    threads.append(threading.Thread(target=sampler, daemon=True))
    samples.append({"t": 0.0, "rss_mb": round(_rss_mb(), 1), "fds": len(os.listdir("/proc/self/fd")),
                    "threads": threading.active_count()})
    for t in threads:
        t.start()
    error = None
    try:
        sm.fit(x, y, epochs=100000, batch_size=32, verbose=0,
               callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=on_epoch_end)])
    except Exception as exc:
        error = f"{type(exc).__name__}: {str(exc)[:300]}"
    stop.set()
    for t in threads:
        t.join()
    seconds = time.monotonic() - started
    time.sleep(1.0)  # the server's threads have stopped; sample what is left
    samples.append({"t": round(seconds, 1), "rss_mb": round(_rss_mb(), 1), "fds": len(os.listdir("/proc/self/fd")),
                    "threads": threading.active_count()})
    second_half = [s for s in samples if s["t"] >= seconds / 2] or samples
    slope = float(np.polyfit([s["t"] for s in second_half], [s["rss_mb"] for s in second_half], 1)[0]) * 3600 \
        if len(second_half) > 2 else float("nan")
    result = {
        "minutes": round(seconds / 60, 2), "fit_error": error,
        "commits_applied": (sm.last_metrics or {}).get("commits_applied"),
        "commits_rejected": (sm.last_metrics or {}).get("commits_rejected"),
        "extra_requests": counts["requests"], "extra_errors": counts["errors"], "extra_error_kinds": error_kinds,
        "rss_slope_mb_per_hour_second_half": round(slope, 1),
        "rss_mb_start_end": [samples[0]["rss_mb"], samples[-1]["rss_mb"]],
        "fds_start_end": [samples[0]["fds"], samples[-1]["fds"]],
        "threads_start_end": [samples[0]["threads"], samples[-1]["threads"]],
        "samples": samples,
    }
    spark.stop()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    return 0 if error is None and counts["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
