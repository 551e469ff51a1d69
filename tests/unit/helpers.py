"""Helpers shared by the unit tests."""

from __future__ import annotations


def tiny_model():
    """A seeded 3 -> 2 Dense model compiled with SGD(0.05) and MSE (fits ``linear_data``)."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


class RecordingBuilder:
    """Stands for ``SparkSession.builder``: records what a session would be made with, makes none."""

    def __init__(self):
        self.settings = {}

    def master(self, value):
        self.settings["master"] = value
        return self

    def appName(self, value):
        self.settings["app"] = value
        return self

    def config(self, key, value):
        self.settings[key] = value
        return self

    def getOrCreate(self):
        return self
