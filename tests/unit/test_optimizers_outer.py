"""Exact-number tests of the outer momentum step, averaging with it, and DelayedNesterov.

Deltas are chosen by hand so every center can be written down: the server's outer step
sees the round's mean delta ``d`` and keeps ``u``; Nesterov: ``u ← βu + d``,
``θ ← θ + α(d + βu)``; heavy ball: ``θ ← θ + αu``.
"""

from __future__ import annotations

import numpy as np
import pytest

from elephant.errors import ConfigError
from elephant.optimizers import Commit, DelayedNesterov, ModelAveraging, get, simulate, worker_batch_size
from elephant.optimizers.outer import OuterMomentum
from elephant.optimizers.schedules import round_robin
from elephant.optimizers.simulate import quadratic
from tests.unit.helpers import check_points_to_the_figures


def w(value):
    return [np.array(value, dtype=np.float64)]


def rounds(opt, deltas, num_workers=2):
    """Apply synchronous rounds whose workers all sent the same delta; return the centers."""
    state, center, out = opt.server_init(w(0.0), num_workers), w(0.0), []
    for clock, d in enumerate(deltas):
        commits = {k: Commit(w(d), 1, 1, clock) for k in range(num_workers)}
        center, _, state = opt.apply_round(state, center, clock, commits)
        out.append(float(center[0]))
    return out


def test_nesterov_outer_step_by_hand():
    # α = 0.5, β = 0.5, d = 1 each round: u = 1, 1.5, 1.75; steps 0.5·(1 + 0.5), 0.5·(1 + 0.75), 0.5·(1 + 0.875)
    got = rounds(ModelAveraging(outer_lr=0.5, outer_momentum=0.5), [1.0, 1.0, 1.0])
    assert got == pytest.approx([0.75, 0.75 + 0.875, 0.75 + 0.875 + 0.9375], rel=1e-15)


def test_heavy_ball_outer_step_by_hand():
    got = rounds(ModelAveraging(outer_lr=0.5, outer_momentum=0.5, nesterov=False), [1.0, 1.0, -1.0])
    # u = 1, 1.5, -0.25 → θ = 0.5, 1.25, 1.125
    assert got == pytest.approx([0.5, 1.25, 1.125], rel=1e-15)


def test_plain_averaging_keeps_no_buffer():
    opt = ModelAveraging(outer_lr=1.0, outer_momentum=0.0)
    assert opt.server_init(w(0.0), 4) is None
    assert rounds(opt, [1.0, 2.0]) == [1.0, 3.0]


@pytest.mark.parametrize("workers, beta, capped", [(1, 0.0, 0.0), (2, 0.5, 0.5), (4, 0.75, 0.75), (8, 0.875, 0.75),
                                                   (32, 0.96875, 0.75)])
def test_block_momentum_default_is_one_minus_one_over_k_and_averaging_caps_its_gain_at_4(workers, beta, capped):
    assert OuterMomentum(1.0, None).resolve_momentum(workers) == beta
    assert OuterMomentum(1.0, None, max_gain=4).resolve_momentum(workers) == capped
    state = ModelAveraging(outer_momentum=None).server_init(w(0.0), workers)
    assert (state is None) if workers == 1 else state["momentum"] == capped
    assert ModelAveraging(outer_momentum=0.9).server_init(w(0.0), workers)["momentum"] == 0.9  # given: kept


def test_outer_momentum_with_one_worker_is_sequential_sgd():
    """β = 1 − 1/K is 0 for K = 1, so the default outer step leaves averaging exact."""
    schedule = [("pull", 0)] + [("step", 0, 2), ("commit", 0)] * 3
    trace = simulate(ModelAveraging(window=2, outer_momentum=None), w(0.0), quadratic(3.0), schedule, local_lr=0.1)
    assert float(trace.center[0]) == pytest.approx(3 * (1 - 0.9**6), rel=1e-12)


def test_outer_momentum_moves_further_than_averaging_on_a_quadratic():
    grads = [quadratic(1.0), quadratic(3.0)]
    plain = simulate(ModelAveraging(window=2, outer_momentum=0.0), w(0.0), grads, round_robin(2, 2, 3), mode="synchronous",
                     local_lr=0.05, on_blocked="defer")
    outer = simulate(ModelAveraging(window=2, outer_momentum=None), w(0.0), grads, round_robin(2, 2, 3), mode="synchronous",
                     local_lr=0.05, on_blocked="defer")
    assert 0 < float(plain.center[0]) < float(outer.center[0]) < 2.0 + 1e-9


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"outer_lr": 0.0}, r"`outer_lr` must be a real number in \(0, inf\); received outer_lr=0.0"),
        ({"outer_momentum": 1.0}, r"`outer_momentum` must be a real number in \[0, 1\); received outer_momentum=1.0"),
        ({"nesterov": "yes"}, r"`nesterov` must be True or False; received nesterov='yes'"),
    ],
)
def test_outer_arguments_are_validated(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ModelAveraging(**kwargs)


# ----------------------------------------------------------------- DelayedNesterov
def test_delayed_nesterov_scales_each_commit_and_adds_momentum_every_k_commits():
    opt = DelayedNesterov(outer_lr=1.0, outer_momentum=0.5)
    state, center = opt.server_init(w(0.0), 2), w(0.0)
    centers = []
    for clock, d in enumerate([2.0, 4.0, 2.0, 4.0]):
        center, _, state = opt.apply(state, center, clock, clock % 2, Commit(w(d), 1, 1, clock))
        centers.append(float(center[0]))
    # commit 1: +2/2 = 1. commit 2: +4/2 → 3, then u = 3, +0.5·3 → 4.5.
    # commit 3: +1 → 5.5. commit 4: +2 → 7.5, u = 0.5·3 + 3 = 4.5, +2.25 → 9.75.
    assert centers == [1.0, 4.5, 5.5, 9.75]


def test_delayed_nesterov_equals_a_synchronous_round_when_deltas_share_a_start():
    deltas = [0.3, -1.1, 2.0]
    sync = ModelAveraging(outer_lr=0.7, outer_momentum=0.9)
    s_state = sync.server_init(w(0.0), 3)
    s_center, _, s_state = sync.apply_round(s_state, w(0.0), 0, {k: Commit(w(d), 1, 1, 0) for k, d in enumerate(deltas)})
    asyn = DelayedNesterov(outer_lr=0.7, outer_momentum=0.9)
    a_state, a_center = asyn.server_init(w(0.0), 3), w(0.0)
    for k, d in enumerate(deltas):
        a_center, _, a_state = asyn.apply(a_state, a_center, k, k, Commit(w(d), 1, 1, 0))
    assert float(a_center[0]) == pytest.approx(float(s_center[0]), rel=1e-12)


def test_delayed_nesterov_with_one_worker_is_sequential():
    schedule = [("pull", 0)] + [("step", 0, 3), ("commit", 0)] * 2
    trace = simulate(DelayedNesterov(window=3), w(0.0), quadratic(3.0), schedule, local_lr=0.1)
    assert float(trace.center[0]) == pytest.approx(3 * (1 - 0.9**6), rel=1e-12)


def test_averaging_rules_split_the_batch_and_additive_rules_do_not():
    assert get("modelaveraging").splits_batch and get("delayednesterov").splits_batch
    assert not get("downpour").splits_batch and not get("dcasgd").splits_batch


@pytest.mark.parametrize("batch, workers, split, expected", [(32, 2, True, 16), (32, 3, True, 11), (5, 8, True, 1),
                                                             (32, 4, False, 32)])
def test_worker_batch_size(batch, workers, split, expected):
    assert worker_batch_size(batch, workers, split) == expected


# ----------------------------------------------------------------- setup warnings
def test_averaging_without_batch_split_is_warned_about():
    assert ModelAveraging().setup_warning(8, 2, batch_split=True) is None
    message = ModelAveraging().setup_warning(8, 4, batch_split=False)
    assert "batch_split=False" in message and "1/4 of plain training's steps" in message  # the risk
    assert "Keep the default batch split" in message  # the remedy
    assert check_points_to_the_figures(message) == "Why averaging falls behind, and the two fixes in the defaults"
    assert ModelAveraging().setup_warning(8, 1, batch_split=False) is None  # one worker: nothing to split


def test_downpour_with_one_commit_per_pass_is_warned_about():
    message = get("downpour").setup_warning(None, 2, batch_split=False)
    assert "frequency='epoch'" in message and "2 times as far as one worker did and oscillates" in message
    assert "Use the asynchronous default" in message and "default window of one step" in message
    assert check_points_to_the_figures(message) == "Named rules at their default window"
    assert get("downpour").setup_warning(1, 2, batch_split=False) is None
    assert get("downpour").setup_warning(None, 1, batch_split=False) is None


@pytest.mark.parametrize("window, workers, warned", [
    (1, 2, False), (1, 4, False), (2, 2, False), (2, 3, True), (2, 4, True), (5, 2, True), (5, 1, False),
])
def test_downpour_with_stale_windows_is_warned_about(window, workers, warned):
    message = get("downpour").setup_warning(window, workers, batch_split=False)
    assert (message is not None) == warned
    if warned:
        assert f"window of {window} steps and {workers} workers" in message and "window=1" in message
        assert f"{(workers - 1) * window} local steps stale" in message and "overshoot" in message
        assert check_points_to_the_figures(message) == "Named rules at their default window"


def test_downpour_default_window_is_one_step():
    assert get("downpour").window == 1 and get("downpour", window=5).window == 5


def test_delayed_nesterov_with_short_windows_and_many_workers_is_warned_about():
    assert DelayedNesterov().setup_warning(None, 8, batch_split=True) is None
    assert DelayedNesterov().setup_warning(8, 2, batch_split=True) is None
    message = DelayedNesterov().setup_warning(8, 4, batch_split=True)
    assert "window of 8 steps, 4 workers and outer momentum" in message and "amplifies that staleness" in message
    assert "Keep the default" in message and check_points_to_the_figures(message) == "Defaults"
    assert "outer_momentum=0" in DelayedNesterov(outer_momentum=0.5).setup_warning(16, 8, batch_split=True)
    assert DelayedNesterov().setup_warning(32, 8, batch_split=True) is None  # the decided windows are not
    fitted = DelayedNesterov().for_fit(None, 8, True, 16)  # nor the default's windows at 8 workers: no momentum
    assert fitted.outer.momentum == 0.0 and fitted.setup_warning(16, 8, batch_split=True) is None


@pytest.mark.parametrize("name", ["easgd", "aeasgd", "eamsgd"])
def test_elastic_rules_warn_from_four_workers_and_in_the_papers_form(name):
    rule = get(name).for_fit(None, 2, True, 32)
    assert rule.setup_warning(rule.window, 1, batch_split=True) is None
    assert rule.setup_warning(rule.window, 2, batch_split=True) is None
    message = get(name).for_fit(None, 4, True, 32).setup_warning(rule.window, 4, batch_split=True)
    assert "with 4 workers" in message and "adaptive local optimizer" in message and "falls behind" in message
    assert "optimizer=None" in message and check_points_to_the_figures(message) == "Named rules at their default window"
    paper = get(name, progress_scale=1.0).setup_warning(rule.window, 2, batch_split=True)
    assert "progress_scale=1" in paper and "one more body sharing the workers' progress" in paper
    assert "progress_scale=None" in paper and "further with more workers" in paper
    assert check_points_to_the_figures(paper) == "Named rules at their default window"
    # the batch-split warning of the base class comes first
    assert "batch_split=False" in rule.setup_warning(rule.window, 2, batch_split=False)


@pytest.mark.parametrize("name", ["agn", "adag", "dynsgd"])
def test_asynchronous_averaging_rules_warn_from_four_workers(name):
    rule = get(name)
    assert rule.setup_warning(rule.window, 2, batch_split=True) is None
    message = rule.setup_warning(rule.window, 4, batch_split=True)
    assert "with 4 workers averages" in message and "falls behind plain training" in message  # the risk
    assert f"({rule.averaging_shortfall})" in message and "DelayedNesterov" in message  # where, and the remedy
    assert check_points_to_the_figures(message) == "Named rules at their default window"
    compressed = get("compressed", inner=rule)  # the inner rule's shortfall, figures and warning
    assert (compressed.averaging_shortfall, compressed.averaging_figures) == (rule.averaging_shortfall,
                                                                              rule.averaging_figures)
    assert compressed.setup_warning(rule.window, 4, batch_split=True) == message
    assert "batch_split=False" in rule.setup_warning(rule.window, 4, batch_split=False)


def test_paper_form_agn_is_not_warned_as_averaging():
    assert get("agn", step_scale=1.0).setup_warning(12, 4, batch_split=False) is None


@pytest.mark.parametrize("workers, window, beta", [
    (4, 32, 0.0),          # windows: no outer momentum (block momentum overshoots over windows)
    (16, 64, 0.0),
    (4, None, None),       # one commit per pass keeps block momentum 1 - 1/K
    (1, 32, None),         # one worker: sequential, nothing to resolve
])
def test_delayed_nesterov_runs_windowed_fits_without_outer_momentum(workers, window, beta):
    rule = DelayedNesterov().for_fit(object(), workers, True, window)
    assert rule.outer.momentum == beta
    if beta is None:
        assert rule.outer.resolve_momentum(workers) == pytest.approx(1 - 1 / workers)


def test_a_given_outer_momentum_is_kept_with_windows():
    assert DelayedNesterov(outer_momentum=0.9).for_fit(object(), 4, True, 32).outer.momentum == 0.9


# ----------------------------------------------------------------- fused forms: the same numbers
def _server_trace(monkeypatch, fused):
    """Centers and rule state of DelayedNesterov and averaging with momentum over a few commits and rounds."""
    import elephant.optimizers.delayed_nesterov as dn_module
    import elephant.optimizers.outer as outer_module

    if not fused:
        monkeypatch.setattr(outer_module, "fusable", lambda *args: False)
        monkeypatch.setattr(dn_module, "fusable", lambda *args: False)
    rng = np.random.default_rng(3)
    center = [rng.normal(size=s).astype(np.float32) for s in [(40, 7), (13,), ()]]
    out = []
    for rule in [DelayedNesterov(outer_lr=0.7, outer_momentum=0.9), DelayedNesterov(), DelayedNesterov(outer_momentum=0.0)]:
        state, c = rule.server_init(center, 3), center
        for i in range(7):
            delta = [np.float32(0.01 * (i + 1)) * np.sin(a + i) for a in center]
            c, _, state = rule.apply(state, c, i, i % 3, Commit(delta, 1, 1, 0))
        out.append([a.tobytes() for a in (*c, *state["buffer"], *state["pending"])] + [state["count"]])
    for rule in [ModelAveraging(outer_momentum=0.75), ModelAveraging(outer_lr=0.7, outer_momentum=0.5, nesterov=False)]:
        state, c = rule.server_init(center, 3), center
        for r in range(4):
            commits = {k: Commit([np.float32(0.02 * (k + 1 + r)) * np.cos(a * k) for a in center], 1, 5 + k, 0)
                       for k in range(3)}
            c, _, state = rule.apply_round(state, c, r, commits)
        out.append([a.tobytes() for a in (*c, *state["buffer"])])
    return out


def test_the_fused_server_rules_give_the_plain_expressions_numbers(monkeypatch):
    fused = _server_trace(monkeypatch, fused=True)
    assert fused == _server_trace(monkeypatch, fused=False)


def test_fusing_needs_python_float_factors_and_one_float_dtype():
    from elephant.optimizers.outer import fusable

    f32 = [np.ones(3, np.float32)]
    assert fusable(0.5, 0.9, f32, f32)
    assert not fusable(np.float64(0.5), 0.9, f32, f32)  # a NumPy scalar widens the plain expression to float64
    assert not fusable(0.5, 0.9, f32, [np.ones(3, np.float64)])
    assert not fusable(0.5, 0.9, [np.ones(3, np.int32)])
