"""A quiet console: TensorFlow's native start-up lines and Spark job names (no SparkSession)."""

import os
import subprocess
import sys

import pytest

from elephant import console, session

ABSL = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
INFO = "I0000 00:00:1795547222.569274   31416 port.cc:153] oneDNN custom operations are on.\n"
WARN = "W0000 00:00:1795547222.571346   31416 cuda_executor.cc:1] no GPU\n"
ERROR = "E0000 00:00:1795547222.571346   31416 cuda_driver.cc:152] failed call to cuInit\n"
PYTHON = "Traceback (most recent call last):\n"


def kept(level, lines):
    keep = console.native_log_filter(level)
    return [line for line in lines if keep(line)]


@pytest.mark.parametrize("level, expected", [
    (0, [ABSL, INFO, WARN, ERROR, PYTHON]),
    (1, [WARN, ERROR, PYTHON]),
    (2, [ERROR, PYTHON]),
    (3, [PYTHON]),
])
def test_native_records_below_the_level_are_dropped_and_other_lines_kept(level, expected):
    assert kept(level, [ABSL, INFO, WARN, ERROR, PYTHON]) == expected


@pytest.mark.parametrize("value, level", [(None, 0), ("2", 2), ("3", 3), ("-1", 0), ("loud", 0)])
def test_tf_log_level_reads_the_variable(value, level):
    assert console.tf_log_level({} if value is None else {"TF_CPP_MIN_LOG_LEVEL": value}) == level


def test_quiet_import_filters_file_descriptor_2_and_keeps_the_rest(capfd):
    with console.quiet_tensorflow_import({"TF_CPP_MIN_LOG_LEVEL": "2"}):
        os.write(2, (ABSL + INFO + WARN + ERROR + PYTHON).encode())
    assert capfd.readouterr().err == ERROR + PYTHON


def test_quiet_import_at_level_0_changes_nothing_and_an_error_still_propagates(capfd):
    with console.quiet_tensorflow_import({"TF_CPP_MIN_LOG_LEVEL": "0"}):
        os.write(2, INFO.encode())
    assert capfd.readouterr().err == INFO
    with pytest.raises(ImportError):
        with console.quiet_tensorflow_import({"TF_CPP_MIN_LOG_LEVEL": "3"}):
            os.write(2, (INFO + PYTHON).encode())
            raise ImportError("no tensorflow")
    assert capfd.readouterr().err == PYTHON  # written back before the error leaves the block


@pytest.mark.parametrize("env, expected", [({}, "3"), ({"TF_CPP_MIN_LOG_LEVEL": "1"}, "1")])
def test_the_embedded_session_passes_the_tf_level_to_its_workers_without_overriding_the_users(env, expected):
    settings = session.session_settings({}, env)
    assert settings["spark.executorEnv.TF_CPP_MIN_LOG_LEVEL"] == expected
    conf = {"spark.executorEnv.TF_CPP_MIN_LOG_LEVEL": "0"}
    assert "spark.executorEnv.TF_CPP_MIN_LOG_LEVEL" not in session.session_settings(conf, env)


@pytest.mark.parametrize("user_level", [None, "0"])
def test_the_daemon_imports_tensorflow_quietly_unless_the_user_asked_for_its_logs(user_level):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    if user_level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = user_level
    code = "import os, elephant.daemon; print(os.environ['TF_CPP_MIN_LOG_LEVEL'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=True)
    assert out.stdout.split() == [user_level or "3"]
    if user_level is None:
        assert "absl::InitializeLog" not in out.stderr
        assert not [line for line in out.stderr.splitlines() if line[:1] in "IW" and line[1:5].isdigit()]


class FakeContext:
    """``getLocalProperty``/``setLocalProperty`` of a SparkContext, one thread."""

    def __init__(self):
        self.properties = {}
        self.seen = []

    def getLocalProperty(self, key):
        return self.properties.get(key)

    def setLocalProperty(self, key, value):
        if value is None:
            self.properties.pop(key, None)
        else:
            self.properties[key] = value

    def setJobDescription(self, value):
        self.setLocalProperty("spark.job.description", value)

    def run_job(self):
        self.seen.append(self.properties.get("spark.job.description"))


def test_job_description_names_the_jobs_of_the_block_and_restores_the_previous_one():
    sc = FakeContext()
    sc.setJobDescription("elephant fit 1a2b")  # what setJobGroup leaves
    with session.job_description(sc, "elephant fit 1a2b: epoch 1/3"):
        sc.run_job()
    sc.run_job()
    with pytest.raises(RuntimeError):
        with session.job_description(sc, "elephant fit 1a2b: epoch 2/3"):
            sc.run_job()
            raise RuntimeError("task failed")
    assert sc.seen == ["elephant fit 1a2b: epoch 1/3", "elephant fit 1a2b", "elephant fit 1a2b: epoch 2/3"]
    assert sc.properties == {"spark.job.description": "elephant fit 1a2b"}


def test_job_description_removes_itself_when_there_was_none():
    sc = FakeContext()
    with session.job_description(sc, "elephant predict"):
        sc.run_job()
    assert sc.seen == ["elephant predict"] and sc.properties == {}
