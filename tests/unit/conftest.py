"""Shared fixtures of the unit tests."""

from __future__ import annotations

import threading

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
