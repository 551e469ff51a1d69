"""The stepper's users on the running backend: a worker's partition pass and simulate_fit (no Spark)."""

from __future__ import annotations

import numpy as np
import pytest

from elephant import optimizers as O
from elephant import replicas, worker
from elephant.model_io import fingerprint, model_to_bytes
from elephant.ps.client import InProcessClient
from elephant.ps.store import Store

from .models import build


def _spec(model_bytes, run, window, batch_size=32):
    return worker.TaskSpec(
        run=run, epoch=0, model_bytes=model_bytes, fingerprint=fingerprint(model_bytes), optimizer=O.Downpour(),
        window=window, batch_size=batch_size, mode="asynchronous", ps_url="in-process", token="t", read_timeout=5.0,
        shuffle=False,
    )


def test_a_partition_pass_equals_keras_fit_and_leaves_the_replica_synced(classes):
    """One worker, one commit per pass: the center is fit's weights; the cached replica holds fit's
    optimizer state (what replicas.training_model saves for the next fit) and the pass's logs."""
    x, y = classes
    model = build("dense")
    model_bytes = model_to_bytes(model)
    reference = build("dense")
    history = reference.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0).history
    store = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, "run-backend")
    spec = _spec(model_bytes, "run-backend", window=None)
    (stats,) = worker.run_partition(spec, 0, 1, [(x, y)], InProcessClient(store))
    assert stats["steps"] == 4 and stats["commits"] == 1
    for got, want in zip(store.center(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    replica = replicas.training_model(spec)
    for got, want in zip(replica.optimizer.variables, reference.optimizer.variables, strict=True):
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)
    for key in ("loss", "accuracy"):
        assert stats["logs"][key] == pytest.approx(history[key][0], rel=1e-5), key


def test_a_partition_pass_with_a_commit_every_step_trains(classes):
    x, y = classes
    model = build("dense", "momentum")
    start = model.evaluate(x, y, verbose=0, return_dict=True)["loss"]
    store = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, "run-backend-window")
    spec = _spec(model_to_bytes(model), "run-backend-window", window=1, batch_size=8)
    for epoch in range(3):
        (stats,) = worker.run_partition(worker.dataclasses.replace(spec, epoch=epoch), 0, 1, [(x, y)],
                                        InProcessClient(store))
        assert stats["commits"] == stats["steps"] == 15
    model.set_weights(store.center())
    assert model.evaluate(x, y, verbose=0, return_dict=True)["loss"] < start - 0.3


def test_a_two_worker_simulated_fit_learns(classes):
    """2 workers, 5 epochs of the 120 samples: loss from about 1.0-1.15 to about 0.5 on each backend
    (TensorFlow 0.51, JAX 0.49, torch 0.52 when measured; plain fit 0.56-0.57)."""
    x, y = classes
    model = build("dense")
    start = model.evaluate(x, y, verbose=0, return_dict=True)
    fit = O.simulate_fit(model, x, y, epochs=5, batch_size=16, num_workers=2)
    end = model.evaluate(x, y, verbose=0, return_dict=True)
    assert fit.history["updates"] == [2.0] * 5
    assert end["loss"] < 0.7 and end["loss"] < start["loss"] - 0.3
    assert end["accuracy"] > 0.7
