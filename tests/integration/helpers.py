"""Helpers shared by the integration tests: their local Spark session, the digits data, the digits MLP and its accuracy."""

import os
import sys
import time

import numpy as np


def local_session(master: str, app: str):
    """A loopback-only local SparkSession, its UI off, its Python workers forked from elephant's daemon."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.daemon.module", "elephant.daemon")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def digits_split():
    """scikit-learn's digits scaled to [0, 1]: ``x_train, x_test, y_train, y_test`` (a stratified 75/25 split)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    return train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)


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


def worker_windows(sm, samples, window, workers=2):
    """Each worker's commits in the last fit's first epoch and in a later one: its pass's steps in windows of
    ``window``, less, in the first epoch, the steps the driver trained in its head (``fit_plan["head_steps"]``)."""
    steps = -(-samples // workers // sm.fit_plan["worker_batch_size"])
    return -(-(steps - sm.fit_plan["head_steps"]) // window), -(-steps // window)


def accuracy(model, x, y):
    return float(np.mean(np.argmax(model.predict(x, verbose=0), axis=1) == y))


def plain_keras_accuracy(digits, epochs: int, batch_size: int = 32) -> float:
    """The test accuracy of the digits MLP after the user's own ``model.fit`` (same seed and batch)."""
    x_train, x_test, y_train, y_test = digits
    model = digits_model()
    model.fit(x_train, y_train, epochs=epochs, batch_size=batch_size, verbose=0)
    return accuracy(model, x_test, y_test)


def active_jobs_after(sc, seconds: float) -> list:
    """The active job ids once none are left or ``seconds`` have passed (a cancel ends on Spark's event thread)."""
    tracker, deadline = sc.statusTracker(), time.monotonic() + seconds
    while list(tracker.getActiveJobsIds()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return list(tracker.getActiveJobsIds())
