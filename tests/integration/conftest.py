"""One local SparkSession for the whole integration run.

``local[2,4]``: two task slots and up to four attempts per task, so the retry
tests see real Spark retries; nothing else fails, so it behaves as ``local[2]``.
"""

import pytest

from .helpers import digits_split, local_session


def pytest_collection_modifyitems(items):
    """Mark every test under tests/integration ``integration`` (``-m 'not integration'`` leaves them out)."""
    for item in items:
        if "tests/integration" in item.path.as_posix():
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def spark():
    session = local_session("local[2,4]", "elephant-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def digits():
    return digits_split()
