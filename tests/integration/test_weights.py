"""Sample and class weights through every input kind: they reach the training step and the metrics.

The training set has most labels shifted to the next digit; those samples get
weight 0. A fit that honours the weights learns the true digits; one that
drops them learns the shifted ones.
"""

import numpy as np
import pytest

from elephant import SparkModel
from tests.integration.helpers import accuracy, digits_model


def _learned_true_digits(model, x_test, y_test):
    # the weighted fits reach 0.85-0.93 on the true digits and about 0.01 on the shifted ones;
    # unweighted, 0.23-0.37 and 0.58-0.72
    return accuracy(model, x_test, y_test) > 0.7 and accuracy(model, x_test, (y_test + 1) % 10) < 0.1


def _shifted(y, fraction=0.6, seed=0):
    """Labels with ``fraction`` of them moved to the next digit, and weights that keep only the true ones."""
    wrong = np.random.default_rng(seed).random(len(y)) < fraction
    return np.where(wrong, (y + 1) % 10, y), (~wrong).astype("float32")


@pytest.mark.parametrize("mode", ["synchronous", "asynchronous", "hogwild"])
def test_numpy_sample_weights_decide_what_is_learned(spark, digits, mode):
    x_train, x_test, y_train, y_test = digits
    y_noisy, w = _shifted(y_train)
    sm = SparkModel(digits_model(lr=3e-3), mode=mode, num_workers=2, spark=spark)
    history = sm.fit(x_train, y_noisy, sample_weight=w, epochs=4, batch_size=32, verbose=0)
    assert _learned_true_digits(sm.model, x_test, y_test)
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_without_the_weights_the_shifted_labels_win(spark, digits):
    # the control for the test above: the same data, unweighted
    x_train, x_test, y_train, y_test = digits
    y_noisy, _ = _shifted(y_train)
    sm = SparkModel(digits_model(lr=3e-3), mode="asynchronous", num_workers=2, spark=spark)
    sm.fit(x_train, y_noisy, epochs=4, batch_size=32, verbose=0)
    assert accuracy(sm.model, x_test, y_test) < 0.5
    assert accuracy(sm.model, x_test, (y_test + 1) % 10) > 0.5


def test_rdd_records_and_dataframe_weight_col_carry_the_weights(spark, digits):
    x_train, x_test, y_train, y_test = digits
    y_noisy, w = _shifted(y_train)
    records = spark.sparkContext.parallelize(list(zip(x_train, y_noisy.tolist(), w.tolist())), 2)
    sm = SparkModel(digits_model(lr=3e-3), mode="asynchronous", spark=spark)
    sm.fit(records, epochs=4, batch_size=32, verbose=0)
    assert _learned_true_digits(sm.model, x_test, y_test)

    df = spark.createDataFrame([(f.tolist(), int(l), float(v)) for f, l, v in zip(x_train, y_noisy, w)],
                               ["pixels", "digit", "trust"])
    sm = SparkModel(digits_model(lr=3e-3), mode="synchronous", num_workers=2, spark=spark)
    sm.fit(df, epochs=4, batch_size=32, verbose=0, features_col="pixels", label_col="digit", weight_col="trust")
    assert _learned_true_digits(sm.model, x_test, y_test)


def test_class_weights_silence_the_classes_they_weigh_zero(spark, digits):
    # classes 5-9 weigh nothing: the model learns 0-4 and predicts nothing else
    x_train, x_test, y_train, y_test = digits
    class_weight = {c: 0.0 for c in range(5, 10)}
    sm = SparkModel(digits_model(lr=3e-3), mode="asynchronous", num_workers=2, spark=spark)
    sm.fit(x_train, y_train, class_weight=class_weight, epochs=3, batch_size=32, verbose=0)
    predicted = np.argmax(sm.model.predict(x_test, verbose=0), axis=1)
    assert np.mean(predicted < 5) > 0.97
    low = y_test < 5
    assert np.mean(predicted[low] == y_test[low]) > 0.85

    # a DataFrame: the class weights are computed in the tasks, from one-hot labels here
    df = spark.createDataFrame([(f.tolist(), np.eye(10)[l].tolist()) for f, l in zip(x_train, y_train)],
                               ["features", "label"])
    model = digits_model(lr=3e-3)
    model.compile(model.optimizer, "categorical_crossentropy", metrics=["accuracy"])
    sm = SparkModel(model, mode="synchronous", num_workers=2, spark=spark)
    sm.fit(df, class_weight=class_weight, epochs=3, batch_size=32, verbose=0)
    assert np.mean(np.argmax(sm.model.predict(x_test, verbose=0), axis=1) < 5) > 0.97


def test_weighted_evaluate_matches_keras_for_every_input_kind(spark, digits):
    import keras

    _, x_test, _, y_test = digits
    w = np.random.default_rng(1).uniform(0, 3, len(y_test)).astype("float32")
    model = digits_model()
    model.compile(keras.optimizers.Adam(), "sparse_categorical_crossentropy", metrics=["accuracy"],
                  weighted_metrics=["accuracy"])
    want = model.evaluate(x_test, y_test, sample_weight=w, verbose=0, return_dict=True)
    assert want["weighted_accuracy"] != pytest.approx(want["accuracy"], abs=1e-4)  # the weights matter
    sm = SparkModel(model, num_workers=3, spark=spark)
    rdd = spark.sparkContext.parallelize(list(zip(x_test, y_test.tolist(), w.tolist())), 3)
    df = spark.createDataFrame([(f.tolist(), int(l), float(v)) for f, l, v in zip(x_test, y_test, w)],
                               ["features", "label", "w"])
    for got in (sm.evaluate(x_test, y_test, sample_weight=w, return_dict=True),
                sm.evaluate(rdd, return_dict=True),
                sm.evaluate(df, weight_col="w", return_dict=True)):
        assert got.keys() == want.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-4), key


def test_validation_split_keeps_the_sample_weights_of_its_samples(spark, digits):
    x_train, _, y_train, _ = digits
    w = np.random.default_rng(2).uniform(0, 3, len(y_train)).astype("float32")
    sm = SparkModel(digits_model(), mode="synchronous", num_workers=2, spark=spark)
    history = sm.fit(x_train, y_train, sample_weight=w, validation_split=0.25, epochs=1, batch_size=32, verbose=0)
    cut = int(len(x_train) * 0.75)
    want = sm.model.evaluate(x_train[cut:], y_train[cut:], sample_weight=w[cut:], verbose=0, return_dict=True)
    assert history.history["val_loss"][0] == pytest.approx(want["loss"], rel=1e-4)
    unweighted = sm.model.evaluate(x_train[cut:], y_train[cut:], verbose=0, return_dict=True)
    assert unweighted["loss"] != pytest.approx(want["loss"], rel=1e-3)


def test_bad_weights_in_an_rdd_are_refused_on_the_driver_by_name(spark, digits):
    from elephant.errors import DataError

    x_train, _, y_train, _ = digits
    sc = spark.sparkContext
    sm = SparkModel(digits_model(), mode="asynchronous", num_workers=2, spark=spark)
    mixed = sc.parallelize([(x_train[0], 1, 0.5), (x_train[1], 2)] * 4, 2)
    with pytest.raises(DataError, match=r"mixes \(features, label\) and \(features, label, weight\) records"):
        sm.fit(mixed, epochs=1, verbose=0)
    weighted = sc.parallelize([(x_train[i], int(y_train[i]), 1.0) for i in range(8)], 2)
    with pytest.raises(DataError, match="carries sample weights and `class_weight` was given"):
        sm.fit(weighted, class_weight={0: 2.0}, epochs=1, verbose=0)
    assert sm.last_metrics is None or sm.last_metrics.get("commits_applied", 0) == 0
