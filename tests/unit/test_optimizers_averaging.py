"""Exact-number tests of synchronous model averaging (optimizers.md §9.7).

Per-worker losses f_k(w) = ½·h_k·(w − t_k)² with t = (1, 3), h = 1 unless stated,
local SGD η = 0.5, θ̃₀ = 0. These are the paper's averaging (no outer momentum,
``outer_momentum=0``); the default outer step is tested in test_optimizers_outer.py.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from elephant.errors import ConfigError
from elephant.optimizers import Commit, Downpour, ModelAveraging, simulate
from elephant.optimizers.averaging import post_local_sgd_step
from elephant.optimizers.simulate import quadratic

Averaging = functools.partial(ModelAveraging, outer_momentum=0.0)
ETA = 0.5
TARGETS = [quadratic(1.0), quadratic(3.0)]


def w(value):
    return [np.array(value, dtype=np.float64)]


def one_round(window, grads=TARGETS, **kwargs):
    n = len(grads)
    schedule = [("pull", k) for k in range(n)] + [("step", k, window) for k in range(n)] + [("commit", k) for k in range(n)]
    return simulate(Averaging(window=window), w(0.0), grads, schedule, local_lr=ETA, **kwargs)


def test_t9_1_window_one_is_synchronous_minibatch_sgd():
    trace = one_round(1)
    assert [float(v.weights[0]) for v in trace.workers.values()] == [1.0, 1.0]  # adopted the center
    assert float(trace.center[0]) == 0 - ETA * np.mean([0 - 1, 0 - 3]) == 1.0
    before = simulate(Averaging(window=1), w(0.0), TARGETS, [("pull", 0), ("pull", 1), ("step", 0), ("step", 1)], local_lr=ETA)
    assert [float(v.weights[0]) for v in before.workers.values()] == [0.5, 1.5]


def test_t9_2_window_two():
    before = simulate(Averaging(), w(0.0), TARGETS, [("pull", 0), ("pull", 1), ("step", 0, 2), ("step", 1, 2)], local_lr=ETA)
    assert [float(v.weights[0]) for v in before.workers.values()] == [0.75, 2.25]
    assert float(one_round(2).center[0]) == 1.5


def test_t9_2_local_sgd_drifts_from_minibatch_sgd_with_different_curvatures():
    grads = [quadratic(1.0, curvature=2.0), quadratic(3.0)]
    local = float(one_round(2, grads).center[0])
    assert local == pytest.approx((1.0 + 2.25) / 2)  # worker 1: 0 → 1 → 1; worker 2: 0 → 1.5 → 2.25
    theta = 0.0
    for _ in range(2):  # two synchronous mini-batch steps
        theta -= ETA * np.mean([2.0 * (theta - 1.0), theta - 3.0])
    assert theta == pytest.approx(1.5625) and local != pytest.approx(theta)


def test_t9_3_identical_workers_give_that_model():
    trace = one_round(3, [quadratic(3.0)] * 3)
    assert float(trace.center[0]) == pytest.approx(3 * (1 - 0.5**3), rel=1e-15)


def test_t9_3_rounds_are_invariant_to_commit_order():
    grads = [quadratic(1.0), quadratic(3.0), quadratic(-2.0, curvature=0.3)]
    results = set()
    for order in itertools.permutations(range(3)):
        schedule = [("pull", k) for k in range(3)]
        for _ in range(5):
            schedule += [("step", k, 2) for k in range(3)] + [("commit", k) for k in order]
        trace = simulate(Averaging(window=2), w(0.0), grads, schedule, local_lr=0.1, num_samples=[1, 5, 3])
        results.add(tuple(float(c[0]) for c in trace.centers))
    assert len(results) == 1


@pytest.mark.parametrize("step, averages", [(0, True), (3, True), (4, True), (5, False), (6, False), (7, True), (10, True), (11, False)])
def test_t9_4_post_local_sgd_schedule(step, averages):
    assert post_local_sgd_step(step, warmup=4, period=3) is averages


def test_t9_4_averaging_steps_after_warm_up():
    assert [s for s in range(4, 13) if post_local_sgd_step(s, warmup=4, period=3)] == [4, 7, 10]


@pytest.mark.parametrize(
    "warmup, period, message",
    [(-1, 3, r"`warmup` must be an int >= 0; received warmup=-1"), (4, 0, r"`period` must be a positive int; received period=0")],
)
def test_post_local_sgd_schedule_is_validated(warmup, period, message):
    with pytest.raises(ConfigError, match=message):
        post_local_sgd_step(0, warmup, period)


def test_t9_5_downpour_under_a_barrier_sums_instead_of_averaging():
    commits = {0: Commit(w(0.5), 1, 1, 0), 1: Commit(w(1.5), 1, 1, 0)}  # T9.1's deltas
    center = w(0.0)
    for k, c in commits.items():  # what "DOWNPOUR + barrier" would do
        center, _, _ = Downpour().apply(None, center, 0, k, c)
    assert float(center[0]) == 2.0
    assert float(Averaging().apply_round(None, w(0.0), 0, commits)[0][0]) == 1.0
    with pytest.raises(ConfigError, match=r"`mode` must be one of \('asynchronous', 'hogwild'\) for Downpour; received mode='synchronous'"):
        simulate(Downpour(), w(0.0), TARGETS, [("pull", 0)], mode="synchronous")


def test_t9_6_second_epoch_is_a_plain_mean():
    epoch = [("pull", 0), ("pull", 1), ("step", 0), ("step", 1), ("commit", 0), ("commit", 1), ("finish", 0), ("finish", 1)]
    trace = simulate(Averaging(window=1), w(0.0), TARGETS, epoch * 2, local_lr=ETA)
    # epoch 2 starts at 1.0: workers reach 1.0 and 2.0; dist-keras' stale buffer would give (1 + 1 + 2)/2 = 2
    assert [float(c[0]) for c in trace.centers] == [1.0, 1.5]


def test_idle_worker_does_not_dilute_the_mean():
    schedule = [("pull", 0), ("pull", 1), ("step", 0), ("commit", 0), ("commit", 1)]
    trace = simulate(Averaging(window=1), w(0.0), TARGETS, schedule, local_lr=ETA)
    assert float(trace.center[0]) == 0.5 and [a.num_samples for a in trace.applied] == [1, 0]


def test_mean_is_weighted_by_samples():
    trace = one_round(1, num_samples=[1, 3])
    assert float(trace.center[0]) == pytest.approx((1 * 0.5 + 3 * 1.5) / 4, rel=1e-15)


def test_round_with_no_trained_worker_leaves_the_center():
    center = w(2.0)
    new, replies, _ = Averaging().apply_round(None, center, 0, {0: Commit(w(0.0), 0, 0, 0)})
    assert new is center and replies == {0: None}
