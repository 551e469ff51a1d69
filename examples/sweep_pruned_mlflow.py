"""A pruned, resumable sweep on scikit-learn digits, logged to MLflow, with its plots.

Every trial is an elephant fit of up to 9 epochs; ASHA stops the poor ones at 1 and 3
epochs and gives their slot to the next trial. The sweep is an Optuna journal file in
``--dir``: kill the script (Ctrl-C, or the machine) and run the same command again, and
it continues where it stopped (finished trials kept, the running ones started again
from their last epoch backup). Each trial is a child run in an MLflow SQLite store in
the same folder (``mlflow ui --backend-store-uri sqlite:///<dir>/mlflow.db`` shows them),
and the sweep's plots are written there as PNG files.

Run:  pip install -e ".[tensorflow,examples,sweeps]"
      python examples/sweep_pruned_mlflow.py [--dir sweep-digits] [--evals 16] [--epochs 9]
"""

import argparse
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import keras
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from elephant.search import hp, minimize

SPACE = {
    "lr": hp.loguniform("lr", np.log(1e-4), np.log(0.3)),
    "units": hp.choice("units", [16, 32, 64, 128]),
    "batch_size": hp.choice("batch_size", [16, 32, 64]),
}
PLOTS = ("history", "intermediate", "timeline", "importances")


def build_model(lr: float, units: int) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(units, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(keras.optimizers.Adam(lr), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def sweep(folder: str, evals: int = 16, epochs: int = 9, spark=None):
    """Run (or continue) the sweep kept in ``folder``; returns the search result."""
    os.makedirs(folder, exist_ok=True)
    x, y = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split((x / 16.0).astype("float32"), y, test_size=0.25,
                                                      random_state=0, stratify=y)
    return minimize(build_model, SPACE, x_train, y_train, max_evals=evals, parallelism=2,
                    metric="val_accuracy", mode="max", validation_data=(x_val, y_val), epochs=epochs,
                    num_workers=1, frequency="epoch", pruner="asha",
                    storage=os.path.join(folder, "sweep.journal"),  # the same call again continues it; epoch
                    mlflow={"experiment": "digits-sweep"},          # backups in sweep-trials/, mlflow.db beside
                    seed=0, verbose=1, spark=spark)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="sweep-digits", help="folder of the journal, MLflow store and plots")
    parser.add_argument("--evals", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=9)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    result = sweep(args.dir, args.evals, args.epochs)
    print(result.to_pandas().drop(columns="error").round(4).to_string())
    print(f"best trial {result.best_trial.number} {result.best_params}: val accuracy {result.best_score:.4f}")
    for kind in PLOTS:
        result.plot(kind, path=os.path.join(args.dir, f"{kind}.png"))
    print(f"plots, journal and MLflow store (sqlite:///{os.path.abspath(args.dir)}/mlflow.db) in {args.dir}/")


if __name__ == "__main__":
    main()
