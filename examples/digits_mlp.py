"""Classify scikit-learn's handwritten digits with a two-hidden-layer MLP on Spark.

Run:  python examples/digits_mlp.py [--mode asynchronous] [--frequency default] [--epochs 20] [--compare]
"""

import argparse
import logging
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from elephant import SparkModel


def build_model(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def load_data():
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    return train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="asynchronous", choices=["synchronous", "asynchronous", "hogwild"])
    parser.add_argument("--frequency", default="default",
                        help="'epoch', 'batch', local steps per commit, or 'default' (the optimizer's own window)")
    parser.add_argument("--optimizer", default=None,
                        help="distributed optimizer; default: the mode's (model averaging with block momentum, "
                             "DelayedNesterov, DOWNPOUR for hogwild)")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--compare", action="store_true", help="also time plain model.fit")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    frequency = int(args.frequency) if args.frequency.isdigit() else (None if args.frequency == "default" else args.frequency)

    x_train, x_test, y_train, y_test = load_data()
    sm = SparkModel(build_model(), mode=args.mode, frequency=frequency, optimizer=args.optimizer,
                    num_workers=args.workers)
    sm.spark  # start Spark before timing the fit
    t0 = time.perf_counter()
    history = sm.fit(x_train, y_train, epochs=args.epochs, batch_size=32, verbose=1)
    elapsed = time.perf_counter() - t0
    acc = sm.evaluate(x_test, y_test, return_dict=True)["accuracy"]
    print(f"elephant {args.mode}/{args.frequency}: {len(history.epoch)} epochs in {elapsed:.1f}s, "
          f"final train loss {history.history['loss'][-1]:.4f}, test accuracy {acc:.4f}")

    if args.compare:
        plain = build_model()
        t0 = time.perf_counter()
        plain.fit(x_train, y_train, epochs=args.epochs, batch_size=32, verbose=0)
        plain_s = time.perf_counter() - t0
        plain_acc = plain.evaluate(x_test, y_test, verbose=0, return_dict=True)["accuracy"]
        print(f"plain keras: {plain_s:.1f}s, test accuracy {plain_acc:.4f}; "
              f"elephant/plain wall-time ratio {elapsed / plain_s:.2f}")
    predictions = np.argmax(sm.predict(x_test[:5]), axis=1)
    print("first five test predictions:", predictions.tolist(), "labels:", y_test[:5].tolist())


if __name__ == "__main__":
    main()
