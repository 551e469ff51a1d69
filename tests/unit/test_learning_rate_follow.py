"""The compiled learning rate set by callbacks on the driver reaches the workers and the server rule."""

import dataclasses
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402

from elephant import optimizers as O  # noqa: E402
from elephant import replicas, worker  # noqa: E402
from elephant.errors import PSError, ProtocolError  # noqa: E402
from elephant.fit.loop import follow_learning_rate as _follow_learning_rate  # noqa: E402
from elephant.model_io import fingerprint, model_to_bytes  # noqa: E402
from elephant.fit.loop import settable_learning_rate  # noqa: E402
from elephant.ps.client import InProcessClient  # noqa: E402
from elephant.ps.store import Store  # noqa: E402
from tests.unit.helpers import tiny_model  # noqa: E402


def test_the_settable_rate_is_read_and_a_schedule_is_left_alone():
    assert settable_learning_rate(keras.optimizers.Adam(0.003)) == pytest.approx(0.003)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    assert settable_learning_rate(keras.optimizers.SGD(schedule)) is None
    scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.25))
    assert settable_learning_rate(scaled) == pytest.approx(0.25)


@pytest.mark.parametrize("rule", [O.ModelAveraging(outer_momentum=0.5), O.DelayedNesterov(outer_momentum=0.5)])
def test_rules_with_a_server_velocity_scale_it_by_the_ratio(rule):
    state = rule.server_init([np.zeros(2)], 2)
    state = {**state, "buffer": [np.array([2.0, -4.0])]}
    scaled = rule.on_learning_rate_change(state, 0.25)
    np.testing.assert_array_equal(scaled["buffer"][0], [0.5, -1.0])
    np.testing.assert_array_equal(state["buffer"][0], [2.0, -4.0])  # a new state, the old one untouched
    assert O.ModelAveraging(outer_momentum=0.0).on_learning_rate_change(None, 0.0) is None  # plain averaging
    assert O.Downpour().on_learning_rate_change("kept", 0.0) == "kept"  # the default: no velocity to scale


def test_the_store_applies_the_ratio_under_its_lock_and_validates_it():
    store = Store([np.zeros(2)], O.ModelAveraging(outer_momentum=0.5), "synchronous", 2, "run-lr")
    store._state = {**store._state, "buffer": [np.ones(2)]}
    store.learning_rate_changed(0.0)
    np.testing.assert_array_equal(store._state["buffer"][0], [0.0, 0.0])
    for bad in (-1.0, float("nan"), float("inf"), "0.5"):
        with pytest.raises(ProtocolError, match="learning-rate ratio"):
            store.learning_rate_changed(bad)

    class Broken(O.Downpour):
        def on_learning_rate_change(self, state, ratio):
            raise RuntimeError("boom")

    with pytest.raises(PSError, match="Broken.on_learning_rate_change failed"):
        Store([np.zeros(2)], Broken(), "asynchronous", 1, "run-b").learning_rate_changed(0.5)


def test_the_driver_passes_a_change_to_the_store_once():
    class Recording:
        ratios = []

        def learning_rate_changed(self, ratio):
            self.ratios.append(ratio)

    local, store = keras.optimizers.SGD(0.2), Recording()
    rate = _follow_learning_rate(local, None, store)  # the first epoch: nothing to compare with
    assert _follow_learning_rate(local, rate, store) == rate == pytest.approx(0.2) and store.ratios == []
    local.learning_rate = 0.05
    rate = _follow_learning_rate(local, rate, store)
    local.learning_rate = 0.0
    rate = _follow_learning_rate(local, rate, store)
    local.learning_rate = 0.1
    _follow_learning_rate(local, rate, store)  # from 0: the velocity is already gone, nothing to scale
    assert store.ratios == pytest.approx([0.25, 0.0, 1.0])


def test_a_worker_trains_with_the_rate_of_its_task(linear_data):
    model = tiny_model()  # compiled with SGD(0.05)
    archive = model_to_bytes(model)
    spec = worker.TaskSpec(run="run-z", epoch=0, model_bytes=archive, fingerprint=fingerprint(archive),
                           optimizer=O.Downpour(), window=2, batch_size=32, mode="asynchronous",
                           ps_url="in-process", token="t", read_timeout=5.0, learning_rate=0.0)
    store = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, "run-z")
    worker.run_partition(spec, 0, 1, [linear_data], InProcessClient(store))
    for got, want in zip(store.center(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)  # a rate of 0: every delta was exactly 0
    assert float(replicas.training_model(spec).optimizer.learning_rate.numpy()) == 0.0
    moved = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, "run-m")
    worker.run_partition(dataclasses.replace(spec, run="run-m", learning_rate=0.05), 0, 1, [linear_data],
                         InProcessClient(moved))
    assert not np.allclose(moved.center()[0], model.get_weights()[0])
