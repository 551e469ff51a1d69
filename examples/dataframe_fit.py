"""Fit from a Spark DataFrame with a Vector feature column, then predict into a new column.

Run:  python examples/dataframe_fit.py
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
from pyspark.ml.linalg import Vectors
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from elephant import SparkModel


def main() -> None:
    x, y = load_breast_cancer(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    scaler = StandardScaler().fit(x_train)
    x_train, x_test = scaler.transform(x_train), scaler.transform(x_test)

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((x.shape[1],)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(1, activation="sigmoid"),
    ])
    model.compile(keras.optimizers.Adam(3e-3), "binary_crossentropy", metrics=["accuracy"])
    sm = SparkModel(model, mode="asynchronous", num_workers=2)

    spark = sm.spark
    train_df = spark.createDataFrame(
        [(Vectors.dense(f.tolist()), float(label)) for f, label in zip(x_train, y_train)], ["features", "label"]
    )
    test_df = spark.createDataFrame(
        [(Vectors.dense(f.tolist()), float(label)) for f, label in zip(x_test, y_test)], ["features", "label"]
    )
    sm.fit(train_df, epochs=20, batch_size=16, verbose=0, features_col="features", label_col="label")
    scored = sm.predict(test_df, prediction_col="probability")
    rows = scored.select("label", "probability").collect()
    predicted = np.array([r["probability"][0] > 0.5 for r in rows])
    labels = np.array([r["label"] for r in rows])
    print(f"DataFrame fit: test accuracy {np.mean(predicted == labels):.4f} on {len(rows)} rows")
    print(f"evaluate(): {sm.evaluate(test_df, return_dict=True)}")
    scored.select("label", "probability").show(3, truncate=False)


if __name__ == "__main__":
    main()
