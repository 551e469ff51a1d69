"""elephant.sources: the input kinds decided once, each refusing what does not apply to it."""

from __future__ import annotations

import numpy as np
import pytest

from elephant.config import FitArgs
from elephant.errors import ConfigError, DataError
from elephant.sources import DataFrameSource, NumpySource, RDDSource, source

from tests.unit.helpers import tiny_model


class RDD:
    """Duck-types a pyspark RDD (named as elephant recognises one) and records what is done to it."""

    def __init__(self, partitions=3, calls=None):
        self.partitions, self.calls = partitions, calls if calls is not None else []

    def getNumPartitions(self):
        return self.partitions

    def repartition(self, n):
        self.calls.append(("repartition", n))
        return RDD(n, self.calls)

    def coalesce(self, n):
        self.calls.append(("coalesce", n))
        return RDD(n, self.calls)

    def mapPartitions(self, f):
        self.calls.append(("mapPartitions", self.partitions))
        return self

    def map(self, f):
        self.calls.append(("map", self.partitions))
        return self


class DataFrame:
    schema = None
    sparkSession = "its session"


class Context:
    defaultParallelism = 4


@pytest.mark.parametrize("x, kind", [
    (np.zeros((4, 3)), NumpySource), ([np.zeros((4, 3)), np.zeros((4, 2))], NumpySource),
    ({"a": np.zeros((4, 3))}, NumpySource), (RDD(), RDDSource), (DataFrame(), DataFrameSource),
])
def test_the_kind_is_decided_once(x, kind):
    data = source(x)
    assert type(data) is kind and data.x is x
    assert data.distributed is (kind is not NumpySource)
    assert data.spark == ("its session" if kind is DataFrameSource else None)


def test_what_is_no_kind_is_refused_by_name():
    with pytest.raises(DataError, match=r"`x` must be numpy arrays .* received builtins.generator \(a dataset"):
        source(i for i in range(3))


@pytest.mark.parametrize("x, y, kwargs, error, match", [
    (RDD(), np.zeros(3), {}, DataError, r"`y` must be None when `x` is an RDD or a DataFrame \(labels travel"),
    (DataFrame(), None, {"sample_weight": np.ones(3)}, DataError, "`sample_weight` must be None when `x` is an RDD"),
    (RDD(), None, {"validation_split": 0.2}, ConfigError, "`validation_split` works with numpy inputs only"),
    (RDD(), None, {"weight_col": "w"}, DataError,
     r"`weight_col` names a DataFrame column, but `x` is an RDD \(received weight_col='w'\)"),
    (np.zeros((3, 3)), np.zeros(3), {"weight_col": "w"}, DataError,
     r"but `x` is numpy; pass sample_weight= instead \(received weight_col='w'\)"),
])
def test_each_kind_refuses_what_does_not_apply_to_it(x, y, kwargs, error, match):
    with pytest.raises(error, match=match):
        source(x, y).refuse(**kwargs)


def test_what_applies_is_not_refused():
    source(DataFrame()).refuse(weight_col="w")
    source(np.zeros((3, 3)), np.zeros(3)).refuse(sample_weight=np.ones(3), validation_split=0.5)


def test_numpy_is_checked_against_the_model_before_spark():
    model = tiny_model()
    data = source(np.zeros((5, 3)), np.zeros((5, 2)))
    assert np.array_equal(data.checked_weights(model, [1, 2, 3, 4, 5]), [1, 2, 3, 4, 5])
    with pytest.raises(DataError, match=r"`sample_weight` must hold one weight per sample \(5\)"):
        data.checked_weights(model, np.ones(4))
    with pytest.raises(DataError, match="`y` is required when `x` is a numpy array"):
        source(np.zeros((5, 3))).checked_weights(model)
    with pytest.raises(DataError, match="nothing to predict"):
        source(np.zeros((0, 3))).checked_features(model)


@pytest.mark.parametrize("requested, partitions, expected_calls", [
    (None, 3, [("mapPartitions", 3)]),                          # the RDD's partitions are the workers
    (2, 3, [("coalesce", 2), ("mapPartitions", 2)]),            # fewer workers: partitions joined, no shuffle
    (4, 3, [("repartition", 4), ("mapPartitions", 4)]),         # more workers: repartitioned once
    (3, 3, [("mapPartitions", 3)]),
])
def test_an_rdd_trains_in_one_partition_per_worker(requested, partitions, expected_calls):
    rdd = RDD(partitions)
    training = source(rdd).training(tiny_model(), Context(), requested, FitArgs(), seed=0)
    assert training.num_workers == (requested or partitions) and training.samples is None
    assert rdd.calls == expected_calls


def test_a_barrier_fit_repartitions_rather_than_coalesces():
    rdd = RDD(6)
    training = source(rdd).training(tiny_model(), Context(), 2, FitArgs(), seed=0, barrier=True)
    assert training.num_workers == 2 and rdd.calls == [("repartition", 2), ("mapPartitions", 2)]


def test_class_weights_travel_with_the_rdds_blocks():
    rdd = RDD(2)
    source(rdd).training(tiny_model(), Context(), None, FitArgs(class_weight={0: 1.0, 1: 2.0}), seed=0)
    assert rdd.calls == [("mapPartitions", 2), ("map", 2)]


def test_a_numpy_bootstrap_is_seeded_and_keeps_pairs_and_size():
    x, y = np.arange(20.0).reshape(10, 2), np.arange(10)
    bx, by = source(x, y).bootstrap(seed=3)
    again = source(x, y).bootstrap(seed=3)
    assert bx.shape == x.shape and np.array_equal(bx[:, 0] // 2, by)
    assert np.array_equal(bx, again[0]) and len(set(by.tolist())) < 10
