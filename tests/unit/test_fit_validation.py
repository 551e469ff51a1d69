"""The driver's validation pass reuses one epoch iterator per fit and gives ``model.evaluate``'s logs exactly."""

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402

from elephant.fit.validation import Validation, epoch_iterator_class, warms_up  # noqa: E402


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy",
                  metrics=["accuracy"], weighted_metrics=["accuracy"])
    return model


def _data(n=70, weights=False):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(n, 4)).astype("float32"), rng.integers(0, 3, n)
    return (x, y, rng.uniform(0.5, 2.0, n).astype("float32")) if weights else (x, y)


@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize("batch_size", [None, 16])
def test_each_epoch_s_logs_are_model_evaluate_s_exactly(weights, batch_size):
    model, data = _model(), _data(weights=weights)
    validate = Validation(model, data, batch_size, keras.backend.backend())
    for epoch in range(3):  # the weights change between epochs, as the center does
        model.set_weights([w + 0.1 * epoch for w in model.get_weights()])
        expected = model.evaluate(data[0], data[1], sample_weight=data[2] if weights else None,
                                  batch_size=batch_size, verbose=0, return_dict=True)
        assert validate() == {k: float(v) for k, v in expected.items()}


def test_the_iterator_is_built_once_and_the_model_keeps_none():
    model = _model()
    validate = Validation(model, _data(), None, keras.backend.backend())
    validate()
    first = validate._iterator
    validate()
    assert first is not None and validate._iterator is first
    assert getattr(model, "_eval_epoch_iterator", None) is None  # restored after each call


def test_an_unknown_backend_falls_back_to_plain_evaluate():
    assert epoch_iterator_class("no-such-backend") is None
    model, data = _model(), _data()
    validate = Validation(model, data, None, "no-such-backend")
    expected = model.evaluate(data[0], data[1], verbose=0, return_dict=True)
    assert validate() == {k: float(v) for k, v in expected.items()}
    assert validate._iterator is None


def test_the_running_backend_has_an_iterator_class():
    found = epoch_iterator_class(keras.backend.backend())
    assert found is not None and found[0].__name__.endswith("EpochIterator")


@pytest.mark.skipif(keras.backend.backend() not in ("tensorflow", "torch"), reason="no warm-up under this backend")
def test_the_warm_up_builds_the_iterator_and_leaves_the_logs_as_they_were():
    model, data = _model(), _data()
    expected = model.evaluate(data[0], data[1], verbose=0, return_dict=True)
    validate = Validation(model, data, None, keras.backend.backend())
    validate.warm_up()
    validate.close()
    assert validate._iterator is not None
    assert validate() == {k: float(v) for k, v in expected.items()}


@pytest.mark.parametrize("backend", ["jax", "numpy"])
def test_no_warm_up_where_evaluate_writes_the_weights_back(backend):
    assert not warms_up(_model(), backend)


def test_no_warm_up_for_a_test_step_of_the_user():
    class Counting(keras.Sequential):
        def test_step(self, data):
            return super().test_step(data)

    model = Counting([keras.Input((4,)), keras.layers.Dense(3)])
    assert not warms_up(model, "tensorflow")
    assert warms_up(_model(), "tensorflow") and warms_up(_model(), "torch")


@pytest.mark.parametrize("weights", [False, True])
def test_passes_on_a_kept_copy_give_the_models_own_logs_and_warm_up_under_any_backend(weights):
    """The passes run on a copy kept for the model's structure (elephant.fit.copies), which takes the model's weights
    first: the logs are model.evaluate's of the model, epoch after epoch, and the copy may warm up under JAX too."""
    from elephant.fit import copies
    from elephant.fit.loop import replica_structure

    model, data = _model(), _data(weights=weights)
    copy = copies.take(model, replica_structure(model, None))
    validate = Validation(model, data, None, keras.backend.backend())
    validate.evaluate_on(copy)
    assert validate._warms and warms_up(model, "jax", on_copy=True)
    validate.warm_up()
    for epoch in range(3):
        validate.close()  # as the fit does before it sets the epoch's center
        model.set_weights([w + 0.1 * epoch for w in model.get_weights()])
        expected = model.evaluate(data[0], data[1], sample_weight=data[2] if weights else None, verbose=0,
                                  return_dict=True)
        assert validate() == {k: float(v) for k, v in expected.items()}
