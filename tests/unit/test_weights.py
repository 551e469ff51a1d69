"""elephant.weights: the running weighted mean synchronous rounds sum their commits into."""

from __future__ import annotations

import numpy as np
import pytest

from elephant.weights import WeightedSum, weighted_mean


def _items():
    rng = np.random.default_rng(1)
    return [[rng.normal(size=(50, 9)).astype(np.float32), rng.normal(size=()).astype(np.float32),
             rng.normal(size=4).astype(np.float16)] for _ in range(5)]


@pytest.mark.parametrize("weights", [[3, 0, 7, 1, 2.5], [1], [0, 2], [0.25, 0.25, 0.5]])
def test_the_mean_is_the_float64_weighted_sum_cast_back_to_each_dtype(weights):
    items = _items()[: len(weights)]
    sums = [np.zeros(a.shape, np.float64) for a in items[0]]
    for item, w in zip(items, weights):
        for acc, a in zip(sums, item):
            acc += np.asarray(a, np.float64) * w
    expected = [(s / sum(weights)).astype(a.dtype) for s, a in zip(sums, items[0])]
    found = weighted_mean(items, weights)
    for f, e in zip(found, expected):
        assert isinstance(f, np.ndarray) and f.dtype == e.dtype and f.shape == e.shape  # 0-d stays an array
        assert f.tobytes() == e.tobytes()


def test_a_zero_dimensional_tensor_is_summed_in_place_over_every_add():
    acc = WeightedSum()
    for value in (1.0, 2.0, 4.0):
        acc.add([np.array(value, np.float32)], 1.0)
    assert acc.mean()[0] == np.float32(7.0 / 3.0)


def test_a_mismatched_item_or_no_weight_is_refused():
    acc = WeightedSum()
    with pytest.raises(ValueError, match="positive total weight"):
        acc.mean()
    acc.add([np.ones(2, np.float32)], 1.0)
    with pytest.raises(ValueError):
        acc.add([np.ones(2, np.float32), np.ones(1, np.float32)], 1.0)
