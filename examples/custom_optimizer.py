"""Write a distributed optimizer, check it with ``simulate``, then train with it on Spark.

The rule: DOWNPOUR whose stale deltas are damped. A delta that is ``τ`` commits
old when it reaches the server is scaled by ``k/τ`` once ``τ > k`` (or dropped).

Run:  python examples/custom_optimizer.py [--epochs 10] [--workers 2]
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

from elephant.errors import ConfigError
from elephant.optimizers import Downpour, DistributedOptimizer, register, simulate, staleness, tree_map


# ----------------------------------------------------------------------------- the rule
@register
class StaleClip(DistributedOptimizer):
    """DOWNPOUR with stale deltas damped.

    Worker (the base class's delta rule): send ``Δ = θ − θ_pull``; adopt the reply's center.
    Server: ``τ = clock − base_clock``; ``θ̃ ← θ̃ + s(τ)·Δ`` with ``s(τ) = 1`` for
    ``τ ≤ k``, else ``k/τ`` (or 0 when ``drop=True``).

    Args:
        window: local steps per commit. Default 5.
        max_staleness: ``k``, the staleness applied in full. Default 2.
        drop: drop deltas older than ``k`` instead of scaling them. Default False.
        staleness_bound: optional SSP bound; default None.
    """

    name = "staleclip"
    modes = ("asynchronous", "hogwild")
    default_window = 5

    def __init__(self, window=None, max_staleness=2, drop=False, staleness_bound=None):
        super().__init__(window=window, staleness_bound=staleness_bound)
        if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 1:
            raise ConfigError(f"`max_staleness` must be a positive int; received max_staleness={max_staleness!r}")
        self.max_staleness, self.drop = max_staleness, bool(drop)

    def scale(self, tau: int) -> float:
        if tau <= self.max_staleness:
            return 1.0
        return 0.0 if self.drop else self.max_staleness / tau

    def apply(self, state, center, clock, worker, commit):
        s = self.scale(staleness(clock, commit))
        return tree_map(lambda c, d: c + s * d, center, commit.tensors), None, state

    def get_config(self):
        return {**super().get_config(), "max_staleness": self.max_staleness, "drop": self.drop}


# ----------------------------------------------------------------------------- check it
def check_with_simulate() -> None:
    from elephant.optimizers.schedules import timed
    from elephant.optimizers.simulate import quadratic

    grad, init = quadratic(3.0), [np.zeros(2)]
    # one worker: never stale, so exactly DOWNPOUR
    one = [("pull", 0), ("step", 0, 5), ("commit", 0), ("step", 0, 3), ("commit", 0)]
    mine, ref = (simulate(opt, init, grad, one).center[0] for opt in (StaleClip(), Downpour()))
    assert np.array_equal(mine, ref)
    # eight workers, worker k needs 1 + k/2 time units per step
    schedule = timed([1 + k / 2 for k in range(8)], window=5, num_steps=40)
    for opt in (Downpour(), StaleClip(max_staleness=2), StaleClip(max_staleness=2, drop=True)):
        trace = simulate(opt, init, grad, schedule, local_lr=0.05)
        err = float(np.abs(trace.center[0] - 3.0).max())
        print(f"simulate {opt!r}: |center - 3| = {err:.3g} after {trace.clock} commits, max staleness {max(trace.staleness)}")


# ----------------------------------------------------------------------------- train with it
def train_on_spark(epochs: int, workers: int) -> None:
    import keras
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from elephant import SparkModel

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        (x / 16.0).astype("float32"), y, test_size=0.25, random_state=0, stratify=y
    )
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    sm = SparkModel(model, mode="asynchronous", optimizer=StaleClip(window=4, max_staleness=2), num_workers=workers)
    sm.fit(x_train, y_train, epochs=epochs, batch_size=32, verbose=0)
    accuracy = sm.evaluate(x_test, y_test, return_dict=True)["accuracy"]
    print(f"StaleClip on Spark: {epochs} epochs, {workers} workers, test accuracy {accuracy:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    check_with_simulate()
    train_on_spark(args.epochs, args.workers)


if __name__ == "__main__":
    main()
