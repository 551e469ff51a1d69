"""Hyperparameter search on scikit-learn digits, then a top-3 ensemble of the best trials.

Every trial is one elephant fit (its own parameter server and Spark job group);
two trials run at once. The space covers the learning rate, the layer width and
the distributed optimizer.

Run:  python examples/search_digits.py [--evals 8] [--compare]   (--compare also times parallelism=1)
"""

import argparse
import logging
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import keras
import numpy as np
from pyspark.sql import SparkSession
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from elephant.ensemble import Ensemble
from elephant.search import hp, minimize


def build_model(lr: float, width: int) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(keras.optimizers.Adam(lr), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


SPACE = {
    "lr": hp.loguniform("lr", np.log(1e-3), np.log(3e-2)),
    "width": hp.choice("width", [16, 32, 64]),
    "optimizer": hp.choice("optimizer", ["downpour", "agn", "dynsgd"]),
}


def search(x_train, y_train, x_val, y_val, evals: int, parallelism: int, spark):
    t0 = time.perf_counter()
    result = minimize(build_model, SPACE, x_train, y_train, max_evals=evals, parallelism=parallelism,
                      metric="val_accuracy", mode="max", validation_data=(x_val, y_val), epochs=6,
                      batch_size=32, seed=0, spark=spark)
    return result, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evals", type=int, default=8)
    parser.add_argument("--compare", action="store_true", help="also run the search with parallelism=1")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    spark = (SparkSession.builder.master("local[*]").appName("search_digits")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    x_train, x_val, y_train, y_val = train_test_split(x_train, y_train, test_size=0.2, random_state=0, stratify=y_train)

    if args.compare:  # start the Python workers (and their TensorFlow) before timing anything
        spark.sparkContext.parallelize(range(2), 2).foreach(lambda _: __import__("tensorflow"))
    result, wall = search(x_train, y_train, x_val, y_val, args.evals, 2, spark)
    print(result.to_pandas().drop(columns="error").round(4).to_string())
    print(f"search of {len(result.trials)} trials with parallelism=2: {wall:.1f}s wall time")
    if args.compare:
        _, wall_1 = search(x_train, y_train, x_val, y_val, args.evals, 1, spark)
        print(f"same search with parallelism=1: {wall_1:.1f}s wall time (x{wall_1 / wall:.2f})")

    best = Ensemble([result.best_model], spark=spark).evaluate(x_test, y_test, return_dict=True)["accuracy"]
    ensemble = Ensemble.from_search(result, top_k=3, spark=spark)
    ens_acc = ensemble.evaluate(x_test, y_test, return_dict=True)["accuracy"]
    vote_acc = np.mean(Ensemble(ensemble.models, combine="vote", spark=spark).predict(x_test) == y_test)
    print(f"best trial {result.best_trial.number} {result.best_params}: val accuracy {result.best_score:.4f}")
    print(f"test accuracy: best single model {best:.4f} | top-3 mean ensemble {ens_acc:.4f} | "
          f"top-3 vote ensemble {vote_acc:.4f}")


if __name__ == "__main__":
    main()
