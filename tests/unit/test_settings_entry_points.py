"""Every entry point takes SparkModel's settings from :class:`elephant.config.Settings`, field by field.

For each Settings field: :class:`elephant.SparkModel`, :func:`elephant.fit.simulated.simulate_fit`, the Spark ML
estimator (:class:`elephant.ml.KerasEstimator`) and the search's routing (:mod:`elephant.search.space`) take it under
its name (camelCase for Spark ML), with its default, and refuse a bad value with Settings' own message. A field that
deliberately does not apply to an entry point is listed below with the reason; a new field fails here until it has
a bad value in :data:`BAD` and reaches every entry point or is listed.
"""

import inspect
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402

from elephant import SparkModel  # noqa: E402
from elephant.config import Settings  # noqa: E402
from elephant.errors import ConfigError  # noqa: E402
from elephant.fit.simulated import simulate_fit  # noqa: E402
from elephant.ml import SETTING_PARAMS, KerasEstimator  # noqa: E402
from elephant.search import space as S  # noqa: E402

NAMES = Settings.names()
DEFAULTS = Settings.defaults()

#: A value of each field that Settings refuses (and that Spark ML's legacy "unset" values, 0 and "", are not).
BAD = {"mode": "sometimes", "frequency": "weekly", "optimizer": "nonsense", "num_workers": -1, "read_timeout": -1,
       "seed": "zero", "batch_split": "yes", "overlap": "yes", "epoch_retries": -1, "on_failure": "ignore",
       "norm_guard": 0.5, "comm_budget": 1.5, "ps_shards": -1, "ps_placement": "gpu"}

#: Settings fields simulate_fit does not take: it plays a fit in one process, with no Spark and no server process.
NOT_IN_SIMULATOR = {
    "read_timeout": "no parameter server to wait for",
    "epoch_retries": "no Spark job that can fail",
    "on_failure": "no Spark job that can fail",
    "norm_guard": "the simulated server has no norm guard",
    "ps_shards": "one in-process center; shards are elementwise and do not change the numbers",
    "ps_placement": "no driver or executors to place the server on",
}
#: Settings fields simulate_fit takes with another default, and why.
SIMULATOR_DEFAULTS = {"num_workers": (2, "None is Spark's parallelism, which a simulation has none of")}


def _settings_message(**kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        Settings(**kwargs)
    return str(info.value)


def _message(call) -> str:
    with pytest.raises(ConfigError) as info:
        call()
    return str(info.value)


@pytest.fixture(scope="module")
def model():
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    m.compile("sgd", "sparse_categorical_crossentropy")
    return m


class _NoSpark:
    @property
    def sparkContext(self):
        raise AssertionError("Spark was touched")


def test_every_field_has_a_bad_value_that_settings_refuses():
    assert set(BAD) == set(NAMES), "give each new Settings field a bad value in BAD"
    for name, value in BAD.items():
        _settings_message(**{name: value})
    assert set(NOT_IN_SIMULATOR) | set(SIMULATOR_DEFAULTS) <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_sparkmodel_takes_the_field(name, model):
    params = inspect.signature(SparkModel.__init__).parameters
    assert name in params and params[name].default == DEFAULTS[name]
    assert SparkModel(model, spark=_NoSpark(), **{name: DEFAULTS[name]}).settings == Settings()
    assert _message(lambda: SparkModel(model, **{name: BAD[name]})) == _settings_message(**{name: BAD[name]})


@pytest.mark.parametrize("name", NAMES)
def test_simulate_fit_takes_the_field(name):
    params = inspect.signature(simulate_fit).parameters
    if name in NOT_IN_SIMULATOR:
        assert name not in params, f"{name} is listed in NOT_IN_SIMULATOR but simulate_fit takes it"
        return
    assert name in params
    assert params[name].default == SIMULATOR_DEFAULTS.get(name, (DEFAULTS[name],))[0]
    # the settings are checked first, before the model or the data are looked at
    message = _message(lambda: simulate_fit(None, None, None, **{name: BAD[name]}))
    assert message == _settings_message(**{name: BAD[name]})


def test_simulate_fit_refuses_no_workers_by_name():
    assert _message(lambda: simulate_fit(None, None, None, num_workers=None)) == (
        "`num_workers` must be a positive int; received num_workers=None")


@pytest.mark.parametrize("name", NAMES)
def test_the_spark_ml_estimator_takes_the_field(name):
    camel = SETTING_PARAMS[name]
    estimator = KerasEstimator()
    assert estimator.hasParam(camel) and estimator.getOrDefault(camel) == DEFAULTS[name]
    assert inspect.signature(KerasEstimator.__init__).parameters[camel].default == DEFAULTS[name]
    assert KerasEstimator(**{camel: DEFAULTS[name]})._settings() == Settings()
    try:
        estimator = KerasEstimator(**{camel: BAD[name]})
    except (TypeError, ValueError) as exc:  # Spark's converter of the Param's type refuses it where it is set
        assert camel in str(exc)
        return
    held = estimator.getOrDefault(camel)  # as the Param's type converter left it (-1 as -1.0 for a float)
    expected = _settings_message(**{name: held})
    assert _message(estimator._settings).startswith(expected)
    if camel != name:
        assert _message(estimator._settings).endswith(f"(the Param {camel})")


def test_the_spark_ml_estimator_reads_its_legacy_unset_values_as_none():
    legacy = KerasEstimator(frequency="", optimizer="", numWorkers=0, psShards=0, psPlacement="")
    assert legacy._settings() == Settings()
    assert KerasEstimator(frequency="4")._settings().frequency == 4  # as a saved Param held it


def test_the_spark_ml_estimator_refuses_an_unknown_keyword():
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['numWorker'\]"):
        KerasEstimator(numWorker=2)


@pytest.mark.parametrize("name", NAMES)
def test_the_search_routes_the_field(name):
    routed = S.route({name: DEFAULTS[name]}, frozenset({name}))  # a build_fn that takes the name as well
    if name in S.NOT_ROUTED:
        assert routed.build == {name: DEFAULTS[name]} and not routed.settings
        return
    assert routed.settings == {name: DEFAULTS[name]} and not routed.build
    assert (name in S.ELEPHANT_KEYS) != (name in S.FIXED_SETTINGS)
    assert Settings(**S.elephant_settings({name: DEFAULTS[name]})) == Settings()
    assert _message(lambda: S.elephant_settings({name: BAD[name]})) == _settings_message(**{name: BAD[name]})


def test_the_search_leaves_unset_settings_to_sparkmodels_defaults():
    assert S.elephant_settings({}) == {"optimizer": Settings().optimizer}
