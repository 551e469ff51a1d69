"""Shared fixtures of the unit tests (the leak check is tests/conftest.py's)."""

from __future__ import annotations

import numpy as np
import pytest

from .helpers import RecordingBuilder


@pytest.fixture(scope="module")
def linear_data():
    """100 samples of a noiseless 3 -> 2 linear map (for :func:`tests.unit.helpers.tiny_model`)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(100, 3)).astype("float32")
    y = (x @ np.array([[1.0, -1.0], [0.5, 2.0], [0.0, 1.0]], dtype="float32")).astype("float32")
    return x, y


@pytest.fixture
def no_session(monkeypatch):
    """No active SparkSession or SparkContext; ``SparkSession.builder`` is a :class:`RecordingBuilder` (returned)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    builder = RecordingBuilder()
    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))
    monkeypatch.setattr(SparkSession, "_instantiatedSession", None)
    monkeypatch.setattr(SparkSession, "builder", builder)
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    return builder
