"""elephant from a Spark Connect client, against a Connect server started from the pyspark wheel.

The server (``sbin/start-connect-server.sh``, ``local[2]``, loopback) runs in its
own process group; the client is a separate Python process, as a notebook talking
to a cluster would be. It trains a small model with plain Keras, then asks
elephant to predict on and evaluate a DataFrame through Connect (DataFrame APIs
only: an Arrow UDF and ``mapInArrow``), and to train on it in both modes: each
epoch a barrier ``mapInArrow`` stage whose first task hosts the parameter
server, or the first two tasks the two shards of a sharded one (byte-identical weights
through one server and through two). A fault in one epoch is rolled back and trained
again, also where the failed task hosted a shard; numpy input is
refused at once, saying what to use instead. A second client runs a sweep over a
DataFrame against the same server: concurrent trials, a pruned one, and a trial
past its time limit interrupted through its tag.
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

import grpc  # noqa: F401  the Spark Connect client's transport: pyspark[connect], in the dev extra
import pyspark
import pytest

SPARK_HOME = Path(pyspark.__file__).resolve().parent
START = SPARK_HOME / "sbin" / "start-connect-server.sh"
BUDGET = 300.0

pytestmark = pytest.mark.skipif(not START.exists(), reason=f"the pyspark wheel has no {START}")

CLIENT = r'''
import hashlib, json, os, sys
import numpy as np
import keras
import pyarrow as pa
from pyspark.sql import SparkSession
from sklearn.datasets import load_digits

from elephant import SparkModel
from elephant.errors import ConfigError, FitError

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
for name, call in (("fit_numpy", lambda: sm.fit(x, y, epochs=1)), ("predict_numpy", lambda: sm.predict(x)),
                   ("fit_on_driver", lambda: SparkModel(model, spark=spark, ps_placement="driver").fit(df, epochs=1))):
    try:
        call()
        out[name] = None
    except ConfigError as exc:
        out[name] = str(exc)


def fit(mode, epochs=3, **kwargs):
    keras.utils.set_random_seed(0)
    net = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                            keras.layers.Dense(10, activation="softmax")])
    net.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    trainer = SparkModel(net, spark=spark, mode=mode, num_workers=2, **kwargs)
    history = trainer.fit(df, epochs=epochs, batch_size=64, verbose=0, validation_data=(x[:300], y[:300]))
    return {"history": history.history, "accuracy": net.evaluate(x, y, verbose=0, return_dict=True)["accuracy"],
            "commits": trainer.last_metrics["commits_applied"], "ledger": len(trainer.last_ledger),
            "rolled_back": trainer.last_metrics["epochs_rolled_back"], "plan": trainer.fit_plan["num_workers"],
            "shards": trainer.fit_plan["ps_shards"],
            "weights": hashlib.sha256(b"".join(w.tobytes() for w in net.get_weights())).hexdigest()}


out["fits"] = {mode: fit(mode) for mode in ("synchronous", "asynchronous")}
# one epoch (every replica starts afresh) through one server and through two shards, each in a worker's task
out["sharded"] = {shards: fit("synchronous", epochs=1, frequency=4, ps_shards=shards) for shards in (1, 2)}
os.environ["ELEPHANT_FAULT"] = f"partition=1,step=2,kind=raise,marker={sys.argv[2]}"  # once: the epoch is trained again
out["fault_once"] = fit("synchronous", epochs=2)
os.environ["ELEPHANT_FAULT"] = f"partition=1,step=2,kind=raise,marker={sys.argv[2]}-sharded"  # shard 1's host fails
out["fault_sharded"] = fit("asynchronous", epochs=2, ps_shards=2)
os.environ["ELEPHANT_FAULT"] = "partition=1,step=2,kind=raise"  # on every try
try:
    fit("synchronous", epochs=2, epoch_retries=1)
    out["fault_always"] = None
except FitError as exc:
    out["fault_always"] = str(exc)
print("RESULT " + json.dumps(out))
'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """One Connect server for the module's tests, each of which runs its own client process."""
    tmp_path = tmp_path_factory.mktemp("connect-server")
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
def test_a_connect_client_predicts_evaluates_and_trains_on_dataframes(connect_server, tmp_path):
    url, env = connect_server
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    run = subprocess.run([sys.executable, str(script), url, str(tmp_path / "fault-marker")], capture_output=True, text=True, timeout=BUDGET,
                         env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"}, cwd=tmp_path)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stderr[-4000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["columns"] == ["id", "features", "label", "prediction"]
    assert out["max_abs_diff"] < 1e-5  # the same model's own predictions, row for row
    for key in ("loss", "accuracy"):
        assert out["evaluate"][key] == pytest.approx(out["keras"][key], rel=1e-5)
    assert "under Spark Connect SparkModel.fit trains on a DataFrame" in out["fit_numpy"]
    assert "SparkModel.predict(df)" in out["predict_numpy"]
    assert "received ps_placement='driver'" in out["fit_on_driver"]
    for mode, result in out["fits"].items():  # each epoch a barrier stage whose task 0 hosts the server
        losses = result["history"]["loss"]
        assert losses[2] < losses[1] < losses[0], (mode, losses)
        assert result["accuracy"] > 0.85, (mode, result)
        assert result["history"]["val_accuracy"][-1] > 0.8, (mode, result)
        assert result["commits"] > 0 and result["ledger"] == result["commits"] and result["plan"] == 2, (mode, result)
    once = out["fault_once"]
    assert once["rolled_back"] == 1 and len(once["history"]["loss"]) == 2 and once["accuracy"] > 0.7, once
    one, two = out["sharded"]["1"], out["sharded"]["2"]  # JSON keys
    assert (one["shards"], two["shards"]) == (1, 2) and two["commits"] == one["commits"] > 0, (one, two)
    assert two["weights"] == one["weights"], (one, two)  # the same rounds, byte for byte, through two shard hosts
    sharded = out["fault_sharded"]  # the task hosting shard 1 failed: the epoch rolled back on both shards
    assert sharded["shards"] == 2 and sharded["rolled_back"] == 1 and sharded["accuracy"] > 0.7, sharded
    assert sharded["ledger"] == sharded["commits"] and len(sharded["history"]["loss"]) == 2, sharded
    assert "epoch 1 of 2 failed in Spark 2 times" in out["fault_always"], out["fault_always"]
    assert "injected fault in partition 1" in out["fault_always"], out["fault_always"]


SWEEP_CLIENT = r"""
import json, sys, time
import numpy as np
import keras
import optuna
import pyarrow as pa
from pyspark.sql import SparkSession
from sklearn.datasets import load_digits

from elephant.errors import ConfigError
from elephant.search import hp, minimize


class PruneAt(optuna.pruners.BasePruner):
    def __init__(self, numbers, step):
        self.numbers, self.step = set(numbers), step

    def prune(self, study, trial):
        return trial.number in self.numbers and trial.last_step is not None and trial.last_step >= self.step


def build(units, lr=1e-2):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(units, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(lr), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def frame(x, y):
    offsets = np.arange(0, x.size + 1, 64, dtype=np.int32)
    features = pa.ListArray.from_arrays(pa.array(offsets), pa.array(x.ravel()))
    return spark.createDataFrame(pa.table({"features": features, "label": pa.array(y)}).to_pandas())


spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
x, y = load_digits(return_X_y=True)
x = (x / 16.0).astype("float32")
space = {"units": hp.choice("units", [16, 32]), "lr": hp.loguniform("lr", np.log(3e-3), np.log(3e-2))}
out = {}
result = minimize(build, space, frame(x[:1400], y[:1400]), max_evals=3, parallelism=2, pruner=PruneAt({1}, 1),
                  metric="val_accuracy", mode="max", validation_data=(x[1400:], y[1400:]), epochs=3, num_workers=1,
                  batch_size=32, seed=0, verbose=0, spark=spark)
first, second = result.trials[:2]
out["sweep"] = {"status": [t.status for t in result.trials], "epochs": [t.epochs for t in result.trials],
                "errors": [t.error for t in result.trials], "best": result.best_score,
                "overlap": second.start < first.start + first.duration}
try:
    minimize(build, space, x, y, max_evals=1, epochs=1, metric="loss", spark=spark)
    out["numpy"] = None
except ConfigError as exc:
    out["numpy"] = str(exc)
# One epoch of about 21,000 single-sample steps, each a commit to the task-hosted server, outlasts
# the trial's time limit by far: only interrupting the operations of the trial's tag ends it in time.
# The client's store takes an epoch's commits only when its stage succeeds: none, if the stage was interrupted.
from elephant.search.job import FitJob
jobs, fit = [], FitJob.fit
FitJob.fit = lambda job, *args: (jobs.append(job), fit(job, *args))[1]
t0 = time.monotonic()
timed = minimize(build, {"units": hp.choice("units", [8])}, frame(np.tile(x, (12, 1)), np.tile(y, 12)), max_evals=1,
                 trial_timeout=6, metric="loss", epochs=1, batch_size=1, frequency="batch", num_workers=1, seed=0,
                 verbose=0, spark=spark)
metrics = jobs[-1].sm.last_metrics if jobs and jobs[-1].sm is not None else None
out["timeout"] = {"seconds": time.monotonic() - t0, "status": timed.trials[0].status, "error": timed.trials[0].error,
                  "jobs": len(jobs), "commits": None if metrics is None else metrics["commits_applied"]}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.timeout(BUDGET + 30)
def test_a_connect_client_sweeps_over_a_dataframe_and_cancels_a_trial_by_its_tag(connect_server, tmp_path):
    url, env = connect_server
    script = tmp_path / "sweep_client.py"
    script.write_text(SWEEP_CLIENT)
    run = subprocess.run([sys.executable, str(script), url], capture_output=True, text=True, timeout=BUDGET,
                         env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"}, cwd=tmp_path)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stderr[-4000:]
    out = json.loads(lines[-1][len("RESULT "):])
    sweep = out["sweep"]
    assert sweep["status"] == ["ok", "pruned", "ok"], sweep["errors"]
    assert sweep["epochs"] == [3, 1, 3] and sweep["best"] > 0.8 and sweep["overlap"], sweep
    assert "under Spark Connect a search trains on a DataFrame" in out["numpy"]
    timed = out["timeout"]
    assert timed["status"] == "timeout" and "time limit reached" in timed["error"], timed
    assert timed["jobs"] == 1 and timed["commits"] == 0, timed  # the epoch's stage was interrupted, not waited for
