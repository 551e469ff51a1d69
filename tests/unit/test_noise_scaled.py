"""benchmarks/noise_scaled.py: the per-coordinate factor between 1 and sqrt(K), and the optimizer that applies it."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.helpers import benchmark

noise_scaled = benchmark("noise_scaled")


def _running_means(grads, beta):
    mean = square = np.zeros_like(grads[0])
    for g in grads:
        mean, square = beta * mean + (1 - beta) * g, beta * square + (1 - beta) * g**2
    return mean, square


def _factor(grads, workers, beta=0.99):
    from keras import ops

    mean, square = _running_means(grads, beta)
    return np.asarray(ops.convert_to_numpy(noise_scaled.noise_factor(ops, mean, square, len(grads), beta, workers)))


def test_a_noise_dominated_coordinate_gets_sqrt_k_a_signal_dominated_one_1_and_a_silent_one_1():
    rng = np.random.default_rng(0)
    steps = 4000
    noise = rng.normal(0.0, 1.0, (steps, 1))
    signal = np.full((steps, 1), 0.5) + rng.normal(0.0, 1e-3, (steps, 1))
    grads = np.concatenate([noise, signal, np.zeros((steps, 1))], axis=1)
    f = _factor(list(grads), workers=8)
    assert f[0] == pytest.approx(np.sqrt(8), rel=0.1)
    assert f[1] == pytest.approx(1.0, abs=1e-3)
    assert f[2] == 1.0


def test_signal_and_noise_of_equal_variance_get_the_ratio_of_the_workers_magnitude_to_plain_trainings():
    rng = np.random.default_rng(1)
    grads = list(1.0 + rng.normal(0.0, 1.0, (20_000, 64)))  # s^2 = w = 1: f^2 = 2 / (1 + 1/4) at 4 workers
    assert np.median(_factor(grads, workers=4)) == pytest.approx(np.sqrt(2 / 1.25), rel=0.05)


def test_at_one_worker_the_optimizer_takes_its_base_class_steps():
    import keras

    cls = noise_scaled.noise_scaled(keras.optimizers.RMSprop)
    plain, scaled = keras.optimizers.RMSprop(0.01), cls(0.01, workers=1)
    a, b = keras.Variable(np.ones(3, "float32")), keras.Variable(np.ones(3, "float32"))
    rng = np.random.default_rng(2)
    for _ in range(5):
        g = rng.normal(size=3).astype("float32")
        plain.apply([keras.ops.convert_to_tensor(g)], [a])
        scaled.apply([keras.ops.convert_to_tensor(g)], [b])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(b), keras.ops.convert_to_numpy(a), rtol=1e-6)
    assert scaled.get_config()["workers"] == 1 and type(scaled).from_config(scaled.get_config()).beta == 0.99


def test_a_pure_noise_gradient_steps_sqrt_k_times_as_far_as_the_base_optimizer():
    import keras

    cls = noise_scaled.noise_scaled(keras.optimizers.SGD)
    plain, scaled = keras.optimizers.SGD(0.01), cls(0.01, workers=16, beta=0.9)
    a, b = keras.Variable(np.zeros(256, "float32")), keras.Variable(np.zeros(256, "float32"))
    rng = np.random.default_rng(3)
    for _ in range(300):
        g = keras.ops.convert_to_tensor(rng.normal(size=256).astype("float32"))
        before_a, before_b = keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b)
        plain.apply([g], [a])
        scaled.apply([g], [b])
    ratio = np.abs(keras.ops.convert_to_numpy(b) - before_b) / np.abs(keras.ops.convert_to_numpy(a) - before_a)
    assert np.median(ratio) == pytest.approx(4.0, rel=0.1)


def test_the_longer_decay_averages_k_times_the_steps_of_rmsprops_or_adams_second_moment():
    assert noise_scaled.longer_decay({"rho": 0.9, "momentum": 0.0}, 8) == pytest.approx({"rho": 0.9875, "momentum": 0.0})
    adam = noise_scaled.longer_decay({"beta_1": 0.9, "beta_2": 0.999}, 4)
    assert adam == pytest.approx({"beta_1": 0.9, "beta_2": 0.99975})
    assert noise_scaled.longer_decay({"rho": 0.9}, 1) == {"rho": 0.9}


def test_the_debiased_rmsprops_first_step_is_the_rates_size_where_rmsprops_is_one_over_sqrt_1_minus_rho_times_it():
    import keras

    g = keras.ops.convert_to_tensor(np.array([2.0, -0.5], "float32"))
    steps = {}
    for name, cls in (("plain", keras.optimizers.RMSprop), ("debiased", noise_scaled.debiased_rmsprop())):
        variable = keras.Variable(np.zeros(2, "float32"))
        cls(0.01, rho=0.9875).apply([g], [variable])
        steps[name] = keras.ops.convert_to_numpy(variable)
    np.testing.assert_allclose(steps["debiased"], [-0.01, 0.01], rtol=1e-4)
    np.testing.assert_allclose(steps["plain"], [-0.01 / np.sqrt(0.0125), 0.01 / np.sqrt(0.0125)], rtol=1e-4)


def test_debias_refuses_a_workload_not_compiled_with_plain_rmsprop():
    import keras

    class Workload:
        name, metric = "adam-workload", "accuracy"

        @staticmethod
        def build(seed):
            model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            model.compile(keras.optimizers.Adam(1e-3), "mse")
            return model

    wl = Workload()
    noise_scaled.rebuild(wl, 8, 0.99, factor=False, decay=True, debias=True)
    with pytest.raises(ValueError, match=r"--debias needs .* RMSprop.*adam-workload has Adam"):
        wl.build(0)
