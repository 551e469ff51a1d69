"""Shared fixtures of the unit tests."""

from __future__ import annotations

import threading

import numpy as np
import pytest


def _ps_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("elephant-ps"))


@pytest.fixture(autouse=True)
def no_leaked_ps_threads():
    """Fail a test that leaves a parameter-server thread (serve loop or handler) running."""
    before = _ps_threads()
    yield
    leaked = [name for name in _ps_threads() if name not in before]
    assert not leaked, f"parameter-server threads left running: {leaked}"


@pytest.fixture(scope="module")
def linear_data():
    """100 samples of a noiseless 3 -> 2 linear map (for :func:`tests.unit.helpers.tiny_model`)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(100, 3)).astype("float32")
    y = (x @ np.array([[1.0, -1.0], [0.5, 2.0], [0.0, 1.0]], dtype="float32")).astype("float32")
    return x, y
