"""elephant.ensemble without Spark: combination math, validation, local predict/evaluate, save/load."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402

from elephant.ensemble import Ensemble, check_weights, combine_predictions, vote_shares  # noqa: E402
from elephant.errors import ConfigError  # noqa: E402
from elephant.search import SearchResult, Trial  # noqa: E402


def _model(seed, classes=3, activation="softmax"):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(classes, activation=activation)])
    m.compile("sgd", "sparse_categorical_crossentropy" if classes > 1 else "binary_crossentropy", metrics=["accuracy"])
    return m


@pytest.fixture(scope="module")
def members():
    return [_model(s) for s in range(3)]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(40, 4)).astype("float32"), rng.integers(0, 3, 40)


# ---------------------------------------------------------------- the math
def test_mean_is_numpy_mean_exactly():
    preds = [np.random.default_rng(i).random((7, 3)).astype("float32") for i in range(4)]
    out = combine_predictions(preds, "mean")
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.mean(np.stack(preds), axis=0))


def test_weighted_mean_is_numpy_average():
    preds = [np.random.default_rng(i).random((5, 2)).astype("float32") for i in range(3)]
    out = combine_predictions(preds, "mean", weights=(1.0, 2.0, 5.0))
    np.testing.assert_array_equal(out, np.average(np.stack(preds), axis=0, weights=[1, 2, 5]).astype("float32"))
    assert out.dtype == np.float32


def test_mean_of_multi_output_predictions():
    a, b = {"p": np.ones((2, 1)), "q": np.zeros((2, 2))}, {"p": np.full((2, 1), 3.0), "q": np.ones((2, 2))}
    out = combine_predictions([a, b], "mean")
    np.testing.assert_array_equal(out["p"], np.full((2, 1), 2.0))
    np.testing.assert_array_equal(combine_predictions([[a["q"]], [b["q"]]], "mean")[0], np.full((2, 2), 0.5))


def test_vote_is_the_majority_with_ties_to_the_lowest_class():
    onehot = np.eye(3)
    m1 = onehot[[0, 1, 2, 2, 1]]
    m2 = onehot[[0, 2, 1, 2, 0]]
    m3 = onehot[[1, 2, 0, 1, 2]]
    # rows: majority 0; majority 2; three-way tie -> 0; majority 2; three-way tie -> 0
    np.testing.assert_array_equal(combine_predictions([m1, m2, m3], "vote"), [0, 2, 0, 2, 0])
    np.testing.assert_array_equal(combine_predictions([m1, m2], "vote"), [0, 1, 1, 2, 0])  # 2-way ties -> lower


def test_vote_uses_argmax_of_probabilities_and_weights():
    p1 = np.array([[0.6, 0.4], [0.3, 0.7]])
    p2 = np.array([[0.1, 0.9], [0.2, 0.8]])
    p3 = np.array([[0.2, 0.8], [0.9, 0.1]])
    np.testing.assert_array_equal(combine_predictions([p1, p2, p3], "vote"), [1, 1])
    np.testing.assert_array_equal(combine_predictions([p1, p2, p3], "vote", weights=[5, 1, 1]), [0, 1])
    np.testing.assert_allclose(vote_shares([p1, p2, p3], [5, 1, 1]), [[5 / 7, 2 / 7], [1 / 7, 6 / 7]])


def test_vote_on_single_sigmoid_unit_thresholds_at_one_half():
    preds = [np.array([[0.9], [0.2], [0.5]]), np.array([[0.4], [0.1], [0.7]]), np.array([[0.8], [0.6], [0.2]])]
    np.testing.assert_array_equal(combine_predictions(preds, "vote"), [1, 0, 0])


def test_vote_refuses_multi_output_and_bad_shapes():
    with pytest.raises(ConfigError, match="combine='vote' needs single-output models"):
        combine_predictions([[np.ones((2, 2))], [np.ones((2, 2))]], "vote")
    with pytest.raises(ConfigError, match=r"needs outputs of shape \(n, classes\) or \(n, 1\); received shape \(2, 2, 2\)"):
        combine_predictions([np.ones((2, 2, 2))], "vote")


@pytest.mark.parametrize("weights", [[1.0], [1, -1, 1], [1, 0, 1], [1, float("nan"), 1], "abc", 3])
def test_check_weights_rejects(weights):
    with pytest.raises(ConfigError, match=r"`weights` must be None or 3 positive finite numbers \(one per member\)"):
        check_weights(weights, 3)


def test_check_weights_accepts():
    assert check_weights(None, 2) is None and check_weights(np.array([1, 2]), 2) == (1.0, 2.0)


# ------------------------------------------------------------- the class
def test_constructor_validates(members):
    with pytest.raises(ConfigError, match="`combine` must be 'mean' or 'vote'; received combine='median'"):
        Ensemble(members, combine="median")
    with pytest.raises(ConfigError, match=r"`models` must be a non-empty list of keras.Model; received \[\]"):
        Ensemble([])
    with pytest.raises(ConfigError, match=r"received \['Sequential', 'str'\]"):
        Ensemble([members[0], "model.keras"])
    with pytest.raises(ConfigError, match="`weights` must be None or 3 positive"):
        Ensemble(members, weights=[1, 2])


def test_local_predict_is_the_numpy_combination(members, data):
    x, _ = data
    preds = [m.predict(x, verbose=0) for m in members]
    np.testing.assert_array_equal(Ensemble(members).predict(x, local=True), np.mean(np.stack(preds), axis=0))
    votes = Ensemble(members, combine="vote").predict(x, local=True)
    np.testing.assert_array_equal(votes, combine_predictions(preds, "vote"))
    assert votes.dtype == np.int64 and votes.shape == (40,)


def test_local_evaluate_scores_the_combined_output(members, data):
    x, y = data
    mean = np.mean(np.stack([m.predict(x, verbose=0) for m in members]), axis=0)
    logs = Ensemble(members).evaluate(x, y, local=True, return_dict=True)
    assert logs["accuracy"] == pytest.approx(np.mean(np.argmax(mean, axis=1) == y))
    expected_loss = float(keras.losses.sparse_categorical_crossentropy(y, mean).numpy().mean())
    assert logs["loss"] == pytest.approx(expected_loss, rel=1e-5)
    vote = Ensemble(members, combine="vote")
    loss, accuracy = vote.evaluate(x, y, local=True)  # Keras' list form: loss first
    assert accuracy == pytest.approx(np.mean(vote.predict(x, local=True) == y)) and loss > 0


def test_from_search_takes_the_best_trials_in_order(members):
    trials = [Trial(0, {}, status="ok", score=0.3, model=members[0]), Trial(1, {}, status="failed", error="x"),
              Trial(2, {}, status="ok", score=0.1, model=members[1]), Trial(3, {}, status="ok", score=0.2, model=members[2])]
    result = SearchResult(trials, "val_loss", "min", 1.0)
    ens = Ensemble.from_search(result, top_k=2, combine="vote")
    assert ens.models == [members[1], members[2]] and ens.combine == "vote"
    for bad in (0, 4, 1.5, True):
        with pytest.raises(ConfigError, match=r"`top_k` must be an int in \[1, 3\] \(the successful trials of the search\)"):
            Ensemble.from_search(result, top_k=bad)


@pytest.mark.parametrize("name", ["ens", "ens.zip"])
def test_save_load_round_trip(tmp_path, members, data, name):
    x, _ = data
    ens = Ensemble(members[:2], weights=[1, 3], combine="mean")
    ens.save(tmp_path / name)
    back = Ensemble.load(tmp_path / name)
    assert (len(back), back.weights, back.combine) == (2, (1.0, 3.0), "mean")
    np.testing.assert_array_equal(back.predict(x, local=True), ens.predict(x, local=True))


def test_load_refuses_what_save_did_not_write(tmp_path):
    with pytest.raises(ConfigError, match="`path` must be a directory or .zip file written by Ensemble.save"):
        Ensemble.load(tmp_path / "missing")
    (tmp_path / "d").mkdir()
    with pytest.raises(ConfigError, match="holds no readable ensemble.json"):
        Ensemble.load(tmp_path / "d")
    (tmp_path / "d" / "ensemble.json").write_text('{"format": "elephant.ensemble", "members": ["../x.keras"]}')
    with pytest.raises(ConfigError, match=r"is not an elephant ensemble \(bad ensemble.json\)"):
        Ensemble.load(tmp_path / "d")
