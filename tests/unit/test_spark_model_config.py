"""Every configuration and input error is raised before Spark starts (TF, no Spark)."""

import os
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402

from elephant import SparkModel  # noqa: E402
from elephant.errors import ConfigError, DataError  # noqa: E402
from elephant.fit.progress import aggregate_logs, staleness_mean as _staleness_mean  # noqa: E402
from elephant.session import check_barrier_slots  # noqa: E402
from elephant.config import resolve_window  # noqa: E402
from elephant import optimizers as O  # noqa: E402


def _model(compiled=True):
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    if compiled:
        m.compile("sgd", "sparse_categorical_crossentropy")
    return m


@pytest.fixture(scope="module")
def model():
    return _model()


class _NoSpark:
    """Fails the test if anything asks for a SparkSession."""

    @property
    def sparkContext(self):
        raise AssertionError("Spark was touched before the input was validated")


def test_uncompiled_model_is_refused():
    with pytest.raises(ConfigError, match="`model` must be compiled"):
        SparkModel(_model(compiled=False))


def test_non_keras_model_is_refused():
    with pytest.raises(ConfigError, match="`model` must be a keras.Model; received dict"):
        SparkModel({})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "sometimes"}, r"`mode` must be 'synchronous', 'asynchronous' or 'hogwild'; received mode='sometimes'"),
        ({"frequency": "weekly"}, r"`frequency` must be 'epoch', 'batch', a positive int or None; received frequency='weekly'"),
        ({"frequency": 0}, r"received frequency=0"),
        ({"frequency": True}, r"received frequency=True"),
        ({"optimizer": "adamw"}, r"Could not interpret optimizer identifier: 'adamw'"),
        ({"optimizer": 3}, r"Could not interpret optimizer identifier: 3"),
        ({"mode": "synchronous", "optimizer": "downpour"}, r"optimizer 'downpour' supports mode\(s\) \['asynchronous', 'hogwild'\]; received mode='synchronous'"),
        ({"mode": "asynchronous", "optimizer": "modelaveraging"}, r"received mode='asynchronous'"),
        ({"num_workers": 0}, r"`num_workers` must be a positive int; received num_workers=0"),
        ({"read_timeout": -1}, r"`read_timeout` must be a positive number of seconds; received read_timeout=-1"),
    ],
)
def test_constructor_errors(model, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        SparkModel(model, **kwargs)


def test_default_optimizer_depends_on_mode(model):
    assert SparkModel(model, mode="synchronous", spark=_NoSpark()).optimizer.name == "modelaveraging"
    assert SparkModel(model, mode="asynchronous", spark=_NoSpark()).optimizer.name == "delayednesterov"
    assert SparkModel(model, mode="hogwild", spark=_NoSpark()).optimizer.name == "downpour"


@pytest.mark.parametrize(
    "x, y, kwargs, error, match",
    [
        (np.zeros((0, 4)), np.zeros(0), {}, DataError, r"`x` is empty"),
        (np.zeros((5, 4)), np.zeros(4), {}, DataError, "x has 5 samples, y has 4"),
        (np.zeros((5, 7)), np.zeros(5), {}, DataError, r"`x` has feature shape \(7,\) but the model expects \(4,\)"),
        (np.zeros((5, 4)), None, {}, DataError, "`y` is required"),
        (np.zeros((5, 4)), np.zeros(5), {"epochs": 0}, ConfigError, "`epochs` must be a positive int; received epochs=0"),
        (np.zeros((5, 4)), np.zeros(5), {"batch_size": "32"}, ConfigError, "received batch_size='32'"),
        (np.zeros((5, 4)), np.zeros(5), {"validation_split": 1.5}, ConfigError, r"`validation_split` must be a float in \[0, 1\); received validation_split=1.5"),
        (np.zeros((5, 4)), np.zeros(5), {"verbose": "loud"}, ConfigError, "received verbose='loud'"),
        (np.zeros((5, 4)), np.zeros(5), {"validation_data": np.zeros(3)}, DataError, "`validation_data` must be a tuple"),
        (np.zeros((5, 4)), np.zeros(5), {"validation_data": (np.zeros((2, 5)), np.zeros(2))}, DataError, r"`validation_data\[0\]` has feature shape \(5,\)"),
        (np.zeros((5, 4)), np.zeros(5), {"validation_data": (np.zeros((2, 4)), np.zeros(3))}, DataError, r"`validation_data\[1\]` has 3 samples but `validation_data\[0\]` has 2"),
        (np.zeros((5, 4)), np.zeros(5), {"validation_data": (np.zeros((2, 4)), np.zeros(2), np.ones(4))}, DataError, r"`validation_data\[2\]` has 4 samples"),
        (np.zeros((5, 4)), np.zeros(5), {"validation_data": (np.zeros((0, 4)), np.zeros(0))}, DataError, r"`validation_data\[0\]` is empty"),
        (np.zeros((5, 4)), np.zeros(5), {"validation_data": (np.zeros((2, 4)), np.zeros(2)), "validation_split": 0.2}, ConfigError, r"pass either `validation_data` or `validation_split`, not both; received validation_split=0.2"),
        (np.zeros((5, 4)), np.zeros(5), {"sample_weight": np.ones(4)}, DataError, r"`sample_weight` must hold one weight per sample \(5\); received 4 weights"),
        (np.zeros((5, 4)), np.zeros(5), {"sample_weight": 2.0}, DataError, r"`sample_weight` must hold one weight per sample \(5\); received a scalar"),
        (np.zeros((5, 4)), np.zeros(5), {"sample_weight": [1, 1, np.nan, 1, 1]}, DataError, r"`sample_weight` holds 1 NaN or infinite weights"),
        (np.zeros((5, 4)), np.zeros(5), {"sample_weight": ["a"] * 5}, DataError, r"`sample_weight` must be numbers"),
        (np.zeros((5, 4)), np.zeros(5), {"class_weight": [1.0, 2.0]}, DataError, r"`class_weight` must be a dict from class index to weight.*received list"),
        (np.zeros((5, 4)), np.zeros(5), {"class_weight": {"cat": 1.0}}, DataError, r"`class_weight` keys must be class indices \(ints\); received key 'cat'"),
        (np.zeros((5, 4)), np.zeros(5), {"class_weight": {0: float("inf")}}, DataError, r"`class_weight` values must be finite numbers; received 0: inf"),
        (np.zeros((5, 4)), np.zeros(5), {"class_weight": {0: 2.0}, "sample_weight": np.ones(5)}, ConfigError, r"pass either `class_weight` or `sample_weight`, not both"),
        (np.zeros((5, 4)), [np.zeros(5), np.zeros(5)], {"class_weight": {0: 2.0}}, DataError, r"`class_weight` works with single-output models only"),
        (np.zeros((5, 4)), np.zeros(5), {"weight_col": "w"}, DataError, r"`weight_col` names a DataFrame column, but `x` is numpy.*received weight_col='w'"),
        (np.zeros((5, 4)), np.zeros(5), {"steps_per_epoch": 3}, ConfigError, r"`steps_per_epoch` is not supported .*one pass over each worker's partition"),
        (np.zeros((5, 4)), np.zeros(5), {"validation_steps": 3}, ConfigError, r"`validation_steps` is not supported"),
        (np.zeros((5, 4)), np.zeros(5), {"initial_epoch": -1}, ConfigError, r"`initial_epoch` must be an int >= 0; received initial_epoch=-1"),
        (np.zeros((5, 4)), np.zeros(5), {"validation_freq": 0}, ConfigError, r"`validation_freq` must be a positive int or a list .*received validation_freq=0"),
        (np.zeros((5, 4)), np.zeros(5), {"validation_freq": [1, "2"]}, ConfigError, r"received validation_freq=\[1, '2'\]"),
        (np.zeros((5, 4)), np.zeros(5), {"validation_batch_size": 0}, ConfigError, r"received validation_batch_size=0"),
        (np.zeros((5, 4)), np.zeros(5), {"shuffle": "yes"}, ConfigError, r"received shuffle='yes'"),
        (iter([np.zeros(4)]), None, {}, DataError, r"received builtins.list_iterator \(a dataset, generator or keras.utils.PyDataset"),
        (3.5, None, {}, DataError, r"`x` must be numpy arrays .*received builtins.float\. Convert"),
    ],
)
def test_fit_errors_before_spark(model, x, y, kwargs, error, match):
    sm = SparkModel(model, spark=_NoSpark())
    with pytest.raises(error, match=match):
        sm.fit(x, y, **kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"epoch_retries": -1}, r"`epoch_retries` must be an int >= 0; received epoch_retries=-1"),
    ({"epoch_retries": True}, r"received epoch_retries=True"),
    ({"on_failure": "retry"}, r"`on_failure` must be 'rollback' or 'keep'; received on_failure='retry'"),
    ({"norm_guard": 0.5}, r"`norm_guard` must be a number > 1 or None; received norm_guard=0.5"),
    ({"norm_guard": "big"}, r"received norm_guard='big'"),
])
def test_failure_settings_are_checked(model, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        SparkModel(model, spark=_NoSpark(), **kwargs)


def test_spark_model_refuses_to_pickle(model):
    import pickle

    with pytest.raises(TypeError, match="SparkModel lives on the driver"):
        pickle.dumps(SparkModel(model, spark=_NoSpark()))


@pytest.mark.parametrize(
    "frequency, expected", [("epoch", None), ("batch", 1), (7, 7), (None, O.Downpour().window)]
)
def test_resolve_window(frequency, expected):
    assert resolve_window(frequency, O.Downpour()) == expected


def test_aggregate_logs_weighs_weighted_metrics_by_their_weights():
    # Keras' loss and plain metrics are means over samples; weighted_metrics are means over the weights
    results = [
        {"samples": 30, "weight_sum": 3.0, "weighted_keys": ["weighted_accuracy"],
         "logs": {"loss": 1.0, "accuracy": 0.5, "weighted_accuracy": 0.2}},
        {"samples": 10, "weight_sum": 9.0, "weighted_keys": ["weighted_accuracy"],
         "logs": {"loss": 3.0, "accuracy": 1.0, "weighted_accuracy": 0.6}},
    ]
    logs = aggregate_logs(results)
    assert logs == {"loss": pytest.approx(1.5), "accuracy": pytest.approx(0.625),
                    "weighted_accuracy": pytest.approx((3 * 0.2 + 9 * 0.6) / 12)}


def test_aggregate_logs_is_sample_weighted_and_skips_empty_partitions():
    results = [
        {"samples": 30, "logs": {"loss": 1.0, "accuracy": 0.5}},
        {"samples": 10, "logs": {"loss": 3.0, "accuracy": 1.0}},
        {"samples": 0},
    ]
    logs = aggregate_logs(results)
    assert logs == {"loss": pytest.approx(1.5), "accuracy": pytest.approx(0.625)}


def test_staleness_mean_is_per_epoch():
    before = {"staleness": {"0": 2, "1": 2}}
    after = {"staleness": {"0": 3, "1": 2, "4": 1}}
    assert _staleness_mean(before, after) == pytest.approx(2.0)
    assert _staleness_mean(after, after) is None


@pytest.mark.parametrize("workers, slots, ok", [(2, 2, True), (1, 4, True), (3, 2, False)])
def test_barrier_slots(workers, slots, ok):
    if ok:
        check_barrier_slots(workers, slots)
    else:
        with pytest.raises(ConfigError, match=f"num_workers={workers} exceeds the {slots} task slots"):
            check_barrier_slots(workers, slots)


@pytest.mark.parametrize("bound, ok", [(None, True), (0, False), (3, False)])
def test_a_staleness_bound_needs_every_worker_running_at_once(bound, ok):
    check_barrier_slots(2, 2, bound, "asynchronous")  # enough slots: always fine
    if ok:
        check_barrier_slots(5, 2, bound, "asynchronous")
    else:
        with pytest.raises(ConfigError, match=rf"staleness_bound={bound} makes every worker wait for the slowest "
                                              r"one, so all num_workers=5 must run at once, but this Spark cluster "
                                              r"has 2 task slots"):
            check_barrier_slots(5, 2, bound, "asynchronous")


@pytest.mark.parametrize("mode", ["asynchronous", "synchronous", "hogwild"])
def test_a_server_in_the_tasks_needs_every_worker_running_at_once(mode):
    check_barrier_slots(2, 2, None, mode, hosted=True)  # enough slots: always fine
    with pytest.raises(ConfigError, match=r"ps_placement='executors' runs all workers at once .*num_workers=3 "
                                          r"exceeds the 2 task slots.*use ps_placement='driver'"):
        check_barrier_slots(3, 2, None, mode, hosted=True)


def test_importing_elephant_does_not_import_spark_or_tf():
    import subprocess

    code = "import elephant, elephant.optimizers, sys; print(sorted(m for m in ('pyspark','tensorflow','keras','flask') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_public_api():
    import elephant

    assert sorted(elephant.__all__) == sorted([
        "SparkModel", "load", "optimizers", "search", "ensemble",
        "ElephantError", "ConfigError", "DataError", "PSError", "ProtocolError", "FitError", "__version__",
    ])  # a public name added or dropped is a decision: update this list with it
    for name in elephant.__all__:
        assert getattr(elephant, name) is not None


def _compiled(optimizer):
    m = _model(compiled=False)
    m.compile(optimizer, "sparse_categorical_crossentropy")
    return m


@pytest.mark.parametrize(
    "local, rule, warns",
    [
        (lambda: keras.optimizers.SGD(0.05), lambda: O.DCASGD(learning_rate=0.05), False),
        (lambda: keras.optimizers.SGD(0.1), lambda: O.DCASGD(learning_rate=0.05), True),
        (lambda: keras.optimizers.Adam(0.05), lambda: O.DCASGD(learning_rate=0.05), True),
        (lambda: O.EAMSGD(momentum=0.8).local_optimizer(0.05), lambda: O.EAMSGD(momentum=0.8), False),
        (lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True), lambda: O.EAMSGD(momentum=0.8), True),
        (lambda: keras.optimizers.Adam(), lambda: O.EAMSGD(), True),
        (lambda: keras.optimizers.Adam(), lambda: O.DynSGD(), False),
    ],
)
def test_a_local_optimizer_that_breaks_the_rule_is_warned_about(caplog, local, rule, warns):
    import logging

    with caplog.at_level(logging.WARNING, logger="elephant.spark_model"):
        SparkModel(_compiled(local()), mode="asynchronous", optimizer=rule(), spark=_NoSpark())
    messages = [r.getMessage() for r in caplog.records if r.name == "elephant.spark_model"]
    assert bool(messages) == warns, messages
    if warns:
        assert "the model is compiled with" in messages[0]


def test_a_tf_dataset_is_refused_naming_its_type(model):
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices((np.zeros((5, 4), "float32"), np.zeros(5)))
    with pytest.raises(DataError, match=r"received tensorflow\..*Dataset.* cannot be split across Spark executors"):
        SparkModel(model, spark=_NoSpark()).fit(dataset, epochs=1)


def test_fit_evaluate_and_predict_take_keras_arguments_in_its_order_and_defaults():
    """When Keras adds an argument to fit, evaluate or predict, this fails until SparkModel.fit supports or refuses it."""
    import inspect

    import keras

    from elephant.config import UNSUPPORTED_ARGUMENTS

    for method in ("fit", "evaluate", "predict"):
        theirs = inspect.signature(getattr(keras.Model, method)).parameters
        ours = inspect.signature(getattr(SparkModel, method)).parameters
        names = [n for n, p in theirs.items() if n != "self" and p.kind != p.VAR_KEYWORD]
        assert [n for n in ours if n in names] == names, method  # positional calls mean the same
        for name in names:
            if name != "x":  # x is required here
                assert ours[name].default == theirs[name].default, (method, name)
        assert set(UNSUPPORTED_ARGUMENTS[method]) < set(names), method


@pytest.mark.parametrize("freq, validated", [(1, [1, 2, 3, 4]), (2, [2, 4]), ((1, 3), [1, 3]), (5, [])])
def test_validation_happens_after_the_epochs_keras_would_pick(freq, validated):
    from elephant.fit.progress import validates_after

    assert [e + 1 for e in range(4) if validates_after(e, freq)] == validated


@pytest.mark.parametrize("method, kwargs, match", [
    ("evaluate", {"steps": 2}, r"`steps` is not supported by SparkModel.evaluate: every sample is evaluated"),
    ("evaluate", {"verbose": "loud"}, r"received verbose='loud'"),
    ("evaluate", {"callbacks": "cb"}, r"`callbacks` must be a list .*received str"),
    ("predict", {"steps": 2}, r"`steps` is not supported by SparkModel.predict"),
])
def test_evaluate_and_predict_refuse_before_spark(model, method, kwargs, match):
    sm = SparkModel(model, spark=_NoSpark())
    args = (np.zeros((5, 4)), np.zeros(5)) if method == "evaluate" else (np.zeros((5, 4)),)
    with pytest.raises(ConfigError, match=match):
        getattr(sm, method)(*args, **kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"sample_weight": np.ones(3)}, r"`sample_weight` must hold one weight per sample \(5\); received 3 weights"),
    ({"weight_col": "w"}, r"`weight_col` names a DataFrame column, but `x` is numpy; pass sample_weight= instead "
                          r"\(received weight_col='w'\)"),
    ({"sample_weight": np.ones(5), "y": None}, r"`y` is required when `x` is a numpy array"),
])
def test_evaluate_refuses_bad_weights_before_spark(model, kwargs, match):
    sm = SparkModel(model, spark=_NoSpark())
    with pytest.raises(DataError, match=match):
        sm.evaluate(np.zeros((5, 4)), kwargs.pop("y", np.zeros(5)), **kwargs)


def test_callbacks_that_act_per_batch_are_warned_about(tmp_path):
    import keras

    from elephant.fit.progress import batch_hook_warning

    class PerBatch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    quiet = [keras.callbacks.EarlyStopping(), keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
             keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras")), keras.callbacks.TerminateOnNaN(),
             keras.callbacks.TensorBoard(str(tmp_path / "tb")), keras.callbacks.LearningRateScheduler(lambda e: 0.1)]
    assert batch_hook_warning(quiet) is None and batch_hook_warning(None) is None
    warning = batch_hook_warning([*quiet, PerBatch(), keras.callbacks.TensorBoard(str(tmp_path / "tb"), update_freq=5),
                                  keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras"), save_freq=10)])
    assert "['PerBatch', 'TensorBoard', 'ModelCheckpoint'] act on training batches" in warning


def test_a_spark_failure_is_summarised_by_the_tasks_own_error():
    from elephant.fit.epoch import epoch_failure, spark_failure_cause

    raw = Exception(
        "An error occurred while calling o123.collectAndServe.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed 4 times\n"
        "Traceback (most recent call last):\n  File \"worker.py\", line 9, in task\n"
        "RuntimeError: injected fault in partition 0 at step 1\n\tat org.apache.spark.api.python...\n")
    assert spark_failure_cause(raw) == "RuntimeError: injected fault in partition 0 at step 1"
    assert spark_failure_cause(Exception("")) == "Exception: Exception"
    error = epoch_failure(raw, 2, 5)
    assert str(error).startswith("epoch 3 of 5 failed in Spark: RuntimeError: injected fault")
    assert "sm.model holds the weights after epoch 2" in str(error) and "initial_epoch=2" in str(error)
    assert "weights it had before the fit" in str(epoch_failure(raw, 0, 5))
