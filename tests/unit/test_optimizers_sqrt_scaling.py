"""Square-root step scaling of the asynchronous averaging rules (AGN, ADAG, DynSGD).

With the batch split ``K`` ways and an adaptive local optimizer, the default multiplies
each delta by ``√K`` on the server; ``for_fit`` decides it from the model's optimizer.
Exact numbers with hand-written deltas, as in the conformance tables.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest

from elephant.errors import ConfigError
from elephant.optimizers import Commit, get
from elephant.optimizers.local import adapts_step_size

RULES = ["agn", "adag", "dynsgd"]


def w(value):
    return [np.array(value, dtype=np.float64)]


class MyAdam(keras.optimizers.Adam):
    pass


@pytest.mark.parametrize("local, adaptive", [
    (keras.optimizers.Adam(), True),
    (keras.optimizers.AdamW(), True),
    (keras.optimizers.RMSprop(), True),
    (keras.optimizers.Adagrad(), True),
    (keras.optimizers.Nadam(), True),
    (keras.optimizers.Lion(), True),
    (MyAdam(), True),
    (keras.optimizers.LossScaleOptimizer(keras.optimizers.RMSprop()), True),
    (keras.optimizers.SGD(0.01, momentum=0.9), False),
    (keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()), False),
    (object(), False),
])
def test_adaptive_optimizers_are_recognised(local, adaptive):
    assert adapts_step_size(local) is adaptive


@pytest.mark.parametrize("name", RULES)
@pytest.mark.parametrize("local, workers, split, on", [
    (keras.optimizers.Adam(), 4, True, True),
    (keras.optimizers.RMSprop(), 2, True, True),
    (keras.optimizers.SGD(0.01, momentum=0.9), 4, True, False),  # SGD's steps average exactly
    (keras.optimizers.Adam(), 4, False, False),  # full batches: nothing to compensate
    (keras.optimizers.Adam(), 1, True, False),
])
def test_for_fit_turns_it_on_for_adaptive_optimizers_on_a_split_batch(name, local, workers, split, on):
    rule = get(name)
    resolved = rule.for_fit(local, workers, split, rule.window)
    assert resolved.sqrt_scaling is on
    assert rule.sqrt_scaling is None  # the user's rule is not changed
    assert resolved.window == rule.window and type(resolved) is type(rule)


@pytest.mark.parametrize("name", RULES)
def test_one_commit_per_pass_gets_no_factor(name):
    """A pass's delta is a displacement, not a step: the factor overshot it in the convergence benchmark."""
    assert get(name).for_fit(keras.optimizers.Adam(), 4, True, None).sqrt_scaling is False
    assert get(name).for_fit(keras.optimizers.Adam(), 4, True, 32).sqrt_scaling is True


@pytest.mark.parametrize("name", RULES)
def test_an_explicit_setting_wins(name):
    assert get(name, sqrt_scaling=False).for_fit(keras.optimizers.Adam(), 4, True, 5).sqrt_scaling is False
    assert get(name, sqrt_scaling=True).for_fit(keras.optimizers.SGD(), 4, True, None).sqrt_scaling is True


@pytest.mark.parametrize("name", ["downpour", "dcasgd"])
def test_other_rules_run_as_given(name):
    rule = get(name)
    assert rule.for_fit(keras.optimizers.Adam(), 4, True, 5) is rule


@pytest.mark.parametrize("name", ["modelaveraging", "delayednesterov"])
def test_the_averaging_defaults_run_as_given_under_sgd_with_one_commit_per_pass(name):
    rule = get(name)  # their scaling of the workers' rate: see test_local_rate_scaling
    assert rule.for_fit(keras.optimizers.SGD(), 4, True, None) is rule


@pytest.mark.parametrize("name", RULES)
def test_sqrt_scaling_is_validated_and_round_trips(name):
    with pytest.raises(ConfigError, match=r"sqrt_scaling=1"):
        get(name, sqrt_scaling=1)
    rule = get(name, sqrt_scaling=True)
    assert rule.get_config()["sqrt_scaling"] is True
    assert type(rule).from_config(rule.get_config()) == rule


@pytest.mark.parametrize("name", RULES)
def test_describe_says_what_is_added_and_how_to_turn_it_off(name):
    line = get(name, sqrt_scaling=True).describe(4)
    assert "sqrt(4) = 2" in line and "sqrt_scaling=False turns it off" in line
    assert get(name, sqrt_scaling=False).describe(4) == repr(get(name, sqrt_scaling=False))


@pytest.mark.parametrize("name", ["agn", "adag"])
@pytest.mark.parametrize("on, gain", [(True, 2.0), (False, 1.0)])
def test_agn_and_adag_step_is_gain_times_m_over_k(name, on, gain):
    # 4 workers, a fresh commit of m = 3 steps with normalised delta 0.5: θ̃ = 1 + gain · 3/4 · 0.5
    rule = get(name, sqrt_scaling=on)
    state = rule.server_init(w(1.0), 4)
    state = rule.on_pull(state, w(1.0), 0, 0)
    center, _, _ = rule.apply(state, w(1.0), 0, 0, Commit(w(0.5), 3, 24, 0))
    assert float(center[0]) == pytest.approx(1.0 + gain * 0.75 * 0.5, rel=1e-15)


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_dynsgd_divides_the_scaled_delta_by_staleness_plus_one(workers):
    rule = get("dynsgd", sqrt_scaling=True)
    state = rule.server_init(w(0.0), workers)
    # clock 5, commit based on clock 3: staleness 2
    center, _, _ = rule.apply(state, w(0.0), 5, 0, Commit(w(3.0), 5, 40, 3))
    assert float(center[0]) == pytest.approx(math.sqrt(workers) * 3.0 / 3, rel=1e-15)


def test_simulate_fit_resolves_it_from_the_compiled_optimizer():
    from elephant.optimizers import simulate_fit

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    for local, on in [(keras.optimizers.Adam(1e-2), True), (keras.optimizers.SGD(1e-2), False)]:
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
        model.compile(local, "sparse_categorical_crossentropy")
        fit = simulate_fit(model, x, y, epochs=1, batch_size=16, mode="asynchronous", optimizer="agn", num_workers=2)
        assert fit.optimizer.sqrt_scaling is on
