"""Small seeded Keras models for the backend tests: each build of one name and seed has the same weights."""

from __future__ import annotations

import keras


def optimizer(name: str):
    """``"adam"``: Adam(1e-2); ``"momentum"``: SGD(0.05, momentum=0.9)."""
    if name == "adam":
        return keras.optimizers.Adam(1e-2)
    if name == "momentum":
        return keras.optimizers.SGD(0.05, momentum=0.9)
    raise ValueError(f"`name` must be 'adam' or 'momentum'; received name={name!r}")


def build(kind: str, opt: str = "adam", seed: int = 0):
    """A compiled classifier: ``dense`` (4 features), ``batchnorm`` and ``dropout`` (Dense ones with a
    BatchNormalization or a Dropout layer), ``conv1d`` and ``gru`` (12 x 2 sequences)."""
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    if kind == "dense":
        stack = [keras.Input((4,)), layers.Dense(8, activation="relu"), layers.Dense(3, activation="softmax")]
    elif kind == "batchnorm":
        stack = [keras.Input((4,)), layers.Dense(8), layers.BatchNormalization(), layers.Activation("relu"),
                 layers.Dense(3, activation="softmax")]
    elif kind == "dropout":  # seeded: unseeded Dropout on torch draws from torch's global generator, which
        # fit's DataLoader also draws from, so only a seeded one (SeedGenerator state) can match fit there
        stack = [keras.Input((4,)), layers.Dense(16, activation="relu"), layers.Dropout(0.3, seed=7),
                 layers.Dense(3, activation="softmax")]
    elif kind == "conv1d":
        stack = [keras.Input((12, 2)), layers.Conv1D(4, 3, activation="relu"), layers.GlobalAveragePooling1D(),
                 layers.Dense(2, activation="softmax")]
    elif kind == "gru":
        stack = [keras.Input((12, 2)), layers.GRU(4), layers.Dense(2, activation="softmax")]
    else:
        raise ValueError(f"`kind` must be dense, batchnorm, dropout, conv1d or gru; received kind={kind!r}")
    model = keras.Sequential(stack)
    model.compile(optimizer(opt), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
