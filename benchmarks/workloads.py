"""Five convergence workloads, all from data that ships with scikit-learn or is generated here.

Each is compiled the way users compile (a stock Keras optimizer at its usual rate, an
ordinary batch size, nothing tuned per distributed rule). ``make(name, seed)`` returns a
:class:`Workload` with train and test arrays and a function that builds the compiled model
with seeded initial weights, so plain Keras and every distributed configuration start from
the same point.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

__all__ = ["Workload", "make", "NAMES"]


@dataclasses.dataclass
class Workload:
    name: str
    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    build: Callable[[int], object]  # seed -> compiled keras.Model
    metric: str  # key of the figure of merit in Keras' logs
    higher_is_better: bool
    epochs: int
    batch_size: int
    optimizer: str  # how it was compiled, for the report

    def score(self, logs: dict) -> float:
        return float(logs[self.metric])


def _split(x, y, test_fraction=0.25, seed=0):
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(len(x) * (1 - test_fraction))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def _standardise(train, test):
    mean, std = train.mean(axis=0), train.std(axis=0) + 1e-6
    return ((train - mean) / std).astype("float32"), ((test - mean) / std).astype("float32")


def digits(data_seed=0) -> Workload:
    """sklearn's 8x8 digits (1 797 images) with a 64-64-32-10 MLP, ``Adam(1e-3)``, batch 32."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    x, y, xt, yt = _split(x, y, seed=data_seed)

    def build(seed):
        import keras

        keras.utils.set_random_seed(seed)
        model = keras.Sequential([
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ])
        model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    return Workload("digits-mlp", x, y, xt, yt, build, "accuracy", True, 10, 32, "Adam(1e-3)")


def signals(data_seed=0, n=4000, length=64) -> Workload:
    """Generated 1-D signals in 6 classes (frequency and envelope differ) under noise; a
    small Conv1D, ``SGD(0.01, momentum=0.9)``, batch 64."""
    rng = np.random.default_rng(100 + data_seed)
    y = rng.integers(0, 6, size=n)
    t = np.linspace(0.0, 1.0, length, dtype=np.float32)
    freq = np.array([3, 4, 5, 3, 4, 5], dtype=np.float32)[y] + rng.normal(0, 0.3, n)
    envelope = np.where((y >= 3)[:, None], np.exp(-3 * t)[None, :], 1.0)
    phase = rng.uniform(0, 2 * np.pi, n)
    x = envelope * np.sin(2 * np.pi * freq[:, None] * t[None, :] + phase[:, None])
    x = (x + rng.normal(0, 0.6, x.shape)).astype("float32")[..., None]
    x, y, xt, yt = _split(x, y, seed=data_seed)

    def build(seed):
        import keras

        keras.utils.set_random_seed(seed)
        model = keras.Sequential([
            keras.Input((length, 1)),
            keras.layers.Conv1D(16, 5, activation="relu"),
            keras.layers.MaxPooling1D(2),
            keras.layers.Conv1D(16, 5, activation="relu"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(6, activation="softmax"),
        ])
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    return Workload("signals-conv1d", x, y, xt, yt, build, "accuracy", True, 10, 64, "SGD(0.01, momentum=0.9)")


def shapes(data_seed=0, n=4000, size=12) -> Workload:
    """Generated 12x12 images of 4 shapes (bar, cross, box, diagonal) at random places and
    contrast under noise; a small Conv2D, ``RMSprop(1e-3)``, batch 64."""
    rng = np.random.default_rng(200 + data_seed)
    y = rng.integers(0, 4, size=n)
    x = rng.normal(0, 0.5, (n, size, size)).astype("float32")
    for i in range(n):
        r, c = rng.integers(2, size - 3, size=2)
        a = rng.uniform(0.7, 1.5)
        if y[i] == 0:
            x[i, r, c - 2 : c + 3] += a
        elif y[i] == 1:
            x[i, r, c - 1 : c + 2] += a
            x[i, r - 1 : r + 2, c] += a
        elif y[i] == 2:
            x[i, r - 1 : r + 2, c - 1] += a
            x[i, r - 1 : r + 2, c + 1] += a
        else:
            for d in range(-2, 3):
                x[i, r + d, c + d] += a
    x = x[..., None]
    x, y, xt, yt = _split(x, y, seed=data_seed)

    def build(seed):
        import keras

        keras.utils.set_random_seed(seed)
        model = keras.Sequential([
            keras.Input((size, size, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(4, activation="softmax"),
        ])
        model.compile(keras.optimizers.RMSprop(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    return Workload("shapes-conv2d", x, y, xt, yt, build, "accuracy", True, 8, 64, "RMSprop(1e-3)")


def friedman(data_seed=0, n=4000) -> Workload:
    """Friedman #1 regression (10 features, 5 used, noise 1.0), MLP, ``Adam(1e-3)``, batch 32;
    the figure of merit is the test mean squared error."""
    from sklearn.datasets import make_friedman1

    x, y = make_friedman1(n_samples=n, n_features=10, noise=1.0, random_state=300 + data_seed)
    x, y, xt, yt = _split(x.astype("float32"), y.astype("float32"), seed=data_seed)
    x, xt = _standardise(x, xt)

    def build(seed):
        import keras

        keras.utils.set_random_seed(seed)
        model = keras.Sequential([
            keras.Input((10,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(1),
        ])
        model.compile(keras.optimizers.Adam(1e-3), "mse", metrics=["mae"])
        return model

    return Workload("friedman-regression", x, y, xt, yt, build, "loss", False, 10, 32, "Adam(1e-3)")


def overlap(data_seed=0, n=6000) -> Workload:
    """A harder tabular task: 5 overlapping classes (``make_classification``, class_sep 0.7,
    3 % label noise), MLP, ``SGD(0.01, momentum=0.9)``, batch 128."""
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=n, n_features=20, n_informative=8, n_redundant=4, n_classes=5,
                               n_clusters_per_class=2, class_sep=0.7, flip_y=0.03, random_state=400 + data_seed)
    x, y, xt, yt = _split(x.astype("float32"), y, seed=data_seed)
    x, xt = _standardise(x, xt)

    def build(seed):
        import keras

        keras.utils.set_random_seed(seed)
        model = keras.Sequential([
            keras.Input((20,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(5, activation="softmax"),
        ])
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    return Workload("overlap-tabular", x, y, xt, yt, build, "accuracy", True, 12, 128, "SGD(0.01, momentum=0.9)")


_BUILDERS = {"digits-mlp": digits, "signals-conv1d": signals, "shapes-conv2d": shapes,
             "friedman-regression": friedman, "overlap-tabular": overlap}
NAMES = tuple(_BUILDERS)


def make(name: str, data_seed: int = 0) -> Workload:
    return _BUILDERS[name](data_seed)
