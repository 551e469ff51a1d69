"""Helpers shared by the integration tests: the digits MLP and its accuracy."""

import numpy as np


def digits_model(seed=0, lr=1e-3):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(keras.optimizers.Adam(lr), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def accuracy(model, x, y):
    return float(np.mean(np.argmax(model.predict(x, verbose=0), axis=1) == y))
