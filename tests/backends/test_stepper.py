"""elephant.backends: one pass of the stepper is ``model.fit`` for one unshuffled epoch, on the running backend."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from elephant import backends

from .models import build

BACKEND = keras.backend.backend()
TOL = dict(rtol=1e-5, atol=1e-5)
BATCH = 40  # whole batches of both data sets: one trace per jitted step on JAX
PARTIAL = 32  # a last batch of 24 of the 120 samples (a second trace on JAX)


def _data(kind, classes, sequences):
    return sequences if kind in ("conv1d", "gru") else classes


def _one_pass(model, x, y, batch_size=BATCH, w=None):
    """One unshuffled pass of ``model``'s stepper; the last step's logs as floats."""
    s = backends.stepper(model)
    s.begin_pass()
    logs = {}
    for start in range(0, len(x), batch_size):
        part = slice(start, start + batch_size)
        logs = s.step((x[part], y[part], None if w is None else w[part]))
    return {k: float(v) for k, v in logs.items()}


def _assert_same_state(mine, reference):
    for a, b in zip(mine.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, **TOL)
    mine_opt = [np.array(v) for v in mine.optimizer.variables]
    ref_opt = [np.array(v) for v in reference.optimizer.variables]
    assert len(mine_opt) == len(ref_opt) > 2  # iterations, learning rate and the slots
    for a, b in zip(mine_opt, ref_opt, strict=True):
        np.testing.assert_allclose(a, b, **TOL)


def test_the_stepper_fits_the_running_backend():
    kinds = {"tensorflow": "TensorFlowStepper", "jax": "JaxStepper", "torch": "TorchStepper"}
    model = build("dense")
    s = backends.stepper(model)
    assert backends.stepper(model) is s  # one per model
    assert type(s).__name__ == kinds[BACKEND]


@pytest.mark.parametrize("kind, opt", [("dense", "adam"), ("dense", "momentum"), ("conv1d", "adam"),
                                       ("conv1d", "momentum"), ("gru", "adam"), ("batchnorm", "momentum"),
                                       ("dropout", "adam")])
def test_a_pass_equals_keras_fit(kind, opt, classes, sequences):
    """Weights (BatchNormalization's moving statistics included), optimizer variables and the
    pass's loss and accuracy, with Dropout drawing the same masks from the same seed state."""
    x, y = _data(kind, classes, sequences)
    reference = build(kind, opt)
    history = reference.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0).history
    model = build(kind, opt)
    logs = _one_pass(model, x, y)
    backends.stepper(model).sync_to_model()
    _assert_same_state(model, reference)
    assert set(logs) == set(history) == {"loss", "accuracy"}
    for key in logs:
        assert logs[key] == pytest.approx(history[key][0], rel=1e-5), key
    assert int(np.array(model.optimizer.iterations)) == -(-len(x) // BATCH)


def test_a_weighted_pass_equals_keras_fit(classes):
    x, y = classes
    w = np.random.default_rng(2).uniform(0.0, 3.0, len(x)).astype("float32")
    reference = build("dense", "momentum")
    history = reference.fit(x, y, sample_weight=w, batch_size=BATCH, epochs=1, shuffle=False, verbose=0).history
    plain = build("dense", "momentum")
    plain.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    model = build("dense", "momentum")
    logs = _one_pass(model, x, y, w=w)
    backends.stepper(model).sync_to_model()
    _assert_same_state(model, reference)
    assert logs["loss"] == pytest.approx(history["loss"][0], rel=1e-5)
    assert not np.allclose(model.get_weights()[0], plain.get_weights()[0], atol=1e-4)  # the weights mattered


@pytest.mark.parametrize("sync_between", [False, True])
def test_new_weights_between_passes_continue_the_optimizer(classes, sync_between):
    """Pass, new weights, pass: as fit, set_weights, fit (on JAX the first pass's state was donated);
    with a partial last batch."""
    x, y = classes
    new = [np.full_like(w, 0.1 * (i + 1)) for i, w in enumerate(build("dense").get_weights())]
    reference = build("dense")
    reference.fit(x, y, batch_size=PARTIAL, epochs=1, shuffle=False, verbose=0)
    reference.set_weights(new)
    history = reference.fit(x, y, batch_size=PARTIAL, epochs=1, shuffle=False, verbose=0).history
    model = build("dense")
    s = backends.stepper(model)
    _one_pass(model, x, y, PARTIAL)
    if sync_between:
        s.sync_to_model()
    s.set_weights(new)
    for got, want in zip(s.get_weights(), new, strict=True):
        np.testing.assert_array_equal(got, want)
    logs = _one_pass(model, x, y, PARTIAL)
    s.sync_to_model()
    _assert_same_state(model, reference)
    assert logs["loss"] == pytest.approx(history["loss"][0], rel=1e-5)


def test_optimizer_variables_assigned_after_a_sync_are_the_next_passs(classes):
    """As replicas.training_model does when another fit takes the replica: the assigned state is used."""
    x, y = classes
    model = build("dense")
    model.optimizer.build(model.trainable_variables)
    initial = [np.array(v) for v in model.optimizer.variables]
    start = model.get_weights()
    _one_pass(model, x, y)
    backends.stepper(model).sync_to_model()
    assert int(np.array(model.optimizer.iterations)) == -(-len(x) // BATCH)
    for variable, value in zip(model.optimizer.variables, initial, strict=True):
        variable.assign(value)
    backends.stepper(model).set_weights(start)
    _one_pass(model, x, y)
    backends.stepper(model).sync_to_model()
    reference = build("dense")
    reference.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    _assert_same_state(model, reference)


@pytest.mark.parametrize("when", ["before a step", "mid-pass", "after a sync"])
def test_weights_survive_a_flat_round_trip(classes, when):
    class Counter(keras.layers.Layer):
        """A float weight and an integer non-trainable one."""

        def build(self, shape):
            self.scale = self.add_weight(shape=(shape[-1],), initializer="ones")
            self.count = self.add_weight(shape=(), dtype="int32", initializer="zeros", trainable=False)

        def call(self, x):
            return x * self.scale

    x, y = classes
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5), keras.layers.BatchNormalization(),
                              Counter(), keras.layers.Dense(3, activation="softmax")])
    model.compile(keras.optimizers.Adam(), "sparse_categorical_crossentropy")
    s = backends.stepper(model)
    if when != "before a step":
        s.begin_pass()
        s.step((x[:BATCH], y[:BATCH], None))
    if when == "after a sync":
        s.sync_to_model()
    before = s.get_weights()
    want_dtypes = [np.dtype(keras.backend.standardize_dtype(v.dtype)) for v in model.weights]
    assert [a.dtype for a in before] == want_dtypes and "int32" in [d.name for d in want_dtypes]
    assert [a.shape for a in before] == [tuple(v.shape) for v in model.weights]
    rng = np.random.default_rng(1)
    new = [rng.normal(size=a.shape).astype(a.dtype) if a.dtype.kind == "f" else np.full(a.shape, 7, a.dtype)
           for a in before]
    s.set_weights(new)
    got = s.get_weights()
    for a, b in zip(got, new, strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    got[0][...] = 123.0  # the caller owns what it read
    assert not np.any(s.get_weights()[0] == 123.0)
    s.sync_to_model()
    for a, b in zip(model.get_weights(), new, strict=True):
        np.testing.assert_array_equal(a, b)


def test_set_weights_refuses_the_wrong_count():
    model = build("dense")
    with pytest.raises(ValueError, match=r"`weights` must hold 4 arrays .*received 3"):
        backends.stepper(model).set_weights(model.get_weights()[:3])


def test_metrics_restart_at_each_pass(classes):
    x, y = classes
    model = build("dense", "momentum")
    _one_pass(model, x[:80], y[:80])
    second = _one_pass(model, x[80:], y[80:])
    backends.stepper(model).sync_to_model()
    reference = build("dense", "momentum")
    reference.fit(x[:80], y[:80], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    history = reference.fit(x[80:], y[80:], batch_size=BATCH, epochs=1, shuffle=False, verbose=0).history
    assert second["loss"] == pytest.approx(history["loss"][0], rel=1e-5)
    assert second["accuracy"] == pytest.approx(history["accuracy"][0], rel=1e-5)
    # sync_to_model hands the pass's metric state to the model, as fit leaves it
    assert float(model.metrics[0].result()) == pytest.approx(history["loss"][0], rel=1e-5)


def test_other_objects_get_the_slow_get_set_weights_stepper():
    class ArrayModel:
        def __init__(self):
            self.arrays = [np.zeros(2)]

        def get_weights(self):
            return [a.copy() for a in self.arrays]

        def set_weights(self, weights):
            self.arrays = [np.array(a) for a in weights]

    model = ArrayModel()
    s = backends.stepper(model)
    assert type(s) is backends.Stepper
    s.set_weights([np.ones(2)])
    np.testing.assert_array_equal(s.get_weights()[0], [1.0, 1.0])
    s.sync_to_model()  # nothing to do


def test_a_rate_set_between_steps_trains_the_next_step(classes):
    """A first epoch's warm-up sets the rate before each step (elephant.worker.pass_rates): the pass equals
    Keras stepping batch by batch at those rates, on every backend (JAX's live state included)."""
    x, y = classes
    rates = [1e-3, 4e-3, 2e-2]
    reference = build("dense", "adam")
    for i, rate in enumerate(rates):
        reference.optimizer.learning_rate = rate
        reference.train_on_batch(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
    model = build("dense", "adam")
    s = backends.stepper(model)
    s.begin_pass()
    for i, rate in enumerate(rates):
        s.set_learning_rate(rate)
        s.step((x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH], None))
    s.sync_to_model()
    _assert_same_state(model, reference)
    assert float(np.array(model.optimizer.learning_rate)) == pytest.approx(rates[-1])


def test_the_workers_rmsprop_magnitude_rises_inside_the_compiled_step(classes):
    """LocalMoment's rise (a hook on the optimizer's collective step) acts inside the stepper's traced step on
    every backend: from zero, one step leaves the magnitude where the compiled rho would (every square exceeds
    ten times nothing), where the longer rho alone would leave an eighth of it."""
    from elephant.optimizers.local import LocalMoment

    x, y = classes
    moment = LocalMoment.for_workers(keras.optimizers.RMSprop(), 8)

    def magnitudes(how):
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        m.compile(keras.optimizers.RMSprop(1e-3), "sparse_categorical_crossentropy")
        m.optimizer.build(m.trainable_variables)
        if how == "rise":
            moment.apply(m.optimizer)
        elif how == "longer":
            m.optimizer.rho = moment.decay
        s = backends.stepper(m)
        s.begin_pass()
        s.step((x, y, None))
        s.sync_to_model()  # JAX's stepper holds the state until then
        return [keras.ops.convert_to_numpy(v) for v in m.optimizer._velocities]

    compiled, rising, longer = magnitudes("compiled"), magnitudes("rise"), magnitudes("longer")
    for a, b, c in zip(compiled, rising, longer, strict=True):
        assert np.abs(a).max() > 0
        np.testing.assert_allclose(b, a, rtol=1e-5)
        np.testing.assert_allclose(c, a * (1 - moment.decay) / 0.1, rtol=1e-4)
