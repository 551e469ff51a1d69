"""elephant from a Spark Connect client, against a Connect server started from the pyspark wheel.

The server (``sbin/start-connect-server.sh``, ``local[2]``, loopback) runs in its
own process group; the client is a separate Python process, as a notebook talking
to a cluster would be. It trains a small model with plain Keras, then asks
elephant to predict on and evaluate a DataFrame through Connect (DataFrame APIs
only: an Arrow UDF and ``mapInArrow``), and to fit, which needs a SparkContext
and must fail at once saying what to use instead.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")
pytest.importorskip("grpc", reason="Spark Connect's client needs pyspark[connect] (grpcio and friends)")

SPARK_HOME = Path(pyspark.__file__).resolve().parent
START = SPARK_HOME / "sbin" / "start-connect-server.sh"
BUDGET = 150.0

pytestmark = pytest.mark.skipif(not START.exists(), reason=f"the pyspark wheel has no {START}")

CLIENT = r'''
import json, sys
import numpy as np
import keras
import pyarrow as pa
from pyspark.sql import SparkSession
from sklearn.datasets import load_digits

from elephant import SparkModel
from elephant.errors import ConfigError

spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
x, y = load_digits(return_X_y=True)
x = (x / 16.0).astype("float32")
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, epochs=2, batch_size=64, verbose=0)

offsets = np.arange(0, x.size + 1, 64, dtype=np.int32)
features = pa.ListArray.from_arrays(pa.array(offsets), pa.array(x.ravel()))
df = spark.createDataFrame(pa.table({"id": pa.array(np.arange(len(y))), "features": features,
                                     "label": pa.array(y)}).to_pandas())
sm = SparkModel(model, spark=spark)
predicted = sm.predict(df, batch_size=128)
rows = predicted.orderBy("id").select("prediction").toPandas()["prediction"]
out = {"columns": predicted.columns,
       "max_abs_diff": float(np.abs(np.stack(rows.to_numpy()) - model.predict(x, verbose=0)).max()),
       "evaluate": sm.evaluate(df, batch_size=128, return_dict=True),
       "keras": model.evaluate(x, y, batch_size=128, verbose=0, return_dict=True)}
for name, call in (("fit", lambda: sm.fit(df, epochs=1)), ("predict_numpy", lambda: sm.predict(x))):
    try:
        call()
        out[name] = None
    except ConfigError as exc:
        out[name] = str(exc)
print("RESULT " + json.dumps(out))
'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def connect_server(tmp_path):
    port = free_port()
    conf_dir = tmp_path / "conf"  # empty: no spark-defaults.conf of the machine leaks in
    conf_dir.mkdir()
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_CONF_DIR": str(conf_dir),
           "SPARK_NO_DAEMONIZE": "1", "SPARK_LOG_DIR": str(tmp_path / "logs"), "SPARK_PID_DIR": str(tmp_path),
           "PYSPARK_PYTHON": sys.executable}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("PYSPARK_GATEWAY_SECRET", None)
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            ["bash", str(START), "--master", "local[2]",
             "--conf", f"spark.connect.grpc.binding.port={port}", "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
             "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
             "--conf", "spark.ui.enabled=false"],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not listening(port):
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Connect server did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}", env
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(server.pid, sig)
            except ProcessLookupError:
                break
            try:
                server.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue


@pytest.mark.timeout(BUDGET + 30)
def test_a_connect_client_predicts_and_evaluates_dataframes_and_is_told_how_to_train(connect_server, tmp_path):
    url, env = connect_server
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    run = subprocess.run([sys.executable, str(script), url], capture_output=True, text=True, timeout=BUDGET,
                         env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"}, cwd=tmp_path)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stderr[-4000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["columns"] == ["id", "features", "label", "prediction"]
    assert out["max_abs_diff"] < 1e-5  # the same model's own predictions, row for row
    for key in ("loss", "accuracy"):
        assert out["evaluate"][key] == pytest.approx(out["keras"][key], rel=1e-5)
    assert "SparkModel.fit needs a classic SparkSession" in out["fit"] and "Spark Connect client" in out["fit"]
    assert "SparkModel.predict(df)" in out["predict_numpy"]
