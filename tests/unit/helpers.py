"""Helpers shared by the unit tests that train a Keras model."""

from __future__ import annotations


def tiny_model():
    """A seeded 3 -> 2 Dense model compiled with SGD(0.05) and MSE (fits ``linear_data``)."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model
