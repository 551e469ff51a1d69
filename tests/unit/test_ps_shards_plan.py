"""elephant.ps.shards: the shard plan (split/join) and how many shards (pure decisions; no sockets)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from elephant.errors import ConfigError, DataError
from elephant.ps.shards import PROCESS_COMMITS_PER_S, Piece, ShardPlan, choose_shards, plan_shards
from tests.unit.helpers import check_points_to_the_figures

MODELS = {
    "one-vector": [(10,)],
    "mlp": [(64, 32), (32,), (32, 10), (10,)],
    "mixed": [(9, 4), (4,), (3, 2, 2), (), (5,)],
    "one-big": [(1000, 8), (8,), (2,)],
    "empty-tensor": [(0, 3), (7, 3), (3,)],
    "conv": [(3, 3, 16, 32), (32,), (3, 3, 32, 64), (64,), (256, 10), (10,)],
}
DTYPES = [np.float32, np.float64, np.float16]


def weights_for(shapes, seed=0):
    """Distinct values everywhere, mixed dtypes, so a misplaced byte cannot go unnoticed."""
    rng = np.random.default_rng(seed)
    return [rng.normal(size=shape).astype(DTYPES[i % len(DTYPES)]) for i, shape in enumerate(shapes)]


def _cases():
    for name, shapes in MODELS.items():
        for shards in (1, 2, 3, 4):
            pieces = sum(max(1, shape[0]) if shape else 1 for shape in shapes)
            if shards <= pieces:
                yield pytest.param(shapes, shards, id=f"{name}-S{shards}")


CASES = list(_cases())


@pytest.mark.parametrize("shapes, shards", CASES)
def test_every_byte_is_held_by_exactly_one_shard(shapes, shards):
    weights = weights_for(shapes)
    plan = plan_shards(weights, shards)
    assert plan.num_shards == shards and all(plan.shards)
    assert sum(plan.shard_bytes()) == sum(w.nbytes for w in weights)
    for i, w in enumerate(weights):
        pieces = [p for held in plan.shards for p in held if p.tensor == i]
        if len(pieces) == 1 and pieces[0].rows is None:
            continue
        ranges = sorted(p.rows for p in pieces)  # contiguous row ranges that tile axis 0, each once
        assert ranges[0][0] == 0 and ranges[-1][1] == w.shape[0]
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(ranges, ranges[1:]))


@pytest.mark.parametrize("shapes, shards", CASES)
def test_split_then_join_is_byte_identical(shapes, shards):
    weights = weights_for(shapes)
    plan = plan_shards(weights, shards)
    parts = plan.split(weights)
    assert [[(a.shape, a.dtype) for a in part] for part in parts] == [
        [(plan.piece_shape(p), plan.dtypes[p.tensor]) for p in held] for held in plan.shards]
    copies = [[np.array(a, copy=True) for a in part] for part in parts]  # as the wire would hand them back
    for joined in (plan.join(parts), plan.join(copies)):
        assert len(joined) == len(weights)
        for a, b in zip(joined, weights):
            assert a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("shapes, shards", CASES)
def test_largest_first_onto_the_least_loaded_shard_balances(shapes, shards):
    weights = weights_for(shapes)
    plan = plan_shards(weights, shards)
    loads = plan.shard_bytes()
    largest = max(plan.piece_bytes(p) for held in plan.shards for p in held)
    assert max(loads) - min(loads) <= largest  # the greedy (LPT) bound
    total = sum(loads)
    for i, w in enumerate(weights):  # a tensor over total/S with rows to spare is cut
        cut = sum(1 for held in plan.shards for p in held if p.tensor == i) > 1
        assert cut == (w.nbytes * shards > total and w.ndim > 0 and w.shape[0] > 1)


def test_a_plan_is_deterministic_and_depends_only_on_shapes_and_dtypes():
    shapes = MODELS["conv"]
    weights = weights_for(shapes)
    specs = [(w.shape, w.dtype) for w in weights]
    assert plan_shards(weights, 3) == plan_shards(specs, 3) == plan_shards(weights_for(shapes, seed=9), 3)


def test_a_big_tensor_is_cut_into_row_ranges_spread_over_the_shards():
    plan = plan_shards([((1000, 8), "float32"), ((8,), "float32"), ((2,), "float32")], 2)
    assert plan.shards == ((Piece(0, (0, 500)), Piece(1)), (Piece(0, (500, 1000)), Piece(2)))
    assert plan.shard_bytes() == [16032, 16008]
    plan = plan_shards([((10, 1), "float32")], 3)  # longer ranges first
    assert [held[0].rows for held in plan.shards] == [(0, 4), (4, 7), (7, 10)]


def test_a_single_shard_holds_every_tensor_whole():
    weights = weights_for(MODELS["mlp"])
    plan = plan_shards(weights, 1)
    assert plan.shards == (tuple(Piece(i) for i in range(4)),)
    assert all(a is b for a, b in zip(plan.join(plan.split(weights)), weights))


@pytest.mark.parametrize("shards", [0, -1, True, 1.5, "2", None])
def test_shards_must_be_a_positive_int(shards):
    with pytest.raises(ConfigError, match=rf"`shards` must be a positive int; received shards={shards!r}"):
        plan_shards([(3,), "float32"], shards)


def test_bad_tensors_are_refused_naming_the_argument():
    with pytest.raises(ConfigError, match=r"`tensors` must hold at least one tensor; received an empty list"):
        plan_shards([], 1)
    with pytest.raises(ConfigError, match=r"`tensors\[1\]` must be an array or a \(shape, dtype\) pair; "
                                          r"received 'oops'"):
        plan_shards([np.zeros(3), "oops"], 1)
    with pytest.raises(ConfigError, match=r"`tensors\[0\]` has a negative dimension; received shape=\(-1, 2\)"):
        plan_shards([((-1, 2), "float32")], 1)
    with pytest.raises(ConfigError, match=r"2 tensors of 12 bytes in all make only 2 pieces, so some of the shards "
                                          r"would hold nothing; use fewer shards; received shards=3"):
        plan_shards([((1, 2), "float32"), ((), "float32")], 3)


def test_split_and_join_refuse_what_does_not_fit_the_plan():
    weights = weights_for(MODELS["mlp"])
    plan = plan_shards(weights, 2)
    with pytest.raises(DataError, match=r"split: expected 4 tensors, received 3"):
        plan.split(weights[:3])
    with pytest.raises(DataError, match=r"split: tensor 1: expected float64\[32\], received float32\[32\]"):
        plan.split([weights[0], weights[1].astype(np.float32), *weights[2:]])
    parts = plan.split(weights)
    with pytest.raises(DataError, match=r"join: expected 2 shards' tensors, received 1"):
        plan.join(parts[:1])
    with pytest.raises(DataError, match=r"join: shard 1: expected \d tensors, received 0"):
        plan.join([parts[0], []])
    bad = [[a[:1] if a.ndim else a for a in parts[0]], parts[1]]
    with pytest.raises(DataError, match=r"join: shard 0, tensor 0 \(a piece of tensor 0\): expected float32\[32, 32\]"):
        plan.join(bad)
    assert isinstance(plan, ShardPlan)


# ----------------------------------------------------------- how many shards
MB = 10**6


@pytest.mark.parametrize("model_bytes, workers, interval, expected", [
    (32_000, 4, 1.0, 1),         # a small model, few workers
    (1 * MB, 8, 2.0, 1),
    (1 * MB, 64, 0.25, 1),       # 256 commits/s of 1 MB: 0.32 of a core, 0.26 GB/s
    (1 * MB, 512, 2.0, 1),
    (40 * MB, 8, 2.0, 1),        # 4 commits/s of 40 MB: 0.16 GB/s, 0.11 core
    (40 * MB, 8, 0.25, 3),       # 32 commits/s: 1.28 GB/s over 0.5 GB/s a shard = 2.56
    (40 * MB, 64, 2.0, 3),       # the saturating case: 1.28 GB/s each way
    (40 * MB, 64, 30.0, 1),
    (400 * MB, 8, 30.0, 1),
    (400 * MB, 64, 30.0, 2),     # 2.1 commits/s: 0.85 GB/s, 0.6 core
    (400 * MB, 64, 2.0, 16),     # needs 26: capped
])
def test_choose_shards(model_bytes, workers, interval, expected):
    assert choose_shards(model_bytes, workers, interval) == expected


def test_choose_shards_settings_and_warnings(caplog):
    assert choose_shards(40 * MB, 64, 2.0, utilization=1.0) == 2
    assert choose_shards(400 * MB, 64, 2.0, max_shards=64) == 26
    with caplog.at_level(logging.WARNING, logger="elephant.ps.shards"):
        assert choose_shards(400 * MB, 64, 2.0, max_shards=4) == 4
        assert choose_shards(10_000, 512, 0.25) == 1  # 2048 commits/s: request-bound, shards cannot help
    messages = [r.getMessage() for r in caplog.records]
    assert any("26 shards are needed" in m and "capped at max_shards=4" in m for m in messages)
    bound = [m for m in messages if "2048.0 commits/s" in m and "commit less often" in m]
    assert len(bound) == 1 and f"{PROCESS_COMMITS_PER_S:g}" not in bound[0]  # the fit's rate, not the capacity
    assert check_points_to_the_figures(bound[0], "parameter_server.md") == "The pieces"


@pytest.mark.parametrize("kwargs, match", [
    ({"model_bytes": -1}, r"`model_bytes` must be an int >= 0; received model_bytes=-1"),
    ({"model_bytes": 1.5}, r"`model_bytes` must be an int >= 0; received model_bytes=1.5"),
    ({"num_workers": 0}, r"`num_workers` must be an int >= 1; received num_workers=0"),
    ({"num_workers": True}, r"`num_workers` must be an int >= 1; received num_workers=True"),
    ({"commit_interval": 0}, r"`commit_interval` must be a finite number > 0; received commit_interval=0"),
    ({"commit_interval": float("inf")}, r"`commit_interval` must be a finite number > 0; received commit_interval=inf"),
    ({"utilization": 1.5}, r"`utilization` must be a finite number in \(0, 1\]; received utilization=1.5"),
    ({"utilization": 0.0}, r"`utilization` must be a finite number > 0; received utilization=0.0"),
    ({"max_shards": 0}, r"`max_shards` must be an int >= 1; received max_shards=0"),
])
def test_choose_shards_refuses_bad_arguments(kwargs, match):
    args = {"model_bytes": MB, "num_workers": 4, **kwargs}
    with pytest.raises(ConfigError, match=match):
        choose_shards(**args)
