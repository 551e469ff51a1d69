"""One local SparkSession for the whole integration run.

``local[2,4]``: two task slots and up to four attempts per task, so the retry
tests see real Spark retries; nothing else fails, so it behaves as ``local[2]``.
"""

import os
import sys

import pytest


def pytest_collection_modifyitems(items):
    """Mark every test under tests/integration ``integration`` (``-m 'not integration'`` leaves them out)."""
    for item in items:
        if "tests/integration" in item.path.as_posix():
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("elephant-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.daemon.module", "elephant.daemon")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def digits():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    return train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
