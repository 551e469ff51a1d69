"""elephant.fit.plan: the decisions of a fit, as small functions over numbers."""

from __future__ import annotations

import keras
import pytest

from elephant.config import Settings
from elephant.fit.plan import decide_workers, plan_fit


@pytest.mark.parametrize("requested, available, samples, expected", [
    (None, 8, None, 8),     # an RDD's partitions, or Spark's default parallelism
    (3, 8, None, 3),        # SparkModel(num_workers=3) wins
    (None, 8, 5, 5),        # numpy: never more workers than samples
    (4, 8, 2, 2),
    (None, None, None, None),  # a Connect cluster that does not say its slots
    (6, None, None, 6),
])
def test_decide_workers(requested, available, samples, expected):
    assert decide_workers(requested, available, samples) == expected


@pytest.mark.parametrize("settings, workers, batch, expected", [
    ({"mode": "synchronous"}, 4, 32, {"worker_batch_size": 8, "window": 8}),     # model averaging splits
    ({"mode": "synchronous", "batch_split": False}, 4, 32, {"worker_batch_size": 32, "window": 8}),
    ({"mode": "asynchronous", "optimizer": "downpour"}, 4, 32, {"worker_batch_size": 32, "window": 1}),
    ({"mode": "asynchronous", "optimizer": "downpour", "frequency": "batch"}, 3, 10, {"worker_batch_size": 10,
                                                                                       "window": 1}),
    ({"mode": "asynchronous", "frequency": "epoch"}, 3, 10, {"worker_batch_size": 4, "window": None}),
])
def test_plan_fit(settings, workers, batch, expected):
    plan = plan_fit(Settings(**settings), keras.optimizers.SGD(0.1), workers, batch)
    assert {k: plan.as_dict()[k] for k in expected} == expected
    assert plan.num_workers == workers and plan.batch_size == batch
    assert plan.rule.get_config() == plan.as_dict()["optimizer"]


def test_the_plan_describes_a_split_batch_and_the_overlap():
    plan = plan_fit(Settings(mode="synchronous", overlap=True), keras.optimizers.SGD(0.1), 4, 32)
    line = plan.describe()
    assert line.startswith("elephant fit: 4 workers, ")
    assert "batch_size=32 is the global batch: each worker trains batches of 8" in line
    assert "workers train on while a commit is in flight" in line
    assert any("overlap=True in synchronous mode with 4 workers" in w for w in plan.warnings("synchronous"))
