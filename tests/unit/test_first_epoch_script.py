"""benchmarks/first_epoch.py: the head's split, the ramp patched off for ``-noramp`` and put back afterwards."""

from __future__ import annotations

import types

import numpy as np
import pytest

from tests.unit.helpers import benchmark

first_epoch = benchmark("first_epoch")
workloads = benchmark("workloads")


def _tiny():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")

    def build(seed):
        import keras

        keras.utils.set_random_seed(seed)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
        model.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    return workloads.Workload("tiny", x, y, x[:16], y[:16], build, "accuracy", True, 2, 8, "Adam")


@pytest.fixture
def seen(monkeypatch):
    """Replace simulate_fit with a recorder of what it is given and of the first pass's rates at that moment."""
    import elephant.fit.head as head
    import elephant.optimizers as optimizers
    import elephant.optimizers.local as local

    calls = []

    def fake(model, x, y, *, epochs, **kwargs):
        calls.append({"x": x, "epochs": epochs, "rates": local.ramped_rates(1.0, 4.0, 300),
                      "head_steps": head.HEAD_STEPS, **kwargs})
        if kwargs.get("seed") == 99:
            raise RuntimeError("a failed fit")
        return types.SimpleNamespace(history={"val_accuracy": [0.5] * epochs})

    monkeypatch.setattr(optimizers, "simulate_fit", fake)
    return calls


def test_the_rest_of_the_epoch_is_every_sample_the_head_did_not_train(seen):
    wl = _tiny()
    row = first_epoch.first_epoch(wl, 0, 16, head=3, variant="sync")
    (call,) = seen
    assert len(call["x"]) == len(wl.x) - 3 * wl.batch_size
    assert call["epochs"] == 1 and call["mode"] == "synchronous" and call["num_workers"] == 16
    assert row["curve"] == [0.5]
    trained = {tuple(r) for r in call["x"]}
    assert len(trained) == len(call["x"])  # no sample twice in the rest
    head = np.random.default_rng(1000).permutation(len(wl.x))[:24]
    assert not trained & {tuple(r) for r in wl.x[head]}


def test_noramp_trains_the_whole_pass_at_the_full_factor_and_puts_the_ramp_back(seen):
    import elephant.fit.head as fit_head
    import elephant.optimizers.local as local

    ramp = local.ramped_rates
    first_epoch.first_epoch(_tiny(), 0, 16, head=2, variant="async-noramp")
    first_epoch.first_epoch(_tiny(), 0, 16, head=2, variant="async")
    noramp, ramped = seen
    assert noramp["rates"] == [4.0] * 300 and noramp["mode"] == "asynchronous"
    assert ramped["rates"][0] == 1.0 and ramped["rates"][-1] == 4.0
    assert noramp["head_steps"] == ramped["head_steps"] == 0  # the rest's fit: no head of the defaults' own
    with pytest.raises(RuntimeError, match="a failed fit"):
        first_epoch.first_epoch(_tiny(), 99, 16, head=2, variant="sync-noramp")
    assert local.ramped_rates is ramp and fit_head.HEAD_STEPS == 128


def test_full_trains_the_workloads_epochs_over_every_sample_after_the_head(seen):
    wl = _tiny()
    row = first_epoch.first_epoch(wl, 0, 4, head=2, variant="sync-noramp", full=True)
    (call,) = seen
    assert len(call["x"]) == len(wl.x) and call["epochs"] == wl.epochs
    assert row["curve"] == [0.5, 0.5]
