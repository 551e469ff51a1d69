"""The asynchronous workers' running mean of the gradient, younger by their commits' lag (LocalMomentum)."""

import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
import keras  # noqa: E402

from elephant import optimizers as O  # noqa: E402
from elephant import worker  # noqa: E402
from elephant.config import Settings  # noqa: E402
from elephant.errors import ConfigError  # noqa: E402
from elephant.fit.plan import plan_fit  # noqa: E402
from elephant.model_io import model_to_bytes  # noqa: E402
from elephant.optimizers.local import LocalMomentum, asynchrony_lag  # noqa: E402

ADAM = keras.optimizers.Adam


@pytest.mark.parametrize("window, workers, lag", [
    (16, 8, 7.0),      # 7/8 of half a window
    (8, 16, 3.75),
    (8, 32, 3.875),
    (32, 2, 8.0),
    (32, 1, 0.0),      # one worker waits for no one
])
def test_the_lag_is_what_the_others_trained_since_their_last_commits(window, workers, lag):
    assert asynchrony_lag(window, workers) == pytest.approx(lag)


@pytest.mark.parametrize("local, lag, expected", [
    (ADAM(beta_1=0.9), 7.0, 2 / 3),            # 9 steps old, less 7: 2 steps, beta_1 2/3
    (ADAM(beta_1=0.9), 3.75, 5.25 / 6.25),
    (ADAM(beta_1=0.95), 7.0, 12 / 13),         # 19 steps less 7
    (ADAM(beta_1=0.9), 12.0, 0.0),             # the lag outlasts the compiled mean: none of its own
    (keras.optimizers.AdamW(beta_1=0.9), 7.0, 2 / 3),
    (keras.optimizers.LossScaleOptimizer(ADAM(beta_1=0.9)), 7.0, 2 / 3),  # its inner optimizer's
    (ADAM(beta_1=0.9), 0.0, None),             # nothing late
    (ADAM(beta_1=0.0), 7.0, None),             # no running mean to shorten
    (keras.optimizers.Nadam(), 7.0, None),     # its momentum schedule corrects the start otherwise: as compiled
    (keras.optimizers.RMSprop(momentum=0.9), 7.0, None),
    (keras.optimizers.SGD(momentum=0.9), 7.0, None),
])
def test_the_workers_running_mean_is_the_lag_younger(local, lag, expected):
    momentum = LocalMomentum.for_lag(local, lag)
    if expected is None:
        assert momentum is None
        return
    assert momentum.name == "beta_1" and momentum.decay == pytest.approx(expected, abs=1e-6)
    age = momentum.compiled / (1 - momentum.compiled)
    assert momentum.decay / (1 - momentum.decay) == pytest.approx(max(age - lag, 0.0), abs=1e-4)


def _adam_model(beta_1=0.9):
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    m.compile(ADAM(1e-3, beta_1=beta_1), "mse")
    return m


@pytest.mark.parametrize("mode, given, samples, workers, windowed", [
    ("asynchronous", {}, 100_000, 8, True),        # the default with windows: on
    ("asynchronous", {}, 100_000, 4, False),       # at 2 to 4 workers measured no better: as compiled
    ("asynchronous", {"momentum_scaling": True}, 100_000, 2, True),
    ("asynchronous", {}, 2_000, 2, False),         # one commit per short pass: every worker starts together
    ("asynchronous", {"momentum_scaling": False}, 100_000, 8, False),
    ("asynchronous", {"sqrt_scaling": False}, 100_000, 8, False),   # unscaled: as compiled, unless forced
    ("asynchronous", {"sqrt_scaling": False, "momentum_scaling": True}, 100_000, 8, True),
    ("synchronous", {}, 100_000, 8, False),         # a round starts every worker from the same center
])
def test_the_plan_decides_the_workers_running_mean_from_its_window(mode, given, samples, workers, windowed):
    rule = (O.DelayedNesterov if mode == "asynchronous" else O.ModelAveraging)(**given)
    plan = plan_fit(Settings(mode=mode, optimizer=rule), _adam_model(), workers, 64, samples)
    if not windowed:
        assert plan.local_momentum is None and plan.as_dict()["local_momentum"] is None
        assert "beta_1" not in plan.describe()
        return
    assert plan.window is not None
    lag = asynchrony_lag(plan.window, workers)
    assert plan.local_momentum == LocalMomentum.for_lag(ADAM(beta_1=0.9), lag)
    assert plan.as_dict()["local_momentum"]["lag"] == pytest.approx(lag)
    assert f"beta_1 {plan.local_momentum.decay:.6g} instead of 0.9" in plan.describe()
    assert "momentum_scaling=False" in plan.describe()


def test_momentum_scaling_is_checked_and_round_trips():
    with pytest.raises(ConfigError, match=r"momentum_scaling='yes'"):
        O.DelayedNesterov(momentum_scaling="yes")
    rule = O.get("delayednesterov", momentum_scaling=False)
    assert rule.momentum_scaling is False and type(rule).from_config(rule.get_config()) == rule
    fitted = rule.for_fit(ADAM(), 8, True, 16)
    assert fitted.momentum_scaling is False and fitted.local_momentum(ADAM(), 8, True, 16) is None


def test_a_replica_of_a_model_that_took_steps_trains_at_the_workers_beta_1_from_its_corrected_mean():
    """A replica built from the archive of a model whose Adam took 3 steps at the compiled beta_1 (the driver's
    head) holds m summed at 0.9; at the workers' 2/3 it is restated, so that m/(1 − (2/3)^3) reads what
    m/(1 − 0.9^3) did, and the replica's next step is Adam's at beta_1 2/3 from that corrected mean."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(24, 3)).astype("float32"), rng.normal(size=(24, 2)).astype("float32")
    m = _adam_model()
    for i in range(3):
        m.train_on_batch(x[8 * i:8 * i + 8], y[8 * i:8 * i + 8])
    held = [np.array(v) for v in m.optimizer._momentums]
    momentum = LocalMomentum.for_lag(m.optimizer, 7.0)
    spec = worker.TaskSpec(
        run="momentum-restated", epoch=0, model_bytes=model_to_bytes(m), fingerprint="f", optimizer=O.Downpour(),
        window=1, batch_size=8, mode="asynchronous", ps_url="in-process", token="t", read_timeout=5.0,
        local_momentum=momentum)
    from elephant.replicas import training_model

    replica = training_model(spec)
    assert float(replica.optimizer.beta_1) == pytest.approx(2 / 3) and int(replica.optimizer.iterations) == 3
    assert float(m.optimizer.beta_1) == pytest.approx(0.9)  # the user's model keeps its optimizer
    for before, after in zip(held, replica.optimizer._momentums, strict=True):
        assert np.abs(before).max() > 0
        np.testing.assert_allclose(np.array(after) / (1 - (2 / 3) ** 3), before / (1 - 0.9 ** 3), rtol=1e-5)
    # one more step: Adam's at beta_1 2/3 from the restated mean, by hand (Dense: the MSE's gradient in closed form)
    start = [np.array(w) for w in m.get_weights()]
    kernel, bias = start
    error = 2 * (x[:8] @ kernel + bias - y[:8]) / y[:8].size
    grads = [x[:8].T @ error, error.sum(axis=0)]
    replica.set_weights(start)
    replica.train_on_batch(x[:8], y[:8])
    b1, b2, t = 2 / 3, 0.999, 4
    for w, g, mean, v, after in zip(start, grads, held, m.optimizer._velocities, replica.get_weights(), strict=True):
        mean = b1 * mean * (1 - b1 ** 3) / (1 - 0.9 ** 3) + (1 - b1) * g
        v = b2 * np.array(v) + (1 - b2) * g * g
        expected = w - 1e-3 * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) * mean / (np.sqrt(v) + 1e-7)
        np.testing.assert_allclose(after, expected, rtol=1e-4, atol=1e-8)
        assert np.abs(after - w).max() > 1e-5


def test_the_simulator_trains_with_the_workers_beta_1_and_leaves_the_users_model_as_compiled(monkeypatch):
    applied = []
    apply = LocalMomentum.apply
    monkeypatch.setattr(LocalMomentum, "apply", lambda self, local: (applied.append((self, local)),
                                                                     apply(self, local)))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(256, 3)).astype("float32")
    y = x @ np.array([[2.0, -1.0], [0.5, 1.0], [-1.5, 0.3]], "float32")
    m = _adam_model()
    fit = O.simulate_fit(m, x, y, epochs=1, batch_size=16, num_workers=2, mode="asynchronous", frequency=4,
                         optimizer=O.DelayedNesterov(momentum_scaling=True), shuffle=False)
    expected = LocalMomentum.for_lag(ADAM(beta_1=0.9), asynchrony_lag(4, 2))
    assert fit.window == 4 and expected.decay == pytest.approx(8 / 9)  # 9 steps less 1: 8 steps old
    assert [momentum for momentum, _ in applied] == [expected]     # one shared engine
    assert all(float(local.beta_1) == pytest.approx(8 / 9) for _, local in applied)
    assert float(m.optimizer.beta_1) == pytest.approx(0.9)
