"""Which master the session elephant makes runs on, and what elephant adds to it (no JVM started)."""

import os
import sys

import pytest

from elephant import session

SUBMITTED = {"PYSPARK_GATEWAY_PORT": "40000"}  # the driver runs under spark-submit
PLAIN = {}  # plain python: PySpark starts the JVM as "spark-submit pyspark-shell"
SHELL_CONF = {"spark.master": "local[*]", "spark.app.name": "pyspark-shell", "spark.ui.showConsoleProgress": "true",
              "spark.submit.deployMode": "client"}


@pytest.mark.parametrize("conf, env, expected", [
    ({}, PLAIN, None),
    (SHELL_CONF, PLAIN, None),  # spark-submit's own default, not the user's
    ({**SHELL_CONF, "spark.master": "spark://head:7077"}, PLAIN, "spark://head:7077"),  # spark-defaults.conf
    ({**SHELL_CONF, "spark.master": "local[3]"}, PLAIN, "local[3]"),
    ({}, {"MASTER": "yarn"}, "yarn"),  # a conf not read from a JVM
    ({"spark.master": "spark://127.0.0.1:7077", "spark.app.name": "digits_mlp.py"}, SUBMITTED, "spark://127.0.0.1:7077"),
    ({"spark.master": "local[*]"}, SUBMITTED, "local[*]"),  # spark-submit --master local[*] script.py
])
def test_configured_master_reads_the_launch_conf_and_ignores_spark_submits_default(conf, env, expected):
    assert session.configured_master(conf, env) == expected


def test_without_a_master_the_embedded_session_is_local_on_loopback_and_quiet():
    settings = session.session_settings(SHELL_CONF, PLAIN)
    assert settings["spark.master"] == "local[*]" and settings["spark.app.name"] == "elephant"
    assert settings["spark.driver.host"] == settings["spark.driver.bindAddress"] == "127.0.0.1"
    assert settings["spark.ui.enabled"] == "false"
    assert settings["spark.ui.showConsoleProgress"] == "false"  # the shell's "true" is Spark's default
    assert settings["spark.log.level"] == "ERROR"
    assert settings["spark.python.daemon.module"] == "elephant.daemon"
    assert settings["spark.executorEnv.TF_CPP_MIN_LOG_LEVEL"] == "3"


def test_a_configured_cluster_master_keeps_the_users_configuration():
    conf = {"spark.master": "spark://10.0.0.1:7077", "spark.app.name": "digits_mlp.py", "spark.executor.memory": "4g"}
    settings = session.session_settings(conf, SUBMITTED)
    assert settings == {"spark.ui.showConsoleProgress": "false"}  # no master, no loopback, no daemon, no log level


@pytest.mark.parametrize("master", ["yarn", "k8s://https://api:6443", "local-cluster[2,1,1024]", "spark://127.0.0.1:7077"])
def test_loopback_is_never_forced_on_a_cluster_master(master):
    settings = session.session_settings({**SHELL_CONF, "spark.master": master}, PLAIN)
    assert not {"spark.master", "spark.driver.host", "spark.driver.bindAddress"} & set(settings)
    assert settings["spark.app.name"] == "elephant"  # the shell's "pyspark-shell" is not a name the user chose


def test_settings_the_user_configured_are_kept():
    conf = {"spark.master": "spark://head:7077", "spark.ui.showConsoleProgress": "true"}
    assert "spark.ui.showConsoleProgress" not in session.session_settings(conf, SUBMITTED)
    local = {"spark.master": "local[4]", "spark.driver.host": "10.0.0.5", "spark.log.level": "INFO",
             "spark.executorEnv.TF_CPP_MIN_LOG_LEVEL": "0"}
    settings = session.session_settings(local, SUBMITTED)
    assert "spark.master" not in settings  # local[4] stays, from the conf
    assert not {"spark.driver.host", "spark.log.level", "spark.executorEnv.TF_CPP_MIN_LOG_LEVEL"} & set(settings)
    assert settings["spark.driver.bindAddress"] == "127.0.0.1"


def test_spark_submit_master_is_not_overridden(no_session, monkeypatch):
    conf = {"spark.master": "spark://127.0.0.1:7077", "spark.app.name": "digits_mlp.py",
            "spark.driver.host": "127.0.0.1"}
    monkeypatch.setattr(session, "launch_conf", lambda: conf)
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "40000")
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/cluster/python")
    assert session.get_or_create() is no_session
    assert no_session.settings == {"spark.ui.showConsoleProgress": "false"}
    assert os.environ["PYSPARK_PYTHON"] == "/opt/cluster/python"


def test_a_cluster_session_leaves_pyspark_python_to_the_cluster(no_session, monkeypatch):
    monkeypatch.setattr(session, "launch_conf", lambda: {**SHELL_CONF, "spark.master": "yarn"})
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    session.get_or_create()
    assert "PYSPARK_PYTHON" not in os.environ  # the driver's interpreter path means nothing on the executors
    assert "master" not in no_session.settings and no_session.settings["app"] == "elephant"


def test_no_master_builds_the_embedded_session(no_session, monkeypatch):
    monkeypatch.setattr(session, "launch_conf", lambda: dict(SHELL_CONF))
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    session.get_or_create()
    assert no_session.settings["master"] == "local[*]" and no_session.settings["app"] == "elephant"
    assert no_session.settings["spark.driver.host"] == "127.0.0.1"
    assert os.environ["PYSPARK_PYTHON"] == sys.executable


def test_a_context_without_a_session_is_wrapped_as_it_is(no_session, monkeypatch):
    from pyspark import SparkContext

    monkeypatch.setattr(SparkContext, "_active_spark_context", object())
    monkeypatch.setattr(session, "launch_conf", lambda: pytest.fail("the running context's conf is final"))
    assert session.get_or_create() is no_session and no_session.settings == {}


class FakeContext:
    def __init__(self, master, conf):
        self.master, self._conf = master, conf

    def getConf(self):
        return self

    def get(self, key, default=None):
        return self._conf.get(key, default)


@pytest.mark.parametrize("master, conf, expected", [
    ("spark://127.0.0.1:7077", {"spark.driver.host": "127.0.0.1"}, "127.0.0.1"),  # the CI standalone cluster
    ("spark://head:7077", {"spark.driver.host": "10.0.0.5"}, "10.0.0.5"),
    ("yarn", {"spark.driver.host": "edge-1.example"}, "edge-1.example"),
    ("local[4]", {"spark.driver.host": "10.0.0.5"}, "127.0.0.1"),
])
def test_the_parameter_server_host_follows_spark_driver_host_off_local(master, conf, expected):
    assert session.ps_host(FakeContext(master, conf)) == expected


def test_a_connect_session_is_refused_at_once_where_a_spark_context_is_needed():
    import pytest as _pytest

    from elephant import session
    from elephant.errors import ConfigError

    class ConnectSession:  # stands for pyspark.sql.connect.session.SparkSession
        pass

    ConnectSession.__module__ = "pyspark.sql.connect.session"

    class ClassicSession:
        pass

    ClassicSession.__module__ = "pyspark.sql.session"
    assert session.is_connect(ConnectSession()) and not session.is_connect(ClassicSession())
    session.require_classic(ClassicSession(), "SparkModel.fit")  # nothing to say
    with _pytest.raises(ConfigError, match=r"SparkModel.fit needs a classic SparkSession .* Spark Connect client.*"
                                           r"SparkModel.predict\(df\), SparkModel.evaluate\(df\)"):
        session.require_classic(ConnectSession(), "SparkModel.fit")
