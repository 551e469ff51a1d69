"""elephant.search without Spark: key routing, validation, bookkeeping and the hyperopt loop."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

from elephant import optimizers as O
from elephant import search as S
from elephant.errors import ConfigError
from elephant.search import SearchResult, Trial, hp, minimize, run_search


def build(units, lr=1e-3, *, depth=1):  # a stand-in build_fn: only its signature matters here
    raise AssertionError("build_fn must not run during validation")


ACCEPTED, REQUIRED = S.build_params(build)
X, Y = np.zeros((8, 4), dtype="float32"), np.zeros(8)


@pytest.fixture
def no_spark(monkeypatch):
    def refuse():
        raise AssertionError("Spark was started before the arguments were validated")

    monkeypatch.setattr(S.session, "get_or_create", refuse)


# ------------------------------------------------------------------ routing
def test_build_params_reads_the_signature():
    assert ACCEPTED == {"units", "lr", "depth"} and REQUIRED == {"units"}
    assert S.build_params(lambda a, **kw: None) == (None, frozenset({"a"}))


def test_route_splits_keys_by_destination():
    routed = S.route({"units": 8, "lr": 0.1, "epochs": 3, "batch_size": 16, "mode": "hogwild", "frequency": 2,
                      "num_workers": 1, "optimizer": "dynsgd", "optimizer.window": 4, "callbacks": []}, ACCEPTED)
    assert routed.build == {"units": 8, "lr": 0.1}
    assert routed.fit == {"epochs": 3, "batch_size": 16, "callbacks": []}
    assert routed.settings == {"mode": "hogwild", "frequency": 2, "num_workers": 1, "optimizer": "dynsgd",
                               "optimizer.window": 4}


def test_route_sends_everything_else_to_a_kwargs_build_fn():
    assert S.route({"anything": 1, "epochs": 2}, None).build == {"anything": 1}


def test_route_names_an_unknown_key():
    with pytest.raises(ConfigError, match=r"unknown key 'widht': not a parameter of build_fn \['depth', 'lr', 'units'\]"):
        S.route({"widht": 3}, ACCEPTED)


def test_elephant_settings_builds_the_optimizer_with_its_params():
    settings = S.elephant_settings({"optimizer": "dynsgd", "optimizer.window": 7, "num_workers": 2})
    assert settings["optimizer"] == O.DynSGD(window=7) and settings["num_workers"] == 2
    assert S.elephant_settings({"mode": "synchronous"})["optimizer"] == O.ModelAveraging()
    assert S.elephant_settings({"optimizer.window": 3})["optimizer"] == O.DelayedNesterov(window=3)
    assert S.elephant_settings({"mode": "hogwild", "optimizer.window": 3})["optimizer"] == O.Downpour(window=3)


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"mode": "eventual"}, "`mode` must be 'synchronous', 'asynchronous' or 'hogwild'; received mode='eventual'"),
        ({"frequency": "weekly"}, "received frequency='weekly'"),
        ({"num_workers": 0}, "`num_workers` must be a positive int; received num_workers=0"),
        ({"optimizer": "downpour", "mode": "synchronous"}, r"'downpour' supports mode\(s\) .*received mode='synchronous'"),
        ({"optimizer": "adamw"}, "Could not interpret optimizer identifier: 'adamw'"),
        ({"optimizer": "downpour", "optimizer.gamma": 0.1}, "invalid arguments for optimizer 'downpour'"),
    ],
)
def test_elephant_settings_are_validated(settings, match):
    with pytest.raises(ConfigError, match=match):
        S.elephant_settings(settings)


@pytest.mark.parametrize(
    "keys, fixed, match",
    [
        ({"units"}, {"units": 4}, "key 'units' is both in the space and a keyword argument of minimize"),
        ({"callbacks"}, {}, "'callbacks' cannot be searched; pass callbacks=... to minimize instead"),
        ({"read_timeout"}, {}, "'read_timeout' cannot be searched"),
        ({"optimizer.windw"}, {}, "unknown key 'optimizer.windw': no distributed optimizer takes 'windw'"),
        (set(), {"optimizer.nope": 1}, "unknown key 'optimizer.nope'"),
        ({"learning_rate"}, {}, "unknown key 'learning_rate'"),
        ({3}, {}, "keys of the space must be strings; received 3"),
    ],
)
def test_check_keys_rejects(keys, fixed, match):
    with pytest.raises(ConfigError, match=match):
        S.check_keys(keys, fixed, ACCEPTED)


def test_check_space_validates_sampled_points_and_reports_largest_num_workers():
    space = {"units": hp.choice("units", [8, 16]), "num_workers": hp.choice("w", [1, 3]),
             "optimizer": hp.choice("opt", ["downpour", "agn"]), "optimizer.window": hp.randint("win", 1, 4)}
    assert S.check_space(space, {"epochs": 2}, (ACCEPTED, REQUIRED), seed=0) == 3
    assert S.check_space({"units": 4}, {}, (ACCEPTED, REQUIRED), seed=0) is None


@pytest.mark.parametrize(
    "space, fixed, match",
    [
        ({"lr": 0.1}, {}, r"build_fn requires \['units'\] but neither the space nor the keyword arguments give it"),
        ({"units": 4, "optimizer": hp.choice("o", ["downpour", "easgd"])}, {},
         r"the space yields invalid elephant settings .*'easgd' supports mode\(s\) \['synchronous'\]"),
        ({"units": 4, "mode": "synchronous", "optimizer.alpha": 0.1}, {}, "invalid arguments for optimizer 'modelaveraging'"),
        (hp.choice("s", [1, 2]), {}, "`space` must be a dict of names to hyperopt expressions .* samples to int"),
        (hp.choice("s", [{"units": 4}, {"units": 4, "bogus": 1}]), {}, "unknown key 'bogus'"),
    ],
)
def test_check_space_rejects_before_any_trial(space, fixed, match):
    with pytest.raises(ConfigError, match=match):
        S.check_space(space, fixed, (ACCEPTED, REQUIRED), seed=0)


@pytest.mark.parametrize("slots, parallelism, requested, expected", [(8, 2, None, 4), (2, 4, None, 1), (4, 1, 3, 3)])
def test_plan_workers_shares_the_slots(slots, parallelism, requested, expected):
    assert S.plan_workers(slots, parallelism, requested) == expected


def test_plan_workers_warns_when_oversubscribed(caplog):
    with caplog.at_level(logging.WARNING, logger="elephant.search"):
        assert S.plan_workers(2, 2, 2) == 2
    assert "parallelism=2 x num_workers=2 = 4 exceeds the 2 task slots" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="elephant.search"):
        S.plan_workers(4, 2, 2)
    assert not caplog.records


# --------------------------------------------------------- minimize's checks
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_evals": 0}, "`max_evals` must be a positive int; received max_evals=0"),
        ({"parallelism": 1.5}, "`parallelism` must be a positive int; received parallelism=1.5"),
        ({"algo": "bayes"}, r"`algo` must be one of \['tpe', 'rand', 'anneal'\] or a hyperopt suggest function"),
        ({"mode": "maximize"}, "`mode` must be 'min' or 'max'; received mode='maximize'"),
        ({"metric": ""}, "`metric` must be a non-empty history key"),
        ({"validation_data": None}, "metric='val_loss' needs validation_data or validation_split; received neither"),
        ({"timeout": -1}, r"`timeout` must be a positive number of seconds or None; received timeout=-1"),
        ({"trial_timeout": 0}, "`trial_timeout` must be a positive number"),
        ({"seed": "zero"}, "`seed` must be an int or None"),
        ({"bogus": 1}, "unknown key 'bogus'"),
        ({"epochs": 2, "space": {"units": 4, "epochs": 3}}, "key 'epochs' is both in the space and a keyword argument"),
    ],
)
def test_minimize_validates_before_spark(no_spark, kwargs, match):
    args = {"max_evals": 2, "validation_data": (X, Y), "space": {"units": hp.choice("u", [4, 8])}, **kwargs}
    with pytest.raises(ConfigError, match=match):
        minimize(build, args.pop("space"), X, Y, **args)


def test_minimize_refuses_a_non_callable_build_fn(no_spark):
    with pytest.raises(ConfigError, match="`build_fn` must be callable"):
        minimize("model.keras", {}, X, Y, max_evals=1, validation_split=0.2)


# -------------------------------------------------------------- bookkeeping
def _trials():
    return [Trial(0, {"a": 1}, status="ok", score=0.5), Trial(1, {"a": 2}, status="failed", error="boom"),
            Trial(2, {"a": 3}, status="ok", score=0.2), Trial(3, {"a": 4}, status="ok", score=0.5),
            Trial(4, {"a": 5}, status="timeout", error="late")]


def test_result_best_and_top_for_min_and_max():
    low = SearchResult(_trials(), "val_loss", "min", 1.0)
    assert (low.best_params, low.best_score) == ({"a": 3}, 0.2)
    assert [t.number for t in low.top()] == [2, 0, 3]  # failures excluded, ties to the earlier trial
    high = SearchResult(_trials(), "val_accuracy", "max", 1.0)
    assert (high.best_params, high.best_score) == ({"a": 1}, 0.5)
    assert [t.number for t in high.top(2)] == [0, 3]


def test_result_without_success_has_no_best():
    result = SearchResult([Trial(0, {}, status="failed", error="x")], "loss", "min", 0.1)
    assert result.best_trial is None and result.best_params is None and result.best_model is None
    assert result.top() == []


def test_to_pandas_has_one_row_per_trial():
    frame = SearchResult(_trials() + [Trial(5, {"score": 9}, status="ok", score=1.0)], "loss", "min", 1.0).to_pandas()
    assert list(frame.index) == [0, 1, 2, 3, 4, 5]
    assert frame.loc[1, "status"] == "failed" and frame.loc[1, "error"] == "boom"
    assert frame.loc[2, "a"] == 3 and frame.loc[5, "param_score"] == 9 and frame.loc[5, "score"] == 1.0


# -------------------------------------------------------- the search loop
SPACE = {"x": hp.uniform("x", -2.0, 2.0), "tag": "const"}


def test_run_search_runs_exactly_max_evals_and_best_agrees():
    result = run_search(lambda p, job: {"score": (p["x"] - 0.5) ** 2}, SPACE, max_evals=15, seed=1)
    assert len(result.trials) == 15 and [t.number for t in result.trials] == list(range(15))
    assert all(t.status == "ok" and t.params["tag"] == "const" for t in result.trials)
    assert result.best_score == min(t.score for t in result.trials) == (result.best_params["x"] - 0.5) ** 2
    assert result.hyperopt_trials.best_trial["tid"] == result.best_trial.number


def test_run_search_mode_max_maximises():
    result = run_search(lambda p, job: {"score": -abs(p["x"])}, SPACE, max_evals=12, mode="max", algo="rand", seed=3)
    assert result.best_score == max(t.score for t in result.trials)
    losses = [t["result"]["loss"] for t in result.hyperopt_trials.trials]
    assert losses == [-t.score for t in result.trials]  # hyperopt minimises the negated score


def test_same_seed_same_points():
    points = [[t.params["x"] for t in run_search(lambda p, j: {"score": p["x"]}, SPACE, max_evals=6, seed=7).trials]
              for _ in range(2)]
    assert points[0] == points[1]


def test_failed_trials_are_recorded_and_the_search_continues():
    def objective(params, job):
        if params["x"] > 0:
            raise RuntimeError(f"diverged at x={params['x']:.3f}")
        return {"score": params["x"] ** 2, "history": {"loss": [1.0]}}

    result = run_search(objective, SPACE, max_evals=10, algo="rand", seed=0)
    failed = [t for t in result.trials if t.status == "failed"]
    assert len(result.trials) == 10 and failed and len(failed) < 10
    assert all(t.error.startswith("RuntimeError: diverged at x=") and t.score is None for t in failed)
    assert result.best_params["x"] <= 0
    docs = {d["tid"]: d["result"]["status"] for d in result.hyperopt_trials.trials}
    assert all(docs[t.number] == ("fail" if t.status == "failed" else "ok") for t in result.trials)


def test_non_finite_score_is_a_failure():
    result = run_search(lambda p, job: {"score": float("nan")}, SPACE, max_evals=2, metric="val_loss")
    assert [t.status for t in result.trials] == ["failed", "failed"]
    assert result.trials[0].error == "val_loss is nan, not a finite number"


def test_trials_run_concurrently_up_to_parallelism():
    lock, state, three = threading.Lock(), {"now": 0, "peak": 0}, threading.Event()

    def objective(params, job):
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
            if state["now"] == 3:
                three.set()
        three.wait(timeout=60)  # the first trials hold until three run at once, however slow the machine
        with lock:
            state["now"] -= 1
        return {"score": params["x"]}

    result = run_search(objective, SPACE, max_evals=6, parallelism=3, seed=0)
    assert len(result.trials) == 6 and state["peak"] == 3  # three at once, never more


def test_timeout_cancels_running_trials_and_returns_promptly():
    started, cancelled = [], []

    def objective(params, job):
        started.append(params["x"])
        cancelled.append(job.cancelled.wait(30))  # a stuck fit, until the driver cancels it
        if not cancelled[-1]:
            return {"score": 0.0}
        raise RuntimeError("job cancelled")

    result = run_search(objective, SPACE, max_evals=5, parallelism=2, timeout=0.5, seed=0)
    assert cancelled == [True, True]  # both running trials were cancelled, not waited for
    assert len(result.trials) == 2 == len(started)  # no trial starts after the deadline
    assert all(t.status == "timeout" and "time limit reached" in t.error for t in result.trials)
    assert result.best_trial is None


def test_trial_timeout_cancels_only_the_slow_trial():
    def objective(params, job):
        if params["x"] > 0 and job.cancelled.wait(30):
            raise RuntimeError("cancelled")
        return {"score": params["x"]}

    result = run_search(objective, SPACE, max_evals=8, parallelism=2, trial_timeout=0.3, algo="rand", seed=2)
    slow = [t for t in result.trials if t.params["x"] > 0]
    assert slow and all(t.status == "timeout" for t in slow)
    assert all(t.status == "ok" for t in result.trials if t.params["x"] <= 0)
    assert len(result.trials) == 8


class ConnectStub:
    """Stands for a Spark Connect client session: records its tag calls, answers conf reads."""

    def __init__(self, master="local[4]"):
        self.calls, self.conf = [], self
        self._conf = {"spark.master": master}

    def get(self, key, default=None):
        return self._conf.get(key, default)

    def addTag(self, tag):
        self.calls.append(("add", tag))

    def removeTag(self, tag):
        self.calls.append(("remove", tag))

    def interruptTag(self, tag):
        self.calls.append(("interrupt", tag))
        return []


ConnectStub.__module__ = "pyspark.sql.connect.session"


def test_a_connect_trial_is_cancelled_through_its_tags():
    from elephant.search.job import FitJob

    spark = ConnectStub()
    job = FitJob(spark, "trial3")
    job.sm = type("SM", (), {"job_group": "elephant-run7"})()
    job.cancel()
    assert job.cancelled.is_set() and spark.calls == [("interrupt", job.group), ("interrupt", "elephant-run7")]


def test_search_slots_under_connect_read_the_conf_and_refuse_numpy():
    from elephant.search import search_slots

    frame = type("DataFrame", (), {"sparkSession": None, "schema": None})
    frame.__module__ = "pyspark.sql.connect.dataframe"
    assert search_slots(ConnectStub("local[4]"), frame(), None) == 4
    assert search_slots(ConnectStub("yarn"), frame(), None) == 1  # unknown: one worker per trial
    with pytest.raises(ConfigError, match=r"under Spark Connect a search trains on a DataFrame; received x of type "
                                          r"ndarray"):
        search_slots(ConnectStub(), np.zeros((4, 2)), np.zeros(4))
