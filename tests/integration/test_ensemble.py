"""Ensembles on local Spark: distributed predict/evaluate on numpy, RDD and DataFrame; concurrent member fits."""

import threading

import numpy as np
import pytest

from elephant.ensemble import Ensemble
from elephant.errors import ElephantError

from .helpers import digits_model


@pytest.fixture(scope="module")
def members(digits):
    x_train, _, y_train, _ = digits
    models = []
    for seed in range(3):  # trained locally: these tests are about combining, not training
        model = digits_model(seed=seed)
        model.fit(x_train, y_train, epochs=1, batch_size=64, verbose=0)
        models.append(model)
    return models


def _majority(labels):
    """Row-wise majority of a (members, n) label matrix; ties to the lowest label."""
    return np.array([np.bincount(col, minlength=10).argmax() for col in labels.T])


def test_distributed_mean_is_the_numpy_mean_and_matches_local(spark, digits, members):
    _, x_test, _, _ = digits
    ens = Ensemble(members, spark=spark)
    per_member = ens.predict_members(x_test)
    out = ens.predict(x_test)
    np.testing.assert_array_equal(out, np.mean(np.stack(per_member), axis=0))
    local = np.stack([m.predict(x_test, verbose=0) for m in members])  # row i of x_test -> row i, whatever the blocks
    np.testing.assert_allclose(out, np.mean(local, axis=0), rtol=1e-5, atol=1e-7)
    weighted = Ensemble(members, weights=[3, 1, 1], spark=spark).predict(x_test)
    np.testing.assert_allclose(weighted, np.average(local, axis=0, weights=[3, 1, 1]), rtol=1e-5, atol=1e-7)


def test_distributed_vote_is_the_majority(spark, digits, members):
    _, x_test, _, y_test = digits
    ens = Ensemble(members, combine="vote", spark=spark)
    labels = np.stack([np.argmax(m.predict(x_test, verbose=0), axis=1) for m in members])
    votes = ens.predict(x_test)
    np.testing.assert_array_equal(votes, _majority(labels))
    np.testing.assert_array_equal(votes, ens.predict(x_test, local=True))
    logs = ens.evaluate(x_test, y_test, return_dict=True)
    assert logs["accuracy"] == pytest.approx(np.mean(votes == y_test), abs=1e-6)


def test_rdd_and_dataframe_inputs(spark, digits, members):
    _, x_test, _, y_test = digits
    ens = Ensemble(members, spark=spark)
    expected = ens.predict(x_test, local=True)
    records = spark.sparkContext.parallelize(list(zip(x_test, y_test.tolist())), 3)
    np.testing.assert_allclose(np.stack(ens.predict(records).collect()), expected, rtol=1e-5, atol=1e-7)
    rows = [(i, x.tolist(), int(y)) for i, (x, y) in enumerate(zip(x_test, y_test))]
    df = spark.createDataFrame(rows, ["id", "features", "label"])
    scored = ens.predict(df).toPandas()
    np.testing.assert_allclose(np.stack(scored["prediction"].to_numpy()), expected[scored["id"].to_numpy()],
                               rtol=1e-5, atol=1e-6)
    voting = Ensemble(members, combine="vote", spark=spark)
    voted = voting.predict(df).toPandas()
    np.testing.assert_array_equal(voted["prediction"].to_numpy(), voting.predict(x_test, local=True)[voted["id"].to_numpy()])
    local = ens.evaluate(x_test, y_test, return_dict=True, local=True)
    assert local["accuracy"] == pytest.approx(np.mean(np.argmax(expected, axis=1) == y_test), abs=1e-6)
    for data in (records, df):
        logs = ens.evaluate(data, return_dict=True)
        assert logs["accuracy"] == pytest.approx(local["accuracy"], abs=1e-6)
        assert logs["loss"] == pytest.approx(local["loss"], rel=1e-4)


def test_fit_members_trains_concurrently_with_bootstrap(spark, digits):
    x_train, x_test, y_train, y_test = digits
    ens = Ensemble.fit_members(digits_model, 2, x_train, y_train, parallelism=2, bootstrap=True, seed=0,
                               epochs=3, batch_size=32, frequency="epoch", verbose=0, spark=spark)
    assert len(ens) == 2 and [len(h.history["loss"]) for h in ens.histories] == [3, 3]
    assert not np.array_equal(ens.models[0].get_weights()[0], ens.models[1].get_weights()[0])
    accuracy = ens.evaluate(x_test, y_test, return_dict=True)["accuracy"]
    assert accuracy > 0.6
    assert not [t.name for t in threading.enumerate() if t.name.startswith("elephant-ps")]


def test_failed_member_cancels_the_others(spark, digits):
    x_train, _, y_train, _ = digits
    calls = []

    def build(seed):
        calls.append(seed)
        if len(calls) == 2:
            raise ValueError("no GPU for member two")
        return digits_model(seed=0)

    with pytest.raises(ElephantError, match=r"ensemble member [01] failed: no GPU for member two"):
        Ensemble.fit_members(build, 2, x_train, y_train, parallelism=2, epochs=200, frequency="epoch",
                             verbose=0, spark=spark)
    assert list(spark.sparkContext.statusTracker().getActiveJobsIds()) == []
