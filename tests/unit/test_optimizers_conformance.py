"""One conformance table over every registered distributed optimizer.

Adding an optimizer = its file + one ``Row`` below. Each row gives the keyword
arguments the checks construct it with (``kwargs``), its documented default
window (optimizers.md Appendix A.2), and, where §14.6 lists one, what it must
reduce to with a single worker (``n1``): ``"sequential"`` (plain sequential SGD,
up to float rounding) or another row's name plus that row's kwargs (bit-identical).
"""

from __future__ import annotations

import dataclasses
import itertools
import pickle

import cloudpickle
import numpy as np
import pytest

from elephant.optimizers import Commit, get, registered_names, serialize, simulate
from elephant.optimizers.schedules import round_robin
from elephant.optimizers.simulate import quadratic

LR = 0.1  # the local SGD learning rate of every simulation here


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    window: int | None  # documented default (None: one commit per partition pass)
    kwargs: dict = dataclasses.field(default_factory=dict)
    n1: str | tuple[str, dict] | None = None
    lossy: float = 0.0  # a lossy payload's relative error bound (int8: half a step of 127, 1/254)


TABLE = [
    Row("downpour", 1, n1="sequential"),
    Row("agn", 12, {"window": 1}, n1=("downpour", {"window": 1})),
    Row("adag", 12, {"gamma": 1e-2}, n1=("agn", {})),
    Row("dynsgd", 5, n1=("downpour", {})),
    Row("easgd", 32, {"alpha": 0.2}),
    Row("aeasgd", 32, {"alpha": 0.2}),
    Row("eamsgd", 32, {"alpha": 0.2, "momentum": 0.5}),
    Row("modelaveraging", 8, n1="sequential"),
    Row("dcasgd", 1, {"learning_rate": LR}, n1=("downpour", {"window": 1})),
    Row("delayednesterov", None, {"window": 8}, n1="sequential"),
    # the rule transform: DOWNPOUR's commits in int8 with blocks of 4 (lossy, so no single-worker reduction)
    Row("compressed", None, {"inner": "downpour", "codec": "int8", "block": 4}, lossy=1 / 254),
]
ROWS = {row.name: row for row in TABLE}
rows = pytest.mark.parametrize("row", TABLE, ids=[r.name for r in TABLE])


def make(row: Row, **overrides):
    return get(row.name, **{**row.kwargs, **overrides})


def mixed_init():
    return [np.zeros((3, 2), np.float32), np.zeros((2,), np.float32)]


def mixed_target():
    rng = np.random.default_rng(7)
    return [rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=(2,)).astype(np.float32)]


def test_table_covers_every_registered_optimizer():
    assert sorted(ROWS) == registered_names()


@rows
def test_default_window_and_modes(row):
    opt = get(row.name)
    assert opt.window == row.window
    assert get(row.name, window=3).window == 3
    assert opt.modes and set(opt.modes) <= {"synchronous", "asynchronous", "hogwild"}


@rows
def test_sign_convention_t00(row):
    """T-00: one worker, one SGD step on ½(w − 3)² from 0 moves the center towards 3."""
    trace = simulate(make(row), [np.array(0.0)], quadratic(3.0), [("pull", 0), ("step", 0), ("commit", 0)], local_lr=LR)
    assert 0.0 < float(trace.center[0]) <= 0.3 * (1 + row.lossy) + 1e-12


@rows
def test_structure_and_dtype_preserved(row):
    opt = make(row, window=2)
    init = [np.full((3, 2), 0.5, np.float32), np.arange(2, dtype=np.float32)]
    trace = simulate(opt, init, quadratic(mixed_target()), round_robin(3, 2, 3), local_lr=LR)
    for arrays in [trace.center, *trace.centers, *(w.weights for w in trace.workers.values())]:
        assert [(a.shape, a.dtype) for a in arrays] == [((3, 2), np.float32), ((2,), np.float32)]
    assert all(isinstance(a, np.ndarray) for a in trace.center)


@rows
def test_zero_update_is_a_no_op(row):
    init = [np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2), np.array([2.0, -3.0], np.float32)]
    zero = lambda ws: [np.zeros_like(w) for w in ws]  # noqa: E731
    trace = simulate(make(row, window=2), init, zero, round_robin(2, 2, 3), local_lr=LR)
    assert len(trace.centers) > 0
    for got, want in zip(trace.center, init, strict=True):
        np.testing.assert_array_equal(got, want)
    for worker in trace.workers.values():
        for got, want in zip(worker.weights, init, strict=True):
            np.testing.assert_array_equal(got, want)


@rows
def test_rule_and_states_pickle(row):
    opt = make(row, window=2)
    schedule = round_robin(2, 2, 3)
    trace = simulate(opt, mixed_init(), quadratic(mixed_target()), schedule, local_lr=LR)
    for dumps, loads in [(pickle.dumps, pickle.loads), (cloudpickle.dumps, pickle.loads)]:
        clone = loads(dumps(opt))
        assert clone == opt and type(clone) is type(opt)
        for state in [trace.server_state, *(w.state for w in trace.workers.values())]:
            assert pickle.dumps(loads(dumps(state))) == pickle.dumps(state)
        replay = simulate(clone, mixed_init(), quadratic(mixed_target()), schedule, local_lr=LR)
        for got, want in zip(replay.center, trace.center, strict=True):
            np.testing.assert_array_equal(got, want)


@rows
def test_get_round_trips_through_config(row):
    opt = make(row)
    assert type(get(row.name)) is type(opt)
    assert get(serialize(opt)) == opt
    assert get({"name": row.name.upper(), "config": opt.get_config()}) == opt
    assert type(opt).from_config(opt.get_config()) == opt
    assert get(opt) is opt
    assert serialize(opt)["name"] == row.name
    assert repr(opt).startswith(type(opt).__name__ + "(")


@rows
@pytest.mark.parametrize("num_workers", [1, 4])
@pytest.mark.parametrize("problem", ["scalar", "mixed"])
def test_converges_on_a_quadratic(row, num_workers, problem):
    opt = make(row, window=4)
    if problem == "scalar":
        init, target = [np.array(0.0)], [np.array(3.0)]
    else:
        init, target = mixed_init(), mixed_target()
    trace = simulate(opt, init, quadratic(target), round_robin(num_workers, 4, 100), local_lr=LR)
    for got, want in zip(trace.center, target, strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, atol=1e-3)


SYNC_ROWS = [r for r in TABLE if "synchronous" in get(r.name).modes]


@pytest.mark.parametrize("row", SYNC_ROWS, ids=[r.name for r in SYNC_ROWS])
def test_synchronous_rounds_ignore_commit_order(row):
    """apply_round must not depend on the order commits arrived in (the dict's order)."""
    opt = make(row)
    rng = np.random.default_rng(3)
    center = [a + rng.normal(size=a.shape).astype(np.float32) for a in mixed_init()]
    commits = {
        k: Commit([rng.normal(size=a.shape).astype(np.float32) for a in center], 2, samples, 0)
        for k, samples in enumerate([3, 1, 7, 2])
    }
    results = set()
    for order in itertools.permutations(commits):
        new, replies, _ = opt.apply_round(opt.server_init(center, 4), center, 0, {k: commits[k] for k in order})
        replies = [replies[k] for k in sorted(replies)]
        results.add(tuple(a.tobytes() for arrays in [new, *(r for r in replies if r is not None)] for a in arrays))
    assert len(results) == 1


def _sequential(init, grad, steps):
    w, out = [np.array(x) for x in init], []
    for _ in range(steps):
        w = [x - LR * g for x, g in zip(w, grad(w), strict=True)]
        out.append(w)
    return out


@pytest.mark.parametrize("row", [r for r in TABLE if r.n1], ids=[r.name for r in TABLE if r.n1])
def test_single_worker_reduction(row):
    """§14.6: with n = 1 the rule reduces to sequential SGD or to a simpler rule."""
    opt = make(row)
    w = opt.window
    schedule = [("pull", 0)] + [("step", 0, w), ("commit", 0)] * 3 + [("step", 0), ("commit", 0), ("finish", 0)]
    init, grad = mixed_init(), quadratic(mixed_target())
    trace = simulate(opt, init, grad, schedule, local_lr=LR)
    if row.n1 == "sequential":
        seq = _sequential(init, grad, 3 * w + 1)
        for center, steps in zip(trace.centers, [w, 2 * w, 3 * w, 3 * w + 1], strict=True):
            for got, want in zip(center, seq[steps - 1], strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    else:
        name, kwargs = row.n1
        other = simulate(get(name, **{**kwargs, "window": w}), init, grad, schedule, local_lr=LR)
        assert len(trace.centers) == len(other.centers) == 4
        for mine, theirs in zip(trace.centers, other.centers, strict=True):
            for got, want in zip(mine, theirs, strict=True):
                np.testing.assert_array_equal(got, want)
