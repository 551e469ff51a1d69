"""Shared test settings: quiet TensorFlow, loopback-only Spark, leak checks."""

import os
import sys
import threading

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def _ps_threads():
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("elephant-ps"))


@pytest.fixture(autouse=True)
def no_leaked_parameter_server():
    """Fail a test that leaves a parameter-server thread running."""
    before = set(_ps_threads())
    yield
    leaked = [name for name in _ps_threads() if name not in before]
    assert not leaked, f"parameter-server threads left running: {leaked}"
