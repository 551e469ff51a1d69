"""The session elephant makes, seen from a plain script: nothing of Spark's on stderr, active in the user's thread,
with the heap elephant gives a local JVM.

One subprocess (one JVM start): a script with no Spark configuration of its own
fits with ``verbose=1``, then with ``verbose=0``, on the embedded session.
"""

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

import elephant
from elephant import launch

_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import keras
    from pyspark.sql import SparkSession
    from elephant import SparkModel

    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    sm = SparkModel(model, num_workers=2)  # no session given or active: the warm-up's thread makes the embedded one
    print("FIT verbose=1", flush=True)
    sm.fit(x, y, epochs=2, batch_size=32, verbose=1)
    active = SparkSession.getActiveSession()
    print("ACTIVE", active is not None and active is sm.spark, sm.spark.sparkContext.master, flush=True)
    print("HEAP", sm.spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory() // 2**20, flush=True)
    print("FIT verbose=0", flush=True)
    sm.fit(x, y, epochs=1, batch_size=32, verbose=0)
    print("DONE", flush=True)
""")

#: What Spark's logging and launcher print (log4j's console pattern included); the JVM's own
#: "WARNING: Using incubator modules: jdk.incubator.vector" (Spark 4's launcher adds the module) is not
#: a log line and no option silences it.
SPARK_LINE = re.compile(
    r"log4j|Setting default log level|setLogLevel|Setting Spark log level|NativeCodeLoader|resolves to a loopback"
    r"|SPARK_LOCAL_IP|^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ")

#: Spark variables the test run sets (tests/conftest.py) or a developer may have: the script configures nothing.
UNSET = ("SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME", "SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS", "MASTER",
         "PYSPARK_GATEWAY_PORT", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS")


@pytest.mark.timeout(400)
def test_a_plain_script_shows_keras_progress_and_nothing_of_sparks_and_sees_the_session(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(_SCRIPT)
    root = str(pathlib.Path(elephant.__file__).parents[1])
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env.update(PYTHONPATH=os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=360, env=env,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]

    spark_lines = [line for line in run.stderr.splitlines() if SPARK_LINE.search(line)]
    assert spark_lines == [], run.stderr
    out = run.stdout
    verbose, quiet = out.split("FIT verbose=0")
    assert "Epoch 1/2" in verbose and "Epoch 2/2" in verbose and "loss:" in verbose  # Keras' own progress bar
    assert quiet.strip().splitlines() == ["DONE"]  # verbose=0: nothing at all
    assert "ACTIVE True local[*]" in verbose  # getActiveSession() in the user's thread is the session elephant made
    # the JVM that holds every worker's data got the larger heap (Spark's default is 1 GiB, ~910 MiB usable)
    heap = int(re.search(r"^HEAP (\d+)$", verbose, re.M).group(1))
    assert heap >= 0.9 * int(launch.local_driver_memory()[:-1]), verbose
