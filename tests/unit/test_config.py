"""elephant.config: each setting defined once, validated once, and the same default everywhere."""

from __future__ import annotations

import dataclasses

import pytest

from elephant import optimizers as O
from elephant.config import DEFAULT_OPTIMIZERS, FitArgs, Settings
from elephant.errors import ConfigError, DataError


def test_settings_resolve_the_optimizer_and_are_frozen():
    settings = Settings(mode="synchronous")
    assert isinstance(settings.optimizer, O.ModelAveraging)
    assert settings.window == settings.optimizer.window and settings.splits_batch is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.mode = "hogwild"


def test_settings_round_trip_through_their_config():
    settings = Settings(mode="asynchronous", frequency=7, optimizer={"name": "agn", "config": {"window": 9}},
                        num_workers=3, read_timeout=30, seed=None, batch_split=False, epoch_retries=0,
                        on_failure="keep", norm_guard=4.0)
    config = settings.to_config()
    assert set(config) == set(Settings.names())
    again = Settings.from_config({**config, "a_setting_of_a_later_version": 1})
    assert again.to_config() == config
    assert again.optimizer == settings.optimizer and again.read_timeout == 30.0


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "eventual"}, "`mode` must be 'synchronous', 'asynchronous' or 'hogwild'; received mode='eventual'"),
    ({"frequency": 0}, "`frequency` must be 'epoch', 'batch', a positive int or None; received frequency=0"),
    ({"mode": "synchronous", "optimizer": "downpour"}, "optimizer 'downpour' supports mode"),
    ({"num_workers": 2.0}, r"`num_workers` must be a positive int; received num_workers=2\.0"),
    ({"read_timeout": True}, "`read_timeout` must be a positive number of seconds; received read_timeout=True"),
    ({"seed": "0"}, "`seed` must be an int or None; received seed='0'"),
    ({"batch_split": 1}, "`batch_split` must be True, False or None; received batch_split=1"),
    ({"overlap": "yes"}, "`overlap` must be True or False; received overlap='yes'"),
    ({"epoch_retries": -1}, "`epoch_retries` must be an int >= 0; received epoch_retries=-1"),
    ({"on_failure": "ignore"}, "`on_failure` must be 'rollback' or 'keep'; received on_failure='ignore'"),
    ({"norm_guard": 1}, "`norm_guard` must be a number > 1 or None; received norm_guard=1"),
])
def test_each_setting_is_checked_with_its_name_and_the_value_received(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Settings(**kwargs)


def test_the_default_optimizer_of_each_mode_supports_it():
    for mode, name in DEFAULT_OPTIMIZERS.items():
        assert Settings(mode=mode).optimizer.name == name


def test_fit_args_fill_keras_defaults():
    args = FitArgs()
    assert args.batch_size == 32 and args.validation_batch_size == 32 and args.epochs == 1
    assert FitArgs(batch_size=10).validation_batch_size == 10
    assert FitArgs(validation_freq=[3, 1]).validation_freq == (1, 3)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"epochs": 0}, ConfigError, "`epochs` must be a positive int; received epochs=0"),
    ({"batch_size": -1}, ConfigError, "`batch_size` must be a positive int; received batch_size=-1"),
    ({"initial_epoch": -2}, ConfigError, "`initial_epoch` must be an int >= 0; received initial_epoch=-2"),
    ({"validation_split": 1.0}, ConfigError, r"`validation_split` must be a float in \[0, 1\)"),
    ({"validation_freq": [0]}, ConfigError, "`validation_freq` must be a positive int or a list"),
    ({"verbose": 3}, ConfigError, "`verbose` must be 'auto', 0, 1 or 2; received verbose=3"),
    ({"shuffle": "batch"}, ConfigError, "`shuffle` must be True or False; received shuffle='batch'"),
    ({"validation_data": "val.npz"}, DataError, "`validation_data` must be a tuple .*received str"),
    ({"callbacks": object()}, ConfigError, "`callbacks` must be a list of keras.callbacks.Callback"),
])
def test_fit_args_are_checked(kwargs, error, match):
    with pytest.raises(error, match=match):
        FitArgs(**kwargs)


def test_the_spark_ml_stages_default_to_sparkmodels_settings():
    from elephant.ml import KerasEstimator

    estimator = KerasEstimator()
    get = estimator.getOrDefault
    settings = Settings()
    assert get(estimator.mode) == settings.mode
    assert get(estimator.frequency) is settings.frequency is None  # the optimizer's own window
    assert get(estimator.epochs) == FitArgs().epochs and get(estimator.batchSize) == FitArgs().batch_size


def test_sparkmodel_takes_every_setting_and_fit_every_fit_argument_with_the_same_defaults():
    """A field added to Settings or FitArgs reaches the façade's signature, with one default."""
    import inspect

    from elephant import SparkModel

    for function, fields in ((SparkModel.__init__, Settings), (SparkModel.fit, FitArgs)):
        params = inspect.signature(function).parameters
        assert set(fields.names()) <= set(params), function.__qualname__
        assert {n: params[n].default for n in fields.names()} == fields.defaults(), function.__qualname__


def test_of_takes_the_named_entries_only():
    assert Settings.of({"mode": "hogwild", "model": object(), "self": None}).mode == "hogwild"
