"""Exact-number tests of DC-ASGD (optimizers.md §8.5). Fixture §2.6: ½(w − 3)², SGD η = 0.1."""

from __future__ import annotations

import numpy as np
import pytest

from elephant.errors import ConfigError
from elephant.optimizers import DCASGD, Commit, Downpour, simulate
from elephant.optimizers.dcasgd import DCASGDState
from elephant.optimizers.schedules import round_robin
from elephant.optimizers.simulate import quadratic

ETA = 0.1
GRAD = quadratic(3.0)


def w(value):
    return [np.array(value, dtype=np.float64)]


def centers(trace):
    return [float(c[0]) for c in trace.centers]


def test_t8_1_no_delay_is_a_plain_sgd_step():
    opt = DCASGD(learning_rate=ETA, lambda_dc=0.5)
    state = opt.on_pull(opt.server_init(w(1.0), 1), w(1.0), 0, 0)
    center, reply, _ = opt.apply(state, w(1.0), 0, 0, Commit(w(-0.2), 1, 1, 0))
    assert float(center[0]) == 1.0 + -0.2 and reply is None


def test_t8_2_numbers():
    opt = DCASGD(learning_rate=0.1, lambda_dc=0.04)
    state = opt.on_pull(opt.server_init(w(0.5), 2), w(0.5), 0, worker=1)  # w_bak[1] = 0.5
    g = 2.0
    center, _, state = opt.apply(state, w(1.0), 3, 1, Commit(w(-0.1 * g), 1, 1, 0))  # Δ = −η·g
    assert float(center[0]) == pytest.approx(0.792, rel=1e-12)
    assert (1.0 - float(center[0])) / 0.1 == pytest.approx(2.08, rel=1e-12)  # g̃ = g + λ·g²·(θ̃ − w_bak)
    np.testing.assert_array_equal(state.backups[1][0], center[0])  # worker 1 adopts the reply's center


TWO_STALE = [("pull", 0), ("pull", 1), ("step", 0), ("step", 1), ("commit", 0), ("commit", 1)]


@pytest.mark.parametrize("lambda_dc, second", [(1 / 9, 0.57), (0.0, 0.6), (0.04, 0.5892)])
def test_t8_3_compensation_on_a_quadratic(lambda_dc, second):
    trace = simulate(DCASGD(learning_rate=ETA, lambda_dc=lambda_dc), w(0.0), GRAD, TWO_STALE, local_lr=ETA)
    np.testing.assert_allclose(centers(trace), [0.3, second], rtol=1e-12)


PER_WORKER = [("pull", 0), ("pull", 1), ("step", 0), ("commit", 0), ("pull", 0), ("step", 0), ("commit", 0), ("step", 1), ("commit", 1)]


def test_t8_4_per_worker_backups_recover_sequential_sgd():
    trace = simulate(DCASGD(learning_rate=ETA, lambda_dc=1 / 9), w(0.0), GRAD, PER_WORKER, local_lr=ETA)
    np.testing.assert_allclose(centers(trace), [0.3, 0.57, 0.813], rtol=1e-12)


class SingleSlot(DCASGD):
    """MXNet-style: one 'previous weight' slot, the center before the last update by anyone."""

    def server_init(self, center, num_workers):
        return center

    def on_pull(self, state, center, clock, worker):
        return state

    def apply(self, state, center, clock, worker, commit):
        new_center, reply, _ = super().apply(DCASGDState({worker: state}), center, clock, worker, commit)
        return new_center, reply, center


def test_t8_4_a_single_previous_weight_slot_is_wrong():
    trace = simulate(SingleSlot(learning_rate=ETA, lambda_dc=1 / 9), w(0.0), GRAD, PER_WORKER, local_lr=ETA)
    np.testing.assert_allclose(centers(trace), [0.3, 0.5457, 0.82113], rtol=1e-12)


def test_lambda_zero_is_downpour_bit_for_bit_with_many_workers():
    schedule = round_robin(3, window=1, rounds=20)
    dc = simulate(DCASGD(learning_rate=ETA, lambda_dc=0.0), w(0.0), GRAD, schedule, local_lr=ETA)
    dp = simulate(Downpour(window=1), w(0.0), GRAD, schedule, local_lr=ETA)
    assert centers(dc) == centers(dp) and max(dc.staleness) == 2


def test_window_longer_than_one_uses_the_mean_gradient():
    opt = DCASGD(learning_rate=0.1, lambda_dc=0.04)
    state = opt.on_pull(opt.server_init(w(0.5), 1), w(0.5), 0, 0)
    m, g = 4, 2.0  # four steps of gradient 2: Δ = −η·m·g
    center, _, _ = opt.apply(state, w(1.0), 0, 0, Commit(w(-0.1 * m * g), m, m, 0))
    assert float(center[0]) == pytest.approx(1.0 - 0.1 * m * (g + 0.04 * g * g * 0.5), rel=1e-12)


def test_adaptive_variant():
    opt = DCASGD(learning_rate=0.1, lambda_dc=0.04, adaptive=True, decay=0.95, epsilon=1e-7)
    state = opt.on_pull(opt.server_init(w(0.5), 1), w(0.5), 0, 0)
    np.testing.assert_array_equal(state.mean_square[0], 0.0)
    g = 2.0
    center, _, state = opt.apply(state, w(1.0), 0, 0, Commit(w(-0.1 * g), 1, 1, 0))
    ms = 0.05 * g * g  # MS = decay·0 + (1 − decay)·g²
    lam = 0.04 / np.sqrt(ms + 1e-7)
    assert float(center[0]) == pytest.approx(1.0 - 0.1 * (g + lam * g * g * 0.5), rel=1e-12)
    assert float(state.mean_square[0]) == pytest.approx(ms, rel=1e-12)


def test_constant_variant_keeps_no_mean_square():
    assert DCASGD().server_init(w(0.0), 2) == DCASGDState(backups={}, mean_square=None)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"learning_rate": 0.0}, r"`learning_rate` must be a real number in \(0, inf\); received learning_rate=0.0"),
        ({"lambda_dc": -0.04}, r"`lambda_dc` must be a real number in \[0, inf\); received lambda_dc=-0.04"),
        ({"adaptive": "yes"}, r"`adaptive` must be True or False; received adaptive='yes'"),
        ({"decay": 1.0}, r"`decay` must be a real number in \[0, 1\); received decay=1.0"),
        ({"epsilon": 0}, r"`epsilon` must be a real number in \(0, inf\); received epsilon=0$"),
    ],
)
def test_hyper_parameters_are_validated(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DCASGD(**kwargs)


def test_defaults():
    opt = DCASGD()
    assert (opt.window, opt.learning_rate, opt.lambda_dc, opt.adaptive) == (1, 0.01, 0.04, False)
    assert opt.modes == ("asynchronous",)
