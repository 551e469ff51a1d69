"""Exact-number tests of the delta rules: DOWNPOUR (T2), AGN (T3), ADAG (T4), DynSGD (T5).

Fixture of optimizers.md §2.6 unless stated: scalar model, loss ½(w − 3)²,
local SGD with η = 0.1, center θ̃₀ = 0.
"""

from __future__ import annotations

import numpy as np
import pytest

from elephant.errors import ConfigError, DataError
from elephant import optimizers as eo
from elephant.optimizers import Commit, Downpour, DynSGD, simulate
from elephant.optimizers.adag import distance_factor
from elephant.optimizers.schedules import timed
from elephant.optimizers.simulate import quadratic


def AGN(**kwargs):
    """The paper's AGN (``step_scale=1``); the default step is tested in test_optimizers_outer.py."""
    return eo.AGN(**{"step_scale": 1.0, **kwargs})


def ADAG(**kwargs):
    """The thesis' ADAG (``step_scale=1``)."""
    return eo.ADAG(**{"step_scale": 1.0, **kwargs})


ETA = 0.1
GRAD = quadratic(3.0)
TWO_STALE = [("pull", 0), ("pull", 1), ("step", 0), ("step", 1), ("commit", 0), ("commit", 1)]


def run(opt, schedule, **kwargs):
    return simulate(opt, [np.array(0.0)], GRAD, schedule, local_lr=ETA, **kwargs)


def centers(trace):
    return [float(c[0]) for c in trace.centers]


def one_worker(window, commits):
    return [("pull", 0)] + [("step", 0, window), ("commit", 0)] * commits


def commit(value, steps=1, base_clock=0, samples=1):
    return Commit([np.array(value)], num_steps=steps, num_samples=samples, base_clock=base_clock)


# ------------------------------------------------------------------ DOWNPOUR (§2.6)
@pytest.mark.parametrize("window", [1, 2, 3])
def test_t2_1_single_worker_is_sequential(window):
    trace = run(Downpour(window=window), one_worker(window, 3))
    expected = [3 * (1 - 0.9 ** (window * k)) for k in (1, 2, 3)]
    np.testing.assert_allclose(centers(trace), expected, rtol=1e-12)
    if window == 1:
        np.testing.assert_allclose(centers(trace), [0.3, 0.57, 0.813], rtol=1e-12)


def test_t2_2_staleness_is_not_corrected():
    trace = run(Downpour(window=1), TWO_STALE)
    np.testing.assert_allclose(centers(trace), [0.3, 0.6], rtol=1e-12)
    assert trace.staleness == [0, 1]


def test_t2_3_partial_window_is_flushed_with_its_true_step_count():
    trace = run(Downpour(window=3), timed([1.0], window=3, num_steps=7))
    assert [a.num_steps for a in trace.applied] == [3, 3, 1]
    assert float(trace.center[0]) == pytest.approx(3 * (1 - 0.9**7), rel=1e-12)


def test_t2_4_sign_convention():
    opt = Downpour()
    delta, _ = opt.make_commit(None, [np.array(0.3)], [np.array(0.0)], 1)
    assert float(delta[0]) == pytest.approx(0.3)
    center, reply, _ = opt.apply(None, [np.array(0.0)], 0, 0, commit(float(delta[0])))
    assert float(center[0]) == pytest.approx(0.3) and reply is None


# ------------------------------------------------------------------ AGN (§3.7)
@pytest.mark.parametrize("cls", [AGN, ADAG])
def test_t3_1_window_one_is_downpour(cls):
    np.testing.assert_allclose(centers(run(cls(window=1), one_worker(1, 3))), [0.3, 0.57, 0.813], rtol=1e-12)


@pytest.mark.parametrize("cls", [AGN, ADAG])
def test_t3_2_normalisation(cls):
    trace = run(cls(window=2), one_worker(2, 1))
    assert float(trace.center[0]) == pytest.approx(0.57 / 2, rel=1e-12)
    assert float(trace.workers[0].weights[0]) == pytest.approx(0.285, rel=1e-12)  # reset to the center


@pytest.mark.parametrize("window", [1, 2, 5, 12])
def test_t3_3_constant_gradient_commit_is_independent_of_the_window(window):
    slope = 2.0
    trace = simulate(AGN(window=window), [np.array(0.0)], lambda ws: [np.array(-slope)], one_worker(window, 1), local_lr=ETA)
    assert float(trace.center[0]) == pytest.approx(ETA * slope, rel=1e-12)


def test_t3_4_partial_window_is_normalised_by_its_true_length():
    trace = run(AGN(window=3), timed([1.0], window=3, num_steps=7))
    expected, p = [], 0.0
    for m in (3, 3, 1):  # Δ/m with Δ = (3 − p)(1 − 0.9^m) for m SGD steps from p
        p += (3 - p) * (1 - 0.9**m) / m
        expected.append(p)
    np.testing.assert_allclose(centers(trace), expected, rtol=1e-12)
    assert [a.num_steps for a in trace.applied] == [3, 3, 1]


def test_t3_5_two_workers_no_staleness_correction():
    np.testing.assert_allclose(centers(run(AGN(window=1), TWO_STALE)), [0.3, 0.6], rtol=1e-12)


def test_agn_zero_step_commit_is_zero():
    delta, _ = AGN().make_commit(None, [np.array(1.0)], [np.array(1.0)], 0)
    assert float(delta[0]) == 0.0


# ------------------------------------------------------------------ ADAG (§4.5)
@pytest.mark.parametrize(
    "d, gamma, factor",
    [(0.0, 1e-4, 1.0), (0.1, 0.01, 0.5), (0.2, 0.01, 0.2), (-0.2, 0.01, 0.2), (0.1, 1e-4, 1 / 101)],
)
def test_t4_2_factor_table(d, gamma, factor):
    assert float(distance_factor(d, gamma)) == pytest.approx(factor, rel=1e-12)


def test_t4_2_factor_is_element_wise():
    np.testing.assert_allclose(distance_factor(np.array([0.0, 0.1, 0.2]), 0.01), [1.0, 0.5, 0.2], rtol=1e-12)


def test_t4_3_two_workers():
    trace = run(ADAG(window=1, gamma=0.01), TWO_STALE)
    # commit 2: d = 0.3 − 0, factor 1/(0.09/0.01 + 1) = 0.1, θ̃ = 0.3 + 0.1·0.3
    np.testing.assert_allclose(centers(trace), [0.3, 0.33], rtol=1e-12)


def test_t4_4_per_coordinate_scaling():
    opt = ADAG(gamma=0.01)
    center0 = [np.array([0.0, 0.0])]
    state = opt.on_pull(opt.server_init(center0, 2), center0, 0, worker=1)
    moved = [np.array([0.5, 0.0])]  # another worker moved coordinate 0 only
    center, _, state = opt.apply(state, moved, 1, 1, Commit([np.array([0.1, 0.1])], 1, 1, 0))
    np.testing.assert_allclose(center[0], [0.5 + 0.1 / (0.25 / 0.01 + 1), 0.1], rtol=1e-12)
    np.testing.assert_array_equal(state[1][0], center[0])  # the reply's center is worker 1's new pull


def test_adag_records_the_pulled_center_per_worker_without_aliasing():
    opt = ADAG()
    center = [np.array([1.0, 2.0])]
    state = opt.on_pull(opt.server_init(center, 2), center, 0, worker=0)
    center[0][0] = 99.0  # the runtime may reuse its buffers; the rule kept a copy
    assert state[0][0].tolist() == [1.0, 2.0] and 1 not in state


def test_adag_worker_without_a_recorded_pull_is_treated_as_fresh():
    opt = ADAG(gamma=1e-4)
    center, _, _ = opt.apply(opt.server_init([np.array(5.0)], 1), [np.array(5.0)], 3, 0, commit(0.5))
    assert float(center[0]) == 5.5


@pytest.mark.parametrize("gamma", [0, -1e-4, float("inf"), "1e-4", None])
def test_adag_gamma_must_be_positive(gamma):
    with pytest.raises(ConfigError, match=r"`gamma` must be a real number in \(0, inf\); received gamma="):
        ADAG(gamma=gamma)


# ------------------------------------------------------------------ DynSGD (§5.6)
def test_t5_1_single_worker():
    np.testing.assert_allclose(centers(run(DynSGD(window=1), one_worker(1, 3))), [0.3, 0.57, 0.813], rtol=1e-12)


def test_t5_2_two_workers():
    trace = run(DynSGD(window=1), TWO_STALE)
    np.testing.assert_allclose(centers(trace), [0.3, 0.3 + 0.3 / 2], rtol=1e-12)
    assert trace.clocks == [1, 2] and trace.staleness == [0, 1]


def test_t5_4_each_delta_is_divided_by_staleness_plus_one():
    """DynSGD ≡ staleness-aware ASGD with c = 1, σ = τ + 1, on deltas (linear loss: Δ = m·η·a)."""
    slope = 1.5
    schedule = timed([1.0, 1.7, 2.9], window=2, num_steps=9)
    trace = simulate(DynSGD(window=2), [np.array(0.0)], lambda ws: [np.array(-slope)], schedule, local_lr=ETA)
    increments = np.diff([0.0, *centers(trace)])
    expected = [a.num_steps * ETA * slope / (a.staleness + 1) for a in trace.applied]
    np.testing.assert_allclose(increments, expected, rtol=1e-9)
    assert max(trace.staleness) >= 2  # the schedule really is stale


def test_dynsgd_refuses_a_commit_from_the_future():
    with pytest.raises(DataError, match="base_clock=4 is ahead of the server clock 2"):
        DynSGD().apply(None, [np.array(0.0)], 2, 0, commit(1.0, base_clock=4))
