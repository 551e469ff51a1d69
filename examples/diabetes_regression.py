"""Regress disease progression on scikit-learn's diabetes data with elephant.

Run:  python examples/diabetes_regression.py
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
from sklearn.datasets import load_diabetes
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from elephant import SparkModel


def main() -> None:
    x, y = load_diabetes(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0)
    scaler = StandardScaler().fit(x_train)
    x_train, x_test = scaler.transform(x_train).astype("float32"), scaler.transform(x_test).astype("float32")
    y_mean, y_std = y_train.mean(), y_train.std()
    y_train_n = ((y_train - y_mean) / y_std).astype("float32")

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((x.shape[1],)),
        keras.layers.Dense(8, activation="relu"),
        keras.layers.Dense(1),
    ])
    model.compile(keras.optimizers.Adam(3e-3), loss="mse", metrics=["mae"])

    sm = SparkModel(model, mode="synchronous", frequency="epoch", num_workers=2)
    history = sm.fit(x_train, y_train_n, epochs=40, batch_size=16, validation_split=0.1, verbose=0)
    pred = sm.predict(x_test)[:, 0] * y_std + y_mean
    r2 = 1.0 - np.sum((y_test - pred) ** 2) / np.sum((y_test - y_test.mean()) ** 2)
    mean_pred_mse = np.mean((y_test - y_mean) ** 2)
    print(f"epochs run: {len(history.epoch)}, final val_loss {history.history['val_loss'][-1]:.4f}")
    print(f"test MSE {np.mean((y_test - pred) ** 2):.1f} vs mean predictor {mean_pred_mse:.1f}; test R^2 {r2:.3f}")


if __name__ == "__main__":
    main()
