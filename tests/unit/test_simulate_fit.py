"""simulate_fit: a whole distributed fit of a Keras model in one process."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from elephant.errors import ConfigError
from elephant.optimizers import DelayedNesterov, ModelAveraging, simulate_fit


def model(seed=0):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3, activation="softmax")])
    m.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return m


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 1).astype("int64")
    return x, y


@pytest.mark.parametrize("optimizer", [ModelAveraging(window=3), DelayedNesterov(window=3)])
def test_one_worker_replays_model_fit(data, optimizer):
    """One worker, no shuffle: the default outer step is the identity, so the center is Keras' own fit."""
    x, y = data
    plain = model()
    plain.fit(x, y, epochs=2, batch_size=32, shuffle=False, verbose=0)
    mode = "synchronous" if "synchronous" in optimizer.modes else "asynchronous"
    sim = model()
    fit = simulate_fit(sim, x, y, epochs=2, batch_size=32, mode=mode, optimizer=optimizer, num_workers=1,
                       seed=None, shuffle=False)
    for got, want in zip(fit.centers[-1], plain.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(sim.get_weights(), fit.centers[-1], strict=True):
        np.testing.assert_array_equal(got, want)  # the model holds the final center, as after SparkModel.fit
    assert fit.history["updates"] == [3.0, 3.0]  # 7 steps per epoch: windows of 3, 3 and a flushed 1


def test_history_counts_rounds_and_commits_and_evaluates_the_center(data):
    x, y = data
    sync = simulate_fit(model(), x, y, epochs=2, batch_size=20, mode="synchronous", num_workers=2,
                        frequency=2, validation_data=(x, y))
    # 100 samples per worker, batch 20 split in two: 10 steps per pass, 5 rounds of 2 steps; Adam's workers train at
    # a scaled rate, so the driver's head trains the first epoch's first 5 steps and its workers 3 rounds (2, 2, 1)
    assert sync.history["updates"] == [3.0, 5.0] and sync.trace.clock == 8
    assert len(sync.history["val_accuracy"]) == 2 and 0.0 <= sync.history["val_accuracy"][-1] <= 1.0
    m = model()
    m.set_weights(sync.centers[-1])
    assert sync.history["val_loss"][-1] == pytest.approx(m.evaluate(x, y, batch_size=20, verbose=0)[0], rel=1e-5)
    asyn = simulate_fit(model(), x, y, epochs=2, batch_size=20, mode="asynchronous", num_workers=2)
    assert asyn.window is None and asyn.history["updates"] == [2.0, 2.0]  # one commit per worker and pass


def test_batch_split_follows_the_rule_unless_told(data):
    x, y = data
    split = simulate_fit(model(), x, y, epochs=2, batch_size=20, mode="synchronous", num_workers=2, frequency=1)
    full = simulate_fit(model(), x, y, epochs=2, batch_size=20, mode="synchronous", num_workers=2, frequency=1,
                        batch_split=False)
    # split: 10 steps per pass, the first epoch's first 5 in the driver's head (the workers' rate is scaled);
    # full batches: 5 steps per pass at the compiled rate, no head
    assert split.trace.clock == 15 and full.trace.clock == 10


def test_arguments_are_checked(data):
    x, y = data
    with pytest.raises(ConfigError, match="received mode='eventual'"):
        simulate_fit(model(), x, y, mode="eventual")
    with pytest.raises(ConfigError, match="'downpour' supports mode"):
        simulate_fit(model(), x, y, mode="synchronous", optimizer="downpour")
    with pytest.raises(ConfigError, match="`step_times` must give one time per worker"):
        simulate_fit(model(), x, y, num_workers=2, step_times=[1.0])


def test_the_asynchronous_default_on_one_long_pass_lands_where_plain_keras_does():
    """One epoch over a long pass (256 steps per worker): the old default's single outer step overshoots.

    A linear regression each worker all but solves in its pass: one commit per pass with block
    momentum puts the center at ``1 + β = 1.5`` times the mean progress from the start, far past
    the solution; the default's windows of 32 steps without outer momentum land on it.
    """
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16_384, 4)).astype("float32")
    y = (x @ np.array([3.0, -2.0, 1.5, 4.0], dtype="float32") + 2.0 + 0.1 * rng.normal(size=16_384)).astype("float32")

    def linear():
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        m.compile(keras.optimizers.SGD(0.02), "mse")
        return m

    def mse(m):
        return float(m.evaluate(x[:2048], y[:2048], verbose=0))

    plain = linear()
    plain.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=True)
    fit = simulate_fit(new := linear(), x, y, epochs=1, batch_size=64, num_workers=2)
    assert fit.window == 32 and fit.optimizer.outer.momentum == 0.0
    simulate_fit(old := linear(), x, y, epochs=1, batch_size=64, num_workers=2, frequency="epoch")
    assert mse(plain) < 0.05
    assert mse(new) < 2 * mse(plain) + 0.01
    assert mse(old) > 1.0  # about a quarter of the distance to the solution, squared, per weight


def _noisy_model(seed=0):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.BatchNormalization(),
                          keras.layers.Dropout(0.3, seed=seed), keras.layers.Dense(3, activation="softmax")])
    m.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy")
    return m


@pytest.mark.parametrize("mode, frequency", [("asynchronous", 3), ("synchronous", 2), ("hogwild", 1)])
def test_workers_sharing_one_model_train_what_a_model_each_trains(data, mode, frequency):
    """Each worker's weights, moving statistics, Adam moments and dropout seeds are swapped in at its turn."""
    x, y = data
    optimizer = "downpour" if mode == "hogwild" else None
    kwargs = dict(epochs=2, batch_size=24, mode=mode, frequency=frequency, optimizer=optimizer, num_workers=3)
    shared = simulate_fit(_noisy_model(), x, y, share_model=True, **kwargs)
    apart = simulate_fit(_noisy_model(), x, y, share_model=False, **kwargs)
    assert shared.trace.clock == apart.trace.clock > 0
    for epoch_shared, epoch_apart in zip(shared.centers, apart.centers, strict=True):
        for got, want in zip(epoch_shared, epoch_apart, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    start = _noisy_model().get_weights()
    assert any(not np.allclose(a, b) for a, b in zip(shared.centers[-1], start))  # it trained
