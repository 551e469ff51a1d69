"""elephant.fit.plan: the decisions of a fit, as small functions over numbers."""

from __future__ import annotations

import keras
import pytest

from elephant.config import Settings
from elephant.errors import ConfigError
from elephant.fit.plan import FitPlan, decide_workers, plan_fit
from elephant.fit.window import (MAX_WINDOW, MIN_SYNCS_PER_PASS, ROUND_MIN_WINDOW, ROUND_STEPS, WARMUP_ROUND_STEPS,
                                 WindowChoice, decide_window, estimate_commit_ms, estimate_step_ms, measured_costs,
                                 round_least, warmup_window)
from elephant.optimizers import Compressed, ModelAveraging
from elephant.optimizers.local import MAX_ASYNC_LAG, asynchrony_lag, lag_window
from tests.unit.helpers import check_points_to_the_figures


def _model(width: int = 8, features: int = 4):
    model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(width), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    return model


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
    plan = plan_fit(Settings(**settings), _model(), workers, batch)
    assert {k: plan.as_dict()[k] for k in expected} == expected
    assert plan.num_workers == workers and plan.batch_size == batch
    assert plan.rule.get_config() == plan.as_dict()["optimizer"]


def test_the_plan_describes_a_split_batch_and_the_overlap():
    plan = plan_fit(Settings(mode="synchronous", overlap=True), _model(), 4, 32)
    line = plan.describe()
    assert line.startswith("elephant fit: 4 workers, ")
    assert "batch_size=32 is the global batch: each worker trains batches of 8" in line
    assert "workers train on while a commit is in flight" in line
    assert any("overlap=True in synchronous mode with 4 workers" in w for w in plan.warnings("synchronous"))


# ------------------------------------------------------------------ the window decided from the fit's costs
@pytest.mark.parametrize("floor, step_ms, commit_ms, steps_per_pass, budget, per_pass, expected", [
    (8, 1.0, 0.5, 5000, 0.1, False, 8),        # a kilobyte model: the rule's own window
    (8, 12.0, 20.0, 1400, 0.1, False, 15),     # 5 MB: 20 ms * 0.9 / (0.1 * 12 ms) = 15 steps
    (8, 12.0, 20.0, 1400, 0.2, False, 8),      # a larger budget allows the floor
    (8, 12.0, 20.0, 1400, 0.05, False, 32),    # a smaller one needs a longer window
    (8, 45.0, 80.0, 900, 0.1, False, 16),      # 19 MB
    (8, 1.0, 100.0, 5000, 0.1, False, MAX_WINDOW),  # a slow link: capped at MAX_WINDOW ...
    (8, 1.0, 100.0, 400, 0.1, False, 400 // MIN_SYNCS_PER_PASS),  # ... and at 8 synchronisations per pass
    (8, 1.0, 100.0, 40, 0.1, False, 8),        # a short pass: never below the floor, accuracy first
    (32, 12.0, 20.0, 1400, 0.1, True, 32),     # a per-pass rule on a long pass: windows in steps
    (32, 12.0, 20.0, 256, 0.1, True, 32),      # room for 8 windows of the floor
    (32, 12.0, 20.0, 255, 0.1, True, None),    # no room: one commit per pass, as measured on small data
    (32, 2.0, 400.0, 100_000, 0.1, True, MAX_WINDOW),
])
def test_decide_window(floor, step_ms, commit_ms, steps_per_pass, budget, per_pass, expected):
    assert decide_window(floor, step_ms, commit_ms, steps_per_pass, budget, per_pass=per_pass) == expected


@pytest.mark.parametrize("workers, expected, expected_async", [
    (1, 32, 32),    # no split: the budget's 32 steps
    (2, 32, 32),    # 2 and 4 workers: below ROUND_STEPS / K (64, 32), unchanged
    (4, 32, 32),
    (8, ROUND_STEPS // 8, ROUND_STEPS // 8),  # 8 workers splitting the batch: a round holds at most ROUND_STEPS steps
    (16, 8, ROUND_MIN_WINDOW),  # ... never below the rule's floor (8), nor below 8 for a floor above it (32)
    (64, 8, ROUND_MIN_WINDOW),
])
def test_a_round_of_workers_splitting_the_batch_is_bounded_in_steps(workers, expected, expected_async):
    assert decide_window(8, 12.0, 20.0, 100_000, 0.05, workers=workers) == expected
    assert decide_window(32, 12.0, 20.0, 100_000, 0.05, per_pass=True, workers=workers) == expected_async
    short = decide_window(32, 12.0, 20.0, 255, 0.05, per_pass=True, workers=workers)  # a pass under 8 * 32 steps
    assert short == (None if workers <= 4 else expected_async)  # once per pass, unless the round's window is shorter
    assert decide_window(32, 12.0, 20.0, 255, 0.05, per_pass=True, workers=workers, least=32) is None  # unscaled


@pytest.mark.parametrize("workers", [8, 16, 64])
def test_below_its_floor_the_round_bound_goes_only_as_far_as_least(workers):
    # least: 8 where the workers' rate is scaled, the floor (32) where they train at the compiled rate (SGD)
    assert decide_window(32, 12.0, 20.0, 100_000, 0.05, per_pass=True, workers=workers, least=32) == 32
    assert decide_window(32, 12.0, 20.0, 100_000, 0.05, per_pass=True, workers=workers, least=16) == max(
        16, ROUND_STEPS // workers)
    assert decide_window(8, 12.0, 20.0, 100_000, 0.05, workers=workers, least=32) == max(8, ROUND_STEPS // workers)


@pytest.mark.parametrize("local, workers, least, window", [
    ("adam", 16, ROUND_MIN_WINDOW, ROUND_MIN_WINDOW),  # scaled, ramped: windows bounded by the round
    ("adam", 8, ROUND_MIN_WINDOW, 13),  # the lag bound: 12 * 8 / 7 steps
    ("sgd", 16, 32, 32),  # the compiled rate: the asynchronous default keeps its floor
    ("sgd", 8, 32, 32),
    ("adam", 64, ROUND_MIN_WINDOW, ROUND_MIN_WINDOW),
    ("adam", 80, 32, 32),  # beyond the ramped workers (64) the rate is not scaled either
])
def test_the_asynchronous_defaults_windows_go_below_its_floor_only_with_a_scaled_rate(local, workers, least, window):
    model = _model(width=512, features=256)
    model.compile(keras.optimizers.Adam(1e-3) if local == "adam" else keras.optimizers.SGD(0.01, momentum=0.9), "mse")
    plan = plan_fit(Settings(mode="asynchronous"), model, workers, 64, samples=4_000_000)
    assert round_least(Settings(mode="asynchronous").optimizer, model.optimizer, workers, True) == least
    assert plan.window_choice.least == least and plan.window == window
    assert (plan.learning_rate_scale > 1.0) == (least == ROUND_MIN_WINDOW)
    assert f"windows of {min(32, window)} to {window} steps" in plan.window_choice.describe()
    measured = plan.rechecked([{"steps": 1000, "commits": 50, "seconds": 3.0, "comm_seconds": 2.0}])
    assert measured.window_choice.least == least and measured.window == window  # and on re-check
    synchronous = plan_fit(Settings(mode="synchronous"), model, workers, 64, samples=4_000_000)
    assert synchronous.window == max(8, ROUND_STEPS // workers)  # the synchronous default's floor is 8 either way


@pytest.mark.parametrize("workers, window", [
    (2, 24), (3, 18), (4, 16), (5, 15), (6, 14), (8, 13),  # a lag of MAX_ASYNC_LAG steps at most
    (16, ROUND_MIN_WINDOW), (32, ROUND_MIN_WINDOW),  # beyond, the round bound is the shorter
])
def test_asynchronous_windows_keep_a_workers_lag_within_the_bound(workers, window):
    longest = lag_window(workers)
    assert asynchrony_lag(longest, workers) <= MAX_ASYNC_LAG < asynchrony_lag(longest + 1, workers)
    assert decide_window(32, 12.0, 20.0, 100_000, 0.05, per_pass=True, workers=workers, lagged=True) == window
    assert decide_window(32, 12.0, 20.0, 100_000, 0.05, per_pass=True, workers=workers) == max(
        ROUND_MIN_WINDOW, min(32, ROUND_STEPS // workers))  # a synchronous round has no lag: the round bound only
    model = _model(width=512, features=256)
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    plan = plan_fit(Settings(mode="asynchronous"), model, workers, 64, samples=4_000_000)
    assert plan.window == window and plan.window_choice.lagged
    assert f"lagging the center by at most {MAX_ASYNC_LAG:g} steps" in plan.window_choice.describe()
    measured = plan.rechecked([{"steps": 1000, "commits": 50, "seconds": 3.0, "comm_seconds": 2.0}])
    assert measured.window == window and measured.window_choice.lagged  # and on re-check
    assert not plan_fit(Settings(mode="synchronous"), model, workers, 64, samples=4_000_000).window_choice.lagged


@pytest.mark.parametrize("workers", [2, 4])
def test_the_lag_bound_leaves_short_passes_and_the_compiled_rate_alone(workers):
    # one commit per pass starts every worker from one center; workers at the compiled rate (SGD) keep the floor
    assert decide_window(32, 12.0, 20.0, 255, 0.05, per_pass=True, workers=workers, lagged=True) is None
    assert decide_window(32, 12.0, 20.0, 100_000, 0.05, per_pass=True, workers=workers, least=32, lagged=True) == 32
    model = _model(width=512, features=256)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "mse")
    assert plan_fit(Settings(mode="asynchronous"), model, workers, 64, samples=4_000_000).window == 32


def test_the_round_bound_applies_only_when_the_batch_is_split():
    big = _model(width=512, features=256)
    split = plan_fit(Settings(mode="synchronous", comm_budget=0.02), big, 8, 64, samples=800_000)
    assert split.window == ROUND_STEPS // 8 and split.window_choice.workers == 8
    assert f"at most {ROUND_STEPS} steps" in split.window_choice.describe()
    full = plan_fit(Settings(mode="synchronous", comm_budget=0.02, batch_split=False), big, 8, 64, samples=800_000)
    assert full.window > ROUND_STEPS // 8 and full.window_choice.workers == 1
    measured = split.rechecked([{"steps": 1000, "commits": 50, "seconds": 3.0, "comm_seconds": 2.0}])  # 1, 40 ms
    assert measured.window_choice.measured and measured.window == ROUND_STEPS // 8  # the bound holds on re-check


def test_decided_windows_keep_commits_within_the_budget_unless_accuracy_caps_them():
    for step_ms in (0.5, 2.0, 10.0, 50.0):
        for commit_ms in (0.5, 5.0, 50.0, 500.0):
            for budget in (0.05, 0.1, 0.15):
                window = decide_window(8, step_ms, commit_ms, 100_000, budget)
                share = commit_ms / (commit_ms + window * step_ms)
                assert share <= budget + 1e-9 or window == MAX_WINDOW
                assert window == 8 or commit_ms / (commit_ms + (window - 1) * step_ms) > budget


def test_the_priors_grow_with_the_model():
    assert estimate_commit_ms(2**20) < estimate_commit_ms(20 * 2**20)
    assert estimate_step_ms(10_000, 32) < estimate_step_ms(1_000_000, 32) < estimate_step_ms(1_000_000, 64)
    assert estimate_step_ms(1_000_000, 32, cores=2) < estimate_step_ms(1_000_000, 32)


def test_measured_costs_are_the_partitions_medians():
    stats = [
        {"steps": 100, "commits": 10, "seconds": 2.5, "setup_seconds": 0.5, "comm_seconds": 1.0},  # 10 ms, 100 ms
        {"steps": 100, "commits": 10, "seconds": 1.6, "setup_seconds": 0.1, "comm_seconds": 0.5},  # 10 ms, 50 ms
        {"steps": 100, "commits": 10, "seconds": 3.0, "setup_seconds": 0.0, "comm_seconds": 1.0},  # 20 ms, 100 ms
        {"partition": 3, "samples": 0, "steps": 0, "commits": 0},  # an empty partition says nothing
    ]
    assert measured_costs(stats) == pytest.approx((10.0, 100.0))
    assert measured_costs([{"steps": 0, "commits": 0}]) is None


def test_the_defaults_decide_their_window_and_frequency_wins():
    big = _model(width=512, features=256)  # 0.13M parameters
    plan = plan_fit(Settings(mode="synchronous"), big, 2, 64, samples=200_000)
    assert plan.window_choice is not None and plan.window == plan.window_choice.window
    assert plan.as_dict()["window_choice"]["steps_per_pass"] == 200_000 // 2 // 32
    line = plan.window_choice.describe()
    assert f"window={plan.window} steps" in line and "MB of weights" in line and "estimated" in line
    fixed = plan_fit(Settings(mode="synchronous", frequency=50), big, 2, 64, samples=200_000)
    assert fixed.window == 50 and fixed.window_choice is None
    pinned = plan_fit(Settings(mode="synchronous", optimizer={"name": "modelaveraging", "config": {"window": 5}}),
                      big, 2, 64, samples=200_000)
    assert pinned.window == 5 and pinned.window_choice is None  # a rule given its own window keeps it
    for given in ({"name": "modelaveraging", "config": {"window": 8}}, ModelAveraging(window=8)):
        default_value = plan_fit(Settings(mode="synchronous", optimizer=given), big, 2, 64, samples=200_000)
        assert default_value.window == 8 and default_value.window_choice is None  # even the default's own value
    assert not Compressed(inner={"name": "modelaveraging", "config": {"window": 8}}).adapts_window
    assert Compressed(inner="modelaveraging").adapts_window
    pinned_default = Settings(mode="synchronous", optimizer=ModelAveraging(window=8))
    for settings, adapts in ((Settings(mode="synchronous"), True), (pinned_default, False)):
        again = Settings.from_config(settings.to_config())  # as SparkModel.save and elephant.load carry them
        assert again.optimizer.adapts_window is adapts
        assert (plan_fit(again, big, 2, 64, samples=200_000).window_choice is not None) is adapts
    named = plan_fit(Settings(mode="asynchronous", optimizer="downpour"), big, 2, 64, samples=200_000)
    assert named.window == 1 and named.window_choice is None  # rules without a cost decision keep theirs
    unknown = plan_fit(Settings(mode="synchronous"), big, 2, 64)
    assert unknown.window == 8 and unknown.window_choice is None  # no sample count: the rule's window


def test_the_asynchronous_default_keeps_one_commit_per_short_pass_and_windows_long_ones():
    short = plan_fit(Settings(mode="asynchronous"), _model(), 2, 32, samples=8_000)  # 250 steps per pass
    assert short.window is None and short.window_choice.window is None
    long = plan_fit(Settings(mode="asynchronous"), _model(), 2, 32, samples=200_000)
    assert long.window == long.window_choice.window >= 32


@pytest.mark.parametrize("workers, local, window", [
    (4, "adam", None),   # 2 to 4 workers: one commit per short pass, as measured
    (8, "adam", 13),     # beyond: the workers' rate scaled, the round's (and lag's) windows on short passes too
    (16, "adam", 8),
    (32, "adam", 8),
    (64, "adam", 8),
    (80, "adam", None),  # beyond the workers measured scaled (64): the compiled rate, once per pass
    (8, "sgd", None),    # SGD: the compiled rate, once per pass
])
def test_beyond_four_workers_a_short_asynchronous_pass_commits_in_the_rounds_windows(workers, local, window):
    model = _model()
    model.compile(keras.optimizers.Adam(1e-3) if local == "adam" else keras.optimizers.SGD(0.01), "mse")
    plan = plan_fit(Settings(mode="asynchronous"), model, workers, 64, samples=40 * 64)  # passes of 40 steps
    assert plan.window == plan.window_choice.window == window
    assert (plan.learning_rate_scale > 1.0) == (window is not None or workers <= 4)
    assert plan.window_choice.steps_per_pass <= 40  # a short pass (fewer at 80 workers: batches of 1)
    assert plan.rule.outer.momentum == (0.0 if plan.learning_rate_scale > 1.0 else None)  # else block momentum


def test_a_plan_rechecks_its_window_from_the_first_epochs_timings():
    plan = plan_fit(Settings(mode="synchronous"), _model(width=512, features=256), 2, 64, samples=200_000)
    slow = [{"steps": 1000, "commits": 50, "seconds": 12.0, "setup_seconds": 0.0, "comm_seconds": 2.0}]  # 10, 40 ms
    again = plan.rechecked(slow)
    assert again.window_choice.measured and again.window == decide_window(8, 10.0, 40.0, 3125, 0.1) == 36
    assert again.rechecked(slow) is again  # decided once from measurements
    fixed = plan_fit(Settings(mode="synchronous", frequency=4), _model(), 2, 64, samples=200_000)
    assert fixed.rechecked(slow) is fixed
    assert isinstance(again, FitPlan) and isinstance(again.window_choice, WindowChoice)


@pytest.mark.parametrize("budget", [0, 1, -0.1, 1.5, True, "0.1", None])
def test_comm_budget_is_checked(budget):
    with pytest.raises(ConfigError, match="comm_budget"):
        Settings(comm_budget=budget)


def _model_with(optimizer):
    model = _model()
    model.compile(optimizer, "mse")
    return model


def _adam_model():
    return _model_with(keras.optimizers.Adam(1e-3))


def _adam_schedule_model():
    return _model_with(keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(1e-3, 100, 0.9)))


@pytest.mark.parametrize("workers, model, settings, warned", [
    (8, _adam_schedule_model, {"mode": "synchronous"}, True),   # a schedule: not scaled, the block momentum stays
    (8, _adam_model, {"mode": "synchronous"}, False),            # a numeric rate: scaled (ramped), no momentum
    (80, _adam_model, {"mode": "synchronous"}, True),            # beyond the 64 workers measured scaled
    (8, _adam_model, {"mode": "synchronous", "optimizer": {"name": "modelaveraging",   # scaled: no momentum
                                                           "config": {"sqrt_scaling": True}}}, False),
    (4, _adam_model, {"mode": "synchronous"}, False),      # measured within the target at 2 and 4 workers
    (8, _model, {"mode": "synchronous"}, False),           # SGD: the Conv1D task gained at 8 workers
    (8, _adam_model, {"mode": "synchronous", "optimizer": {"name": "modelaveraging",
                                                           "config": {"outer_momentum": 0.65}}}, False),
])
def test_block_momentum_at_many_workers_under_an_adaptive_optimizer_is_warned_about(workers, model, settings, warned):
    plan = plan_fit(Settings(**settings), model(), workers, 64, samples=100_000)
    found = [w for w in plan.warnings(settings["mode"]) if "block momentum" in w]
    assert bool(found) == warned
    if warned:
        assert f"block momentum 0.75 at {workers} workers" in found[0] and "end behind plain Keras" in found[0]
        assert "fewer workers" in found[0]
        assert check_points_to_the_figures(found[0]) == "Windows at 8 or more workers"


@pytest.mark.parametrize("workers, model, samples, settings, warned", [
    (4, _adam_model, 100_000, {"mode": "asynchronous"}, True),    # windows of 32, the rate scaled: 5-8 behind
    (8, _adam_model, 100_000, {"mode": "asynchronous"}, True),    # scaled and ramped: 2-11 behind after one
    (8, _adam_model, 100_000, {"mode": "asynchronous", "frequency": 16}, True),  # no warm-up windows: 2-41
    (8, _adam_model, 100_000, {"mode": "asynchronous", "optimizer": {"name": "delayednesterov",
                                                                     "config": {"sqrt_scaling": False}}}, True),
    (4, _adam_model, 100_000, {"mode": "asynchronous", "optimizer": {"name": "delayednesterov",
                                                                     "config": {"sqrt_scaling": False}}}, True),
    (2, _adam_model, 100_000, {"mode": "asynchronous"}, False),   # measured within the target at 2 workers
    (4, _model, 100_000, {"mode": "asynchronous"}, False),        # SGD: the Conv1D task held at 4 and 8 workers
    (4, _adam_model, 4_000, {"mode": "asynchronous"}, False),     # one commit per short pass
    (4, _adam_model, 100_000, {"mode": "asynchronous", "optimizer": "downpour"}, False),
    (8, _adam_model, 100_000, {"mode": "synchronous"}, False),    # the synchronous rounds have their own warning
])
def test_asynchronous_windows_at_many_workers_under_an_adaptive_optimizer_are_warned_about(workers, model, samples,
                                                                                          settings, warned):
    plan = plan_fit(Settings(**settings), model(), workers, 64, samples=samples)
    found = [w for w in plan.warnings(settings["mode"]) if "Asynchronous windows" in w]
    assert bool(found) == warned
    if warned:
        assert f"Asynchronous windows at {workers} workers" in found[0] and "mode='synchronous'" in found[0]
    if warned and plan.learning_rate_scale == 1.0:
        assert "at its compiled rate" in found[0] and "fits of one or two epochs" in found[0]
        assert check_points_to_the_figures(found[0]) == "Measured on Spark, 4 and 8 workers (3 seeds)"
    elif warned and workers > 4:
        assert plan.head_steps and f"at sqrt({workers}) times its rate" in found[0]
        assert (plan.warmup_window is None) == ("frequency" in settings)  # the user's window is every epoch's
        assert "after the driver's head, the first epoch can still end behind plain Keras" in found[0]
        assert "For one-epoch fits" in found[0] and check_points_to_the_figures(found[0]) == "Where the defaults stand"
        ramped = plan_fit(Settings(**settings), model(), workers, 64, samples=samples, hosted=True)
        found = [w for w in ramped.warnings(settings["mode"]) if "Asynchronous windows" in w]
        assert not ramped.head_steps and "without a head on the driver" in found[0]  # a server in the tasks: the ramp
        # with the warm-up's windows, or the window the user fixed for every epoch
        assert ("with a window fixed for every epoch" in found[0]) == (ramped.warmup_window is None)
        assert check_points_to_the_figures(found[0]) == "Measured on Spark, 4 and 8 workers (3 seeds)"
    elif warned:
        assert f"at sqrt({workers}) times its rate" in found[0]
        assert plan.head_steps and "after the driver's head, the first epoch can" in found[0]
        assert "For one-epoch fits" in found[0] and check_points_to_the_figures(found[0]) == "Where the defaults stand"
        hosted = plan_fit(Settings(**settings), model(), workers, 64, samples=samples, hosted=True)
        found = [w for w in hosted.warnings(settings["mode"]) if "Asynchronous windows" in w]
        assert not hosted.head_steps and "without a head on the driver" in found[0]  # a server in the tasks: no head
        assert "the second just behind" in found[0] and "For fits of one or two epochs" in found[0]
        assert check_points_to_the_figures(found[0]) == "The workers' rate under an adaptive optimizer"


@pytest.mark.parametrize("workers, scaled, epochs, warned", [
    (8, True, 1, True), (8, True, 2, False), (8, True, None, True),   # ramped: the misses are the first epoch's
    (16, True, 2, True), (16, True, 3, False),                          # beyond 8, two epochs not measured within
    (4, True, 2, False), (4, True, 1, True), (4, True, None, True),    # 2 to 4 workers after a head: the first
    (8, False, 10, True),                                               # unscaled: behind after the second too
])
def test_the_scaled_asynchronous_windows_warning_is_for_the_epochs_measured_behind(workers, scaled, epochs, warned):
    settings = Settings(mode="asynchronous", optimizer={"name": "delayednesterov", "config": {"sqrt_scaling": scaled}})
    plan = plan_fit(settings, _adam_model(), workers, 64, samples=100_000)
    found = [w for w in plan.warnings("asynchronous", epochs) if "Asynchronous windows" in w]
    assert bool(found) == warned
    if found and scaled:  # it names the epochs it warns of: the first alone up to 8 workers, the first two beyond
        assert ("the first two epochs" in found[0]) == (workers > 8)
        assert ("For one-epoch fits" in found[0]) == (workers <= 8)


@pytest.mark.parametrize("epochs, warned", [(1, True), (2, True), (3, False)])
def test_without_a_head_the_warning_at_four_workers_is_for_two_epochs(epochs, warned):
    plan = plan_fit(Settings(mode="asynchronous"), _adam_model(), 4, 64, samples=100_000, hosted=True)
    assert not plan.head_steps  # a server in the tasks: no head
    assert any("Asynchronous windows" in w for w in plan.warnings("asynchronous", epochs)) == warned


@pytest.mark.parametrize("mode", ["synchronous", "asynchronous"])
@pytest.mark.parametrize("workers, warmup", [(2, None), (4, None), (8, WARMUP_ROUND_STEPS // 8), (16, 2), (32, 1),
                                             (64, 1)])
def test_the_first_epochs_ramp_commits_in_shorter_windows_beyond_four_workers(mode, workers, warmup):
    plan = plan_fit(Settings(mode=mode), _adam_model(), workers, 64, samples=200 * 64)
    assert plan.head_steps == 100 and not plan.learning_rate_warmup  # a scaled rate: half the epoch's steps
    assert plan.warmup_window == warmup
    if warmup is not None:
        assert plan.warmup_window < plan.window
        assert f"window={plan.window} ({warmup} in the workers' first 128 steps of the first epoch)" in plan.describe()
        assert plan.as_dict()["warmup_window"] == warmup
    again = plan.rechecked([{"steps": 200, "commits": 50, "seconds": 2.0, "setup_seconds": 0.0, "comm_seconds": 0.5}])
    assert again.warmup_window == plan.warmup_window  # the first epoch's, whatever the later windows


@pytest.mark.parametrize("settings, model", [
    ({"mode": "synchronous", "frequency": 16}, _adam_model),  # the user's window is every epoch's
    ({"mode": "synchronous"}, _adam_schedule_model),          # a schedule: the rate is not ramped
    ({"mode": "synchronous"}, _model),                        # SGD: the compiled rate, not ramped
    ({"mode": "synchronous", "batch_split": False}, _adam_model),  # full batches per worker: no round bound
])
def test_no_warmup_window_where_the_window_is_given_or_the_rate_does_not_ramp(settings, model):
    plan = plan_fit(Settings(**settings), model(), 8, 64, samples=200 * 64)
    assert plan.warmup_window is None


@pytest.mark.parametrize("window, workers, expected", [(16, 8, 4), (4, 8, None), (3, 8, None), (8, 16, 2),
                                                       (8, 33, 1), (None, 8, None)])
def test_warmup_window(window, workers, expected):
    assert warmup_window(window, workers) == expected
