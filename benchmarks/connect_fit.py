"""A fit from a Spark Connect client against the same fit in a classic session, side by side.

A Connect server is started from the pyspark wheel (``sbin/start-connect-server.sh``,
``local[2]``, loopback); the digits MLP (Adam 3e-3, batch 64, 2 workers, from the
same initial weights) trains for ``--epochs`` epochs in each mode, once from a
Connect client (each epoch a barrier stage whose task 0 hosts the parameter
server) and once from a classic ``local[2]`` session (the server in the driver),
each after a warm-up fit of one epoch. Reported: seconds, seconds per epoch
and the accuracy on all 1,797 digits. Writes ``benchmarks/results/connect_fit.json``.

Usage::

    python benchmarks/connect_fit.py [--epochs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

MODES = ("synchronous", "asynchronous")

FITS = r'''
import json, sys, time
import numpy as np
import keras
import pyarrow as pa
from sklearn.datasets import load_digits

from elephant import SparkModel

def main(spark, epochs):
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    offsets = np.arange(0, x.size + 1, 64, dtype=np.int32)
    features = pa.ListArray.from_arrays(pa.array(offsets), pa.array(x.ravel()))
    df = spark.createDataFrame(pa.table({"features": features, "label": pa.array(y)}).to_pandas())
    out = {}
    for mode in ("synchronous", "asynchronous"):
        for label, n in (("warm-up", 1), (mode, epochs)):
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                      keras.layers.Dense(10, activation="softmax")])
            model.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
            sm = SparkModel(model, spark=spark, mode=mode, num_workers=2)
            t0 = time.perf_counter()
            sm.fit(df, epochs=n, batch_size=64, verbose=0)
            seconds = time.perf_counter() - t0
        out[mode] = {"seconds": seconds, "seconds_per_epoch": seconds / epochs,
                     "accuracy": float(model.evaluate(x, y, verbose=0, return_dict=True)["accuracy"])}
    return out
'''

CONNECT_CLIENT = FITS + r'''
from pyspark.sql import SparkSession
print("RESULT " + json.dumps(main(SparkSession.builder.remote(sys.argv[1]).getOrCreate(), int(sys.argv[2]))))
'''

CLASSIC_CLIENT = FITS + r'''
from elephant.session import local_session
print("RESULT " + json.dumps(main(local_session("local[2]", "elephant-connect-benchmark"), int(sys.argv[1]))))
'''


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _result(command: list[str], env: dict) -> dict:
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    if run.returncode != 0 or not lines:
        sys.exit(f"{command[1]} failed:\n{run.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()

    import pyspark

    spark_home = Path(pyspark.__file__).resolve().parent
    start = spark_home / "sbin" / "start-connect-server.sh"
    if not start.exists():
        sys.exit(f"the pyspark wheel has no {start}")
    results = {"epochs": args.epochs, "pyspark": pyspark.__version__, "cpus": os.cpu_count(), "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "conf").mkdir()
        env = {**os.environ, "SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_CONF_DIR": str(tmp_path / "conf"), "SPARK_NO_DAEMONIZE": "1",
               "SPARK_LOG_DIR": str(tmp_path / "logs"), "SPARK_PID_DIR": tmp, "PYSPARK_PYTHON": sys.executable}
        (tmp_path / "connect.py").write_text(CONNECT_CLIENT)
        (tmp_path / "classic.py").write_text(CLASSIC_CLIENT)
        results["runs"]["classic"] = _result([sys.executable, str(tmp_path / "classic.py"), str(args.epochs)], env)
        port = _free_port()
        with open(tmp_path / "server.log", "wb") as log:
            server = subprocess.Popen(
                ["bash", str(start), "--master", "local[2]", "--conf", f"spark.connect.grpc.binding.port={port}",
                 "--conf", "spark.connect.grpc.binding.address=127.0.0.1", "--conf", "spark.driver.host=127.0.0.1",
                 "--conf", "spark.driver.bindAddress=127.0.0.1", "--conf", "spark.ui.enabled=false"],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp, start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            while not _listening(port):
                if server.poll() is not None or time.monotonic() > deadline:
                    sys.exit("the Connect server did not start:\n" + (tmp_path / "server.log").read_text()[-3000:])
                time.sleep(0.5)
            results["runs"]["connect"] = _result(
                [sys.executable, str(tmp_path / "connect.py"), f"sc://127.0.0.1:{port}", str(args.epochs)], env)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)

    for mode in MODES:
        classic, connect = results["runs"]["classic"][mode], results["runs"]["connect"][mode]
        connect["ratio"] = connect["seconds"] / classic["seconds"]
        for name, run in (("classic", classic), ("connect", connect)):
            ratio = f"  {run['ratio']:.2f}x classic" if "ratio" in run else ""
            print(f"{mode:12s} {name:8s} {run['seconds']:6.1f} s  {run['seconds_per_epoch']:5.2f} s/epoch  "
                  f"accuracy {run['accuracy']:.3f}{ratio}", flush=True)
    out = Path(__file__).parent / "results" / "connect_fit.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
