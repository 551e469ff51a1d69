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


def _sequential(layers, optimizer, loss="sparse_categorical_crossentropy", metrics=("accuracy",)):
    """A workload's ``build``: ``seed -> keras.Sequential(layers(keras))`` compiled with ``optimizer(keras)``.

    The seed is set before the layers are made, so every call with a seed starts from the same weights.
    """

    def build(seed):
        import keras

        keras.utils.set_random_seed(seed)
        model = keras.Sequential(layers(keras))
        model.compile(optimizer(keras), loss, metrics=list(metrics))
        return model

    return build


def digits(data_seed=0) -> Workload:
    """sklearn's 8x8 digits (1 797 images) with a 64-64-32-10 MLP, ``Adam(1e-3)``, batch 32."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    x, y, xt, yt = _split(x, y, seed=data_seed)

    build = _sequential(lambda keras: [
        keras.Input((64,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ], lambda keras: keras.optimizers.Adam(1e-3))

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

    build = _sequential(lambda keras: [
        keras.Input((length, 1)),
        keras.layers.Conv1D(16, 5, activation="relu"),
        keras.layers.MaxPooling1D(2),
        keras.layers.Conv1D(16, 5, activation="relu"),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(6, activation="softmax"),
    ], lambda keras: keras.optimizers.SGD(0.01, momentum=0.9))

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

    build = _sequential(lambda keras: [
        keras.Input((size, size, 1)),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(4, activation="softmax"),
    ], lambda keras: keras.optimizers.RMSprop(1e-3))

    return Workload("shapes-conv2d", x, y, xt, yt, build, "accuracy", True, 8, 64, "RMSprop(1e-3)")


def friedman(data_seed=0, n=4000) -> Workload:
    """Friedman #1 regression (10 features, 5 used, noise 1.0), MLP, ``Adam(1e-3)``, batch 32;
    the figure of merit is the test mean squared error."""
    from sklearn.datasets import make_friedman1

    x, y = make_friedman1(n_samples=n, n_features=10, noise=1.0, random_state=300 + data_seed)
    x, y, xt, yt = _split(x.astype("float32"), y.astype("float32"), seed=data_seed)
    x, xt = _standardise(x, xt)

    build = _sequential(lambda keras: [
        keras.Input((10,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(1),
    ], lambda keras: keras.optimizers.Adam(1e-3), "mse", ("mae",))

    return Workload("friedman-regression", x, y, xt, yt, build, "loss", False, 10, 32, "Adam(1e-3)")


def overlap(data_seed=0, n=6000) -> Workload:
    """A harder tabular task: 5 overlapping classes (``make_classification``, class_sep 0.7,
    3 % label noise), MLP, ``SGD(0.01, momentum=0.9)``, batch 128."""
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=n, n_features=20, n_informative=8, n_redundant=4, n_classes=5,
                               n_clusters_per_class=2, class_sep=0.7, flip_y=0.03, random_state=400 + data_seed)
    x, y, xt, yt = _split(x.astype("float32"), y, seed=data_seed)
    x, xt = _standardise(x, xt)

    build = _sequential(lambda keras: [
        keras.Input((20,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(5, activation="softmax"),
    ], lambda keras: keras.optimizers.SGD(0.01, momentum=0.9))

    return Workload("overlap-tabular", x, y, xt, yt, build, "accuracy", True, 12, 128, "SGD(0.01, momentum=0.9)")


def _teacher_labels(x, classes, rng, hidden=64, noise=0.05):
    """Labels from a random two-layer teacher network (argmax of its logits), ``noise`` of them flipped."""
    w1 = rng.normal(0, 1 / np.sqrt(x.shape[1]), (x.shape[1], hidden)).astype("float32")
    w2 = rng.normal(0, 1 / np.sqrt(hidden), (hidden, classes)).astype("float32")
    y = np.argmax(np.tanh(x @ w1) @ w2, axis=1)
    flip = rng.random(len(y)) < noise
    y[flip] = rng.integers(0, classes, size=int(flip.sum()))
    return y


def wide_mlp(data_seed=0, n=100_000, features=128, width=1024, name="teacher-mlp-5mb") -> Workload:
    """10 classes drawn by a random teacher network over ``features`` Gaussian inputs (5 % label
    noise), ``n`` samples; a wide MLP (``features``-``width``-``width``-10: 1.2M parameters, 4.8 MB
    at the defaults), ``Adam(1e-3)``, batch 64, 2 epochs: a megabyte model over big data."""
    rng = np.random.default_rng(500 + data_seed)
    x = rng.normal(0, 1, (n, features)).astype("float32")
    y = _teacher_labels(x, 10, rng)
    x, y, xt, yt = _split(x, y, test_fraction=0.1, seed=data_seed)

    build = _sequential(lambda keras: [
        keras.Input((features,)),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ], lambda keras: keras.optimizers.Adam(1e-3))

    return Workload(name, x, y, xt, yt, build, "accuracy", True, 2, 64, "Adam(1e-3)")


def wide_mlp_xl(data_seed=0) -> Workload:
    """As :func:`wide_mlp` with 256 features and two layers of 2048 (4.7M parameters, 19 MB), 60 000 samples."""
    return wide_mlp(data_seed, n=60_000, features=256, width=2048, name="teacher-mlp-19mb")


def textures(data_seed=0, n=40_000, size=16) -> Workload:
    """Generated 16x16 two-channel textures in 8 classes (orientation and frequency of a grating, under
    noise and random phase); a Conv2D net with a dense head (1.1M parameters, 4.4 MB), ``RMSprop(1e-3)``,
    batch 64, 2 epochs."""
    rng = np.random.default_rng(600 + data_seed)
    y = rng.integers(0, 8, size=n)
    angle = (y % 4) * np.pi / 4 + rng.normal(0, 0.25, n)
    freq = np.where(y < 4, 0.7, 1.0) + rng.normal(0, 0.1, n)
    r, c = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    proj = np.cos(angle)[:, None, None] * r[None] + np.sin(angle)[:, None, None] * c[None]
    phase = rng.uniform(0, 2 * np.pi, n)[:, None, None]
    grating = np.sin(freq[:, None, None] * proj + phase)
    x = np.stack([grating, np.cos(freq[:, None, None] * proj + phase)], axis=-1)
    x = (x * rng.uniform(0.1, 0.5, n)[:, None, None, None] + rng.normal(0, 1.0, x.shape)).astype("float32")
    x, y, xt, yt = _split(x, y, test_fraction=0.1, seed=data_seed)

    build = _sequential(lambda keras: [
        keras.Input((size, size, 2)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(8, activation="softmax"),
    ], lambda keras: keras.optimizers.RMSprop(1e-3))

    return Workload("textures-conv2d", x, y, xt, yt, build, "accuracy", True, 2, 64, "RMSprop(1e-3)")


def sequences(data_seed=0, n=30_000, length=24, features=8) -> Workload:
    """Generated sequences in 6 classes (which two of the input channels carry a delayed echo of each
    other, and at which lag) under noise; a GRU(320) (1.8 MB), ``Adam(1e-3)``, batch 64, 2 epochs."""
    rng = np.random.default_rng(700 + data_seed)
    y = rng.integers(0, 6, size=n)
    x = rng.normal(0, 1, (n, length, features)).astype("float32")
    source, lag = y % 3, 1 + y // 3 * 2
    for i in range(n):
        x[i, lag[i]:, source[i] + 3] += 0.9 * x[i, : length - lag[i], source[i]]
    x, y, xt, yt = _split(x, y, test_fraction=0.1, seed=data_seed)

    build = _sequential(lambda keras: [
        keras.Input((length, features)),
        keras.layers.GRU(320),
        keras.layers.Dense(6, activation="softmax"),
    ], lambda keras: keras.optimizers.Adam(1e-3))

    return Workload("sequences-gru", x, y, xt, yt, build, "accuracy", True, 2, 64, "Adam(1e-3)")


def waves(data_seed=0, n=60_000, length=64) -> Workload:
    """Generated 1-D signals in 10 classes (five frequencies, constant or decaying envelope) under noise,
    60 000 samples: big data for a small Conv1D (4k parameters), ``SGD(0.01, momentum=0.9)``, batch 64,
    one epoch (the regime where one commit per pass gives one outer step)."""
    rng = np.random.default_rng(800 + data_seed)
    y = rng.integers(0, 10, size=n)
    t = np.linspace(0.0, 1.0, length, dtype=np.float32)
    freq = (2.0 + (y % 5)) + rng.normal(0, 0.35, n)
    envelope = np.where((y >= 5)[:, None], np.exp(-2.5 * t)[None, :], 1.0)
    phase = rng.uniform(0, 2 * np.pi, n)[:, None]
    x = envelope * np.sin(2 * np.pi * freq[:, None] * t[None, :] + phase) + rng.normal(0, 0.9, (n, length))
    x, y, xt, yt = _split(x.astype("float32")[..., None], y, test_fraction=0.1, seed=data_seed)

    build = _sequential(lambda keras: [
        keras.Input((length, 1)),
        keras.layers.Conv1D(16, 5, activation="relu"),
        keras.layers.MaxPooling1D(2),
        keras.layers.Conv1D(32, 5, activation="relu"),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(10, activation="softmax"),
    ], lambda keras: keras.optimizers.SGD(0.01, momentum=0.9))

    return Workload("waves-conv1d", x, y, xt, yt, build, "accuracy", True, 1, 64, "SGD(0.01, momentum=0.9)")


def sequences_one_pass(data_seed=0) -> Workload:
    """As :func:`sequences` over 150 000 samples (135 000 to train on), trained for one epoch: one pass over
    big data with an adaptive optimizer, where the first epoch's end is also the fit's."""
    return dataclasses.replace(sequences(data_seed, n=150_000), name="sequences-gru-1pass", epochs=1)


def textures_one_pass(data_seed=0) -> Workload:
    """As :func:`textures` over 160 000 samples (144 000 to train on), trained for one epoch (``RMSprop``)."""
    return dataclasses.replace(textures(data_seed, n=160_000), name="textures-conv2d-1pass", epochs=1)


_BUILDERS = {"digits-mlp": digits, "signals-conv1d": signals, "shapes-conv2d": shapes,
             "friedman-regression": friedman, "overlap-tabular": overlap,
             "teacher-mlp-5mb": wide_mlp, "teacher-mlp-19mb": wide_mlp_xl, "textures-conv2d": textures,
             "sequences-gru": sequences, "waves-conv1d": waves,
             "sequences-gru-1pass": sequences_one_pass, "textures-conv2d-1pass": textures_one_pass}
NAMES = tuple(_BUILDERS)
#: The small workloads of the first campaign (kilobyte models, 5-20 epochs over a few thousand samples).
SMALL = NAMES[:5]
#: Models of 1-20 MB over 27 000-90 000 samples, and a small model over 54 000, trained for 1-2 epochs.
LARGE = NAMES[5:10]
#: One pass over 135 000-144 000 samples with an adaptive optimizer (the GRU and the Conv2D above).
ONE_PASS = NAMES[10:]


def make(name: str, data_seed: int = 0) -> Workload:
    return _BUILDERS[name](data_seed)
