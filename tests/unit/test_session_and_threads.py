"""The embedded SparkSession's settings and the worker's TensorFlow thread limit (no JVM started)."""

import os
import subprocess
import sys

import pytest

from elephant import session


def test_with_no_active_session_an_embedded_local_one_is_built_on_loopback(no_session, monkeypatch):
    builder = no_session
    # nothing configured: no JVM is started, and a master left by earlier sessions of this process
    # (the integration tests run first in the full suite) does not leak in
    monkeypatch.setattr(session, "launch_conf", lambda: {})
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.delenv("MASTER", raising=False)
    assert session.get_or_create() is builder
    assert builder.settings["master"] == "local[*]"
    assert builder.settings["spark.ui.enabled"] == "false"
    assert builder.settings["spark.driver.host"] == builder.settings["spark.driver.bindAddress"] == "127.0.0.1"
    assert builder.settings["spark.python.daemon.module"] == "elephant.daemon"
    assert os.environ["PYSPARK_PYTHON"] == sys.executable


def test_an_active_session_is_used_and_pyspark_python_is_left_alone(monkeypatch):
    from pyspark.sql import SparkSession

    active = object()
    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: active))
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python-of-the-cluster")
    assert session.get_or_create() is active
    assert os.environ["PYSPARK_PYTHON"] == "/opt/python-of-the-cluster"


class FakeContext:
    def __init__(self, master, conf):
        self.master, self._conf = master, conf
        self.defaultParallelism = int(conf.get("parallelism", 4))

    def getConf(self):
        return self

    def get(self, key, default=None):
        return self._conf.get(key, default)


@pytest.mark.parametrize("master, host, expected", [
    ("local[2]", "10.0.0.5", "127.0.0.1"),
    ("local-cluster[2,1,1024]", "10.0.0.5", "10.0.0.5"),
    ("spark://head:7077", "10.0.0.5", "10.0.0.5"),
])
def test_the_parameter_server_binds_where_executors_reach_the_driver(master, host, expected):
    assert session.ps_host(FakeContext(master, {"spark.driver.host": host})) == expected


def test_task_slots_divide_parallelism_by_cpus_per_task():
    assert session.task_slots(FakeContext("local[8]", {"parallelism": 8, "spark.task.cpus": "2"})) == 4
    assert session.task_slots(FakeContext("local[1]", {"parallelism": 1, "spark.task.cpus": "4"})) == 1
    # a conf the caller read already wins over the context's (a fit reads it once)
    assert session.task_slots(FakeContext("local[8]", {"parallelism": 8}), {"spark.task.cpus": "4"}) == 2


def test_limit_threads_sets_tensorflow_pools_to_the_task_cores():
    code = (
        "from elephant.replicas import limit_threads\n"
        "limit_threads(1)\n"
        "import tensorflow as tf\n"
        "print(tf.config.threading.get_intra_op_parallelism_threads(),"
        " tf.config.threading.get_inter_op_parallelism_threads())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_NUM_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=True)
    assert out.stdout.split() == ["1", "1"]


def test_ctrl_c_in_a_fit_cancels_its_job_group_from_another_thread_then_interrupts():
    import signal
    import threading

    import pytest

    cancelled = []

    class Context:
        def cancelJobGroup(self, group):
            cancelled.append((group, threading.current_thread() is threading.main_thread()))

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with session.interrupt_cancels(Context(), "elephant-run") as interrupted:
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, and returns
            deadline = time.monotonic() + 5
            while not cancelled and time.monotonic() < deadline:
                time.sleep(0.01)
            assert interrupted.is_set()
    assert cancelled == [("elephant-run", False)]  # not from the handler's (main) thread
    assert signal.getsignal(signal.SIGINT) is before
    with session.interrupt_cancels(Context(), "g") as interrupted:  # no Ctrl-C: nothing happens
        pass
    assert not interrupted.is_set() and len(cancelled) == 1


def test_a_session_made_in_another_thread_becomes_active_in_the_callers(monkeypatch):
    import types

    from pyspark.sql import SparkSession

    made_active = []

    class JavaSessionClass:
        def setActiveSession(self, jsession):
            made_active.append(jsession)

    spark = SparkSession.__new__(SparkSession)  # a classic session object, no JVM behind it
    spark._sc, spark._jsparkSession = types.SimpleNamespace(_jvm="jvm"), "the JVM's session"
    monkeypatch.setattr(SparkSession, "_get_j_spark_session_class", staticmethod(lambda jvm: JavaSessionClass()),
                        raising=False)
    monkeypatch.setattr(SparkSession, "_activeSession", None)
    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))  # this thread has none
    assert session.make_active(spark) is True
    assert made_active == ["the JVM's session"] and SparkSession._activeSession is spark

    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: object()))  # this thread has one
    assert session.make_active(spark) is False and len(made_active) == 1
    assert session.make_active(object()) is False  # not a classic session (a stand-in, or Connect)
