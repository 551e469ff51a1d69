"""Exact-number tests of the elastic-averaging family (optimizers.md §6.7)."""

from __future__ import annotations

import logging
import sys
import types

import numpy as np
import pytest

from elephant.errors import ConfigError
from elephant.optimizers import AEASGD, EAMSGD, EASGD, Commit, Reply, simulate
from elephant.optimizers.simulate import nesterov, quadratic

ETA = 0.1
GRAD = quadratic(3.0)


def weights(value):
    return [np.array(value, dtype=np.float64)]


def exchange(opt, state, x, center, worker=0, clock=0):
    """One atomic AEASGD exchange through the rule methods: returns (x, center, state)."""
    payload, _ = opt.make_commit(None, x, center, 1)
    center, elastic, state = opt.apply(state, center, clock, worker, Commit(payload, 1, 1, clock))
    x, _ = opt.on_reply(None, x, Reply(clock + 1, center, elastic))
    return x, center, state


@pytest.mark.parametrize("cls", [AEASGD, EAMSGD])
@pytest.mark.parametrize("alpha, x_after, center_after", [(0.5, 0.5, 0.5), (1.0, 0.0, 1.0), (0.0, 1.0, 0.0)])
def test_t6_1_single_exchange(cls, alpha, x_after, center_after):
    opt = cls(alpha=alpha)
    x, center, _ = exchange(opt, opt.server_init(weights(0.0), 1), weights(1.0), weights(0.0))
    assert (float(x[0]), float(center[0])) == (x_after, center_after)


@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.37, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("x0, c0", [(1.0, 0.0), (-2.5, 7.25), (1e-3, -4.0)])
def test_t6_2_exchange_conserves_the_sum(alpha, x0, c0):
    opt = AEASGD(alpha=alpha)
    x, center, _ = exchange(opt, opt.server_init(weights(c0), 1), weights(x0), weights(c0))
    assert float(x[0] + center[0]) == pytest.approx(x0 + c0, abs=1e-12)


def test_t6_3_two_workers():
    opt = AEASGD(alpha=0.25)
    state = opt.server_init(weights(0.0), 2)
    x1, center, state = exchange(opt, state, weights(1.0), weights(0.0), worker=0, clock=0)
    assert (float(x1[0]), float(center[0])) == (0.75, 0.25)
    x2, center, state = exchange(opt, state, weights(-1.0), center, worker=1, clock=1)  # E = 0.25·(−1 − 0.25)
    assert (float(x2[0]), float(center[0])) == pytest.approx((-0.6875, -0.0625), abs=1e-15)


def test_t6_4_paper_algorithm_1_ordering():
    """Exchange at t = 0, 2, … before the step; the gradient is taken at the pre-exchange point."""
    opt = AEASGD(alpha=0.5)
    state = opt.server_init(weights(0.0), 1)
    x, center, out = weights(0.0), weights(0.0), []
    for t in range(4):
        x_before = x
        if t % 2 == 0:
            x, center, state = exchange(opt, state, x, center, clock=t // 2)
        x = [x[0] - ETA * GRAD(x_before)[0]]
        out.append((float(x[0]), float(center[0])))
    np.testing.assert_allclose(out, [(0.3, 0), (0.57, 0), (0.528, 0.285), (0.7752, 0.285)], rtol=1e-12)


def test_t6_5_distkeras_ordering_is_a_schedule():
    """Counter from 1, exchange before the step when it % 2 == 0, gradient at the post-exchange point."""
    events = {1: [("step", 0)], 2: [("commit", 0), ("step", 0)], 3: [("step", 0)], 4: [("commit", 0), ("step", 0)]}
    schedule, out = [("pull", 0)], []
    for it in (1, 2, 3, 4):
        schedule += events[it]
        trace = simulate(AEASGD(alpha=0.5, window=2), weights(0.0), GRAD, schedule, local_lr=ETA)
        out.append((float(trace.workers[0].weights[0]), float(trace.center[0])))
    np.testing.assert_allclose(out, [(0.3, 0), (0.435, 0.15), (0.6915, 0.15), (0.678675, 0.42075)], rtol=1e-12)


@pytest.mark.parametrize("alpha", [0.45, None])
def test_t6_6_synchronous_round(alpha):
    opt = EASGD(alpha=alpha)  # None: 0.9 / p with p = 2
    state = opt.server_init(weights(0.0), 2)
    commits = {1: Commit(weights(3.0), 1, 1, 0), 0: Commit(weights(1.0), 1, 1, 0)}
    center, replies, _ = opt.apply_round(state, weights(0.0), 0, commits)
    assert float(center[0]) == pytest.approx(1.8, abs=1e-15)
    x1, _ = opt.on_reply(None, weights(1.0), Reply(1, center, replies[0]))
    x2, _ = opt.on_reply(None, weights(3.0), Reply(1, center, replies[1]))
    assert (float(x1[0]), float(x2[0])) == pytest.approx((0.55, 1.65), abs=1e-15)


def test_easgd_round_conserves_the_sum_and_skips_idle_workers():
    opt = EASGD(alpha=0.3)
    center0 = [np.array([0.5, -1.0])]
    commits = {0: Commit([np.array([2.0, 1.0])], 4, 4, 0), 1: Commit([np.array([-1.0, 3.0])], 4, 4, 0),
               2: Commit([np.array([9.0, 9.0])], 0, 0, 0)}  # trained nothing: no pull on the center
    center, replies, _ = opt.apply_round(opt.server_init(center0, 3), center0, 0, commits)
    after = [opt.on_reply(None, c.tensors, Reply(1, center, replies[k]))[0][0] for k, c in commits.items()]
    np.testing.assert_allclose(center[0] + after[0] + after[1], center0[0] + commits[0].tensors[0] + commits[1].tensors[0])
    np.testing.assert_array_equal(after[2], [9.0, 9.0])
    np.testing.assert_array_equal(replies[2][0], [0.0, 0.0])


def test_easgd_through_simulate_keeps_workers_apart_and_pulls_the_center_between_them():
    targets = [quadratic(1.0), quadratic(3.0)]
    schedule = [("pull", 0), ("pull", 1)] + [("step", 0, 4), ("step", 1, 4), ("commit", 1), ("commit", 0)] * 150
    trace = simulate(EASGD(window=4, alpha=0.2), weights(0.0), targets, schedule, local_lr=ETA)
    w0, w1 = (float(trace.workers[k].weights[0]) for k in (0, 1))
    assert w0 < float(trace.center[0]) < w1 and float(trace.center[0]) == pytest.approx(2.0, abs=1e-6)
    assert len(trace.centers) == 150 and trace.staleness == [0] * 300


def test_t6_7_eamsgd_without_elasticity_is_per_worker_nesterov():
    out = []
    for steps in (1, 2, 3):
        schedule = [("pull", 0), ("step", 0, steps), ("commit", 0)]
        trace = simulate(EAMSGD(alpha=0.0, window=3), weights(0.0), GRAD, schedule, local_step=nesterov(ETA, 0.9, form="paper"))
        assert float(trace.center[0]) == 0.0
        out.append(float(trace.workers[0].weights[0]))
    np.testing.assert_allclose(out, [0.3, 0.813, 1.44723], rtol=1e-12)


def test_keras_nesterov_iterate_is_the_papers_look_ahead_point():
    for steps in (1, 2, 3):
        runs = {
            form: simulate(EAMSGD(alpha=0.0), weights(0.0), GRAD, [("pull", 0), ("step", 0, steps)], local_step=nesterov(ETA, 0.9, form=form)).workers[0]
            for form in ("paper", "keras")
        }
        look_ahead = runs["paper"].weights[0] + 0.9 * runs["paper"].slots[0]
        assert float(runs["keras"].weights[0]) == pytest.approx(float(look_ahead), rel=1e-12)


# ------------------------------------------------------------------ defaults and parity
def test_default_alpha_is_point_nine_over_the_number_of_workers():
    for cls in (EASGD, AEASGD, EAMSGD):
        opt = cls()
        assert opt.alpha is None and opt.window == 32
        assert opt.server_init(weights(0.0), 4) == pytest.approx(0.225)
    assert EAMSGD().momentum == 0.9


def test_rho_and_learning_rate_give_alpha():
    assert AEASGD(rho=5.0, learning_rate=0.1) == AEASGD(alpha=0.5)
    assert EAMSGD(rho=5.0, learning_rate=0.01).get_config()["alpha"] == pytest.approx(0.05)
    assert AEASGD(rho=5.0, learning_rate=0.1).server_init(weights(0.0), 40) == 0.5


def test_easgd_warns_when_beta_exceeds_one(caplog):
    with caplog.at_level(logging.WARNING, logger="elephant.optimizers.easgd"):
        EASGD(alpha=0.5).server_init(weights(0.0), 3)
    assert "beta=1.5 > 1" in caplog.text


def test_eamsgd_local_optimizer_is_keras_nesterov_sgd(monkeypatch):
    calls = []
    fake = types.ModuleType("keras")
    fake.optimizers = types.SimpleNamespace(SGD=lambda **kw: calls.append(kw) or "sgd")
    monkeypatch.setitem(sys.modules, "keras", fake)
    assert EAMSGD(momentum=0.99).local_optimizer(learning_rate=0.05) == "sgd"
    assert calls == [{"learning_rate": 0.05, "momentum": 0.99, "nesterov": True}]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"alpha": 1.5}, r"`alpha` must be a real number in \[0, 1\]; received alpha=1.5"),
        ({"alpha": -0.1}, r"`alpha` must be a real number in \[0, 1\]; received alpha=-0.1"),
        ({"rho": 5.0}, r"`rho` and `learning_rate` go together .*received rho=5.0, learning_rate=None"),
        ({"learning_rate": 0.1}, r"`rho` and `learning_rate` go together .*received rho=None, learning_rate=0.1"),
        ({"alpha": 0.5, "rho": 5.0, "learning_rate": 0.1}, r"either `alpha` or `rho` with `learning_rate`.*alpha=0.5"),
        ({"rho": -1.0, "learning_rate": 0.1}, r"`rho` must be a real number in \[0, inf\); received rho=-1.0"),
        ({"rho": 5.0, "learning_rate": 0.0}, r"`learning_rate` must be a real number in \(0, inf\); received learning_rate=0.0"),
        ({"rho": 5.0, "learning_rate": 0.5}, r"alpha = rho \* learning_rate must be in \[0, 1\].*\(alpha=2.5\)"),
    ],
)
@pytest.mark.parametrize("cls", [EASGD, AEASGD, EAMSGD])
def test_hyper_parameters_are_validated(cls, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        cls(**kwargs)


@pytest.mark.parametrize("momentum", [1.0, -0.5, "0.9"])
def test_eamsgd_momentum_is_validated(momentum):
    with pytest.raises(ConfigError, match=r"`momentum` must be a real number in \[0, 1\); received momentum="):
        EAMSGD(momentum=momentum)


# ------------------------------------------------------------------ progress scaling
@pytest.mark.parametrize("cls", [EASGD, AEASGD, EAMSGD])
@pytest.mark.parametrize("workers, scale", [(1, 2.0), (2, 1.5), (4, 1.25)])
def test_for_fit_gives_the_center_its_share_of_the_progress(cls, workers, scale):
    rule = cls()
    resolved = rule.for_fit(None, workers, True, 32)
    assert resolved.progress_scale == scale and rule.progress_scale is None
    assert "extrapolated by" in resolved.describe(workers) and "progress_scale=1 is the paper's rule" in resolved.describe(workers)
    assert cls(progress_scale=1.0).for_fit(None, workers, True, 32).progress_scale == 1.0
    assert cls(progress_scale=1.0).describe(workers) == repr(cls(progress_scale=1.0))


def test_progress_scale_is_validated():
    with pytest.raises(ConfigError, match=r"received progress_scale=0"):
        AEASGD(progress_scale=0)


def test_extrapolated_exchange_by_hand():
    # start 0, local weights 1 after the window, g = 1.5: send 1.5; α = 0.5 against center 0: E = 0.75
    opt = AEASGD(alpha=0.5, progress_scale=1.5)
    state = opt.worker_init(weights(0.0))
    payload, state = opt.make_commit(state, weights(1.0), weights(0.0), 4)
    assert float(payload[0]) == 1.5
    center, elastic, _ = opt.apply(opt.server_init(weights(0.0), 1), weights(0.0), 0, 0, Commit(payload, 4, 4, 0))
    assert float(center[0]) == 0.75 and float(elastic[0]) == 0.75
    x, state = opt.on_reply(state, weights(1.0), Reply(1, center, elastic))
    assert float(x[0]) == 0.75 and float(state["start"][0]) == 0.75
    # the sum is conserved around the extrapolated point: 1.5 + 0 = 0.75 + 0.75
    assert float(x[0] + center[0]) == 1.5


def test_extrapolation_offset_is_added_to_weights_that_moved_meanwhile():
    opt = AEASGD(alpha=0.5, progress_scale=1.5)
    payload, state = opt.make_commit(opt.worker_init(weights(0.0)), weights(1.0), weights(0.0), 4)
    x, _ = opt.on_reply(state, weights(1.2), Reply(1, weights(0.75), weights(0.75)))
    assert float(x[0]) == pytest.approx(1.2 + 0.5 - 0.75, rel=1e-15)


@pytest.mark.parametrize("scale, speed", [(1.0, 2 / 3), (1.5, 1.0)])
def test_center_moves_at_the_workers_speed_with_the_default_scale(scale, speed):
    """Constant gradient, 2 workers, a step of 0.1 each: the center's speed per round is (K/(K+1))·0.1 in the
    paper's rule and 0.1 with progress_scale = (K+1)/K."""
    drift = lambda w: [np.full_like(w[0], -1.0)]  # noqa: E731
    schedule = [("pull", 0), ("pull", 1)] + [("step", 0, 1), ("step", 1, 1), ("commit", 0), ("commit", 1)] * 300
    trace = simulate(EASGD(window=1, progress_scale=scale), weights(0.0), [drift, drift], schedule, local_lr=0.1)
    centers = [float(c[0]) for c in trace.centers]
    assert (centers[-1] - centers[-101]) / 100 == pytest.approx(0.1 * speed, rel=1e-6)
