"""Backend tests: they run under the process's ``KERAS_BACKEND`` (TensorFlow in the default suite).

CI runs ``KERAS_BACKEND=tensorflow|jax|torch python -m pytest tests/backends``, each in a
fresh process: Keras fixes its backend at import.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


@pytest.fixture(scope="module")
def classes():
    """120 samples of 4 features in 3 classes (two thresholds), features as float32 and labels as int32."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 4)).astype("float32")
    y = ((x[:, 0] > 0).astype("int32") + (x[:, 1] > 1).astype("int32")).astype("int32")
    return x, y


@pytest.fixture(scope="module")
def sequences():
    """80 sequences of 12 steps and 2 channels, labelled by the sign of their first channel's mean."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(80, 12, 2)).astype("float32")
    y = (x[:, :, 0].mean(axis=1) > 0).astype("int32")
    return x, y
