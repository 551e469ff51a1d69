"""Hyperparameter search on local Spark: every trial is an elephant fit with its own PS and job group."""

import secrets
import threading
from urllib.parse import urlsplit

import numpy as np
import pytest

from elephant import optimizers as O
from elephant.errors import PSError
from elephant.search import hp, minimize

from .helpers import accuracy, active_jobs_after


def small_model(units=16, lr=1e-2):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(units, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(lr), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _ps_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("elephant-ps")]


def test_concurrent_search_maximises_with_separate_servers(spark, digits, monkeypatch):
    import elephant.ps.app as ps_app

    x_train, x_test, y_train, y_test = digits
    tokens, real_create_app = [], ps_app.create_app

    def spy(store, token, **kwargs):  # run_fit imports create_app at call time
        tokens.append(token)
        return real_create_app(store, token, **kwargs)

    monkeypatch.setattr(ps_app, "create_app", spy)
    space = {"lr": hp.loguniform("lr", np.log(3e-3), np.log(3e-2)), "units": hp.choice("units", [8, 16]),
             "optimizer": hp.choice("optimizer", ["downpour", "dynsgd"])}
    result = minimize(small_model, space, x_train, y_train, max_evals=4, parallelism=2, metric="val_accuracy",
                      mode="max", validation_data=(x_test, y_test), epochs=2, frequency="epoch", seed=0,
                      verbose=0, spark=spark)
    trials = result.trials
    assert len(trials) == 4 and all(t.status == "ok" for t in trials), [t.error for t in trials]
    assert result.best_score == max(t.score for t in trials)
    best = max(trials, key=lambda t: (t.score, -t.number))
    assert result.best_params == best.params and result.best_model is best.model
    assert result.best_score == best.history["val_accuracy"][-1]
    assert accuracy(result.best_model, x_test, y_test) == pytest.approx(result.best_score, abs=1e-6)
    assert {t.params["optimizer"] for t in trials} <= {"downpour", "dynsgd"}
    # no cross-talk: one server per trial, each with its own port and token
    assert len({urlsplit(t.ps_url).port for t in trials}) == 4
    assert len(tokens) == 4 and len(set(tokens)) == 4
    # trials 0 and 1 started together and overlapped in time
    first, second = trials[0], trials[1]
    assert second.start < first.start + first.duration and first.start < second.start + second.duration
    assert not _ps_threads()
    frame = result.to_pandas()
    assert list(frame.columns[:3]) == ["status", "score", "duration"] and len(frame) == 4


def test_failed_trial_is_recorded_and_the_others_finish(spark, digits):
    x_train, _, y_train, _ = digits
    calls = []

    def build(units):
        calls.append(units)
        if len(calls) == 2:
            raise ValueError(f"cannot build a layer of {units} units")
        return small_model(units)

    result = minimize(build, {"units": hp.choice("units", [8, 12, 16])}, x_train, y_train, max_evals=3,
                      parallelism=2, validation_split=0.2, epochs=1, num_workers=1, seed=1, verbose=0, spark=spark)
    statuses = [t.status for t in result.trials]
    assert len(statuses) == 3 and statuses.count("failed") == 1 and statuses.count("ok") == 2
    failed = next(t for t in result.trials if t.status == "failed")
    assert failed.error.startswith("ValueError: cannot build a layer of") and failed.model is None
    assert result.best_score == min(t.score for t in result.trials if t.status == "ok")


def test_a_trial_that_trains_its_last_epoch_completes_whatever_the_pruner_says(spark, digits):
    from .test_search_resume import PruneAt

    x_train, _, y_train, _ = digits
    result = minimize(small_model, {"units": hp.choice("units", [8, 16])}, x_train[:600], y_train[:600],
                      max_evals=1, pruner=PruneAt({0}, step=2), validation_split=0.2, epochs=2, num_workers=1,
                      seed=0, verbose=0, spark=spark)
    trial = result.trials[0]
    assert (trial.status, trial.epochs) == ("ok", 2) and trial.model is not None
    assert result.study.trials[0].intermediate_values.keys() == {1, 2}


def test_timeout_cancels_the_running_trial_spark_jobs(spark, digits, monkeypatch):
    from elephant.search.job import FitJob

    x_train, _, y_train, _ = digits
    # One epoch of about 23,000 single-sample steps, each a commit round trip, takes minutes: the trial is
    # cut short only if the time limit cancels its Spark job (the callback that stops a fit acts at an
    # epoch's end). Checked by what the server applied, not by the clock, so a loaded machine cannot fail it.
    x_long, y_long = np.tile(x_train, (20, 1)), np.tile(y_train, 20)
    steps = int(len(x_long) * 0.8)
    jobs, fit = [], FitJob.fit
    monkeypatch.setattr(FitJob, "fit", lambda job, *args: (jobs.append(job), fit(job, *args))[1])
    result = minimize(small_model, {"units": hp.choice("units", [8, 16])}, x_long, y_long, max_evals=3,
                      timeout=8, validation_split=0.2, epochs=1, batch_size=1, frequency="batch", seed=0,
                      verbose=0, spark=spark)
    assert len(result.trials) == 1  # nothing starts after the deadline
    trial = result.trials[0]
    assert trial.status == "timeout" and "time limit reached" in trial.error and trial.model is None
    assert result.best_trial is None
    assert len(jobs) == 1 and jobs[0].sm.last_metrics is not None
    assert jobs[0].sm.last_metrics["commits_applied"] < steps / 2, jobs[0].sm.last_metrics  # cut mid-epoch
    # Spark's scheduler ends a cancelled job on its own event thread: under load the tracker can
    # list it for a moment after the search has returned; it must be gone within seconds.
    assert active_jobs_after(spark.sparkContext, 30) == []
    assert not _ps_threads()


def test_servers_of_concurrent_fits_refuse_each_others_tokens():
    """Two parameter servers built the way a fit builds them: distinct ports, 401 across tokens."""
    from elephant.ps.app import create_app
    from elephant.ps.client import PSClient
    from elephant.ps.server import PSServer
    from elephant.ps.store import CommitKey, Store

    center = [np.zeros(3, dtype=np.float32)]
    tokens = [secrets.token_urlsafe(32) for _ in range(2)]
    stores = [Store(center, O.Downpour(), "asynchronous", 1, f"run{i}") for i in range(2)]
    servers = [PSServer(create_app(s, t), host="127.0.0.1", port=0, threads=4) for s, t in zip(stores, tokens)]
    try:
        for server in servers:
            server.start()
        assert servers[0].port != servers[1].port
        commit = O.Commit([np.ones(3, dtype=np.float32)], 1, 1, 0)
        with PSClient(servers[0].url, tokens[1], retries=0) as intruder, pytest.raises(PSError, match="HTTP 401"):
            intruder.commit(CommitKey("run0", 0, 0, 0), 1, commit)
        np.testing.assert_array_equal(stores[0].center()[0], center[0])  # the refused commit changed nothing
        with PSClient(servers[0].url, tokens[0], retries=0) as owner:
            reply = owner.commit(CommitKey("run0", 0, 0, 0), 1, commit)
        np.testing.assert_array_equal(reply.center[0], np.ones(3))
    finally:
        for server in servers:
            server.stop()


def test_live_concurrent_trials_have_their_own_servers_and_refuse_each_others_tokens(spark, digits, monkeypatch):
    """Two trials running at once (parallelism 2): while both servers are up, each one
    answers 401 to the other trial's token, and to its own token it answers 200."""
    import keras

    from elephant.ps.client import PSClient
    from elephant.ps.server import PSServer

    x_train, _, y_train, _ = digits
    live, checks, lock = {}, [], threading.Lock()
    start = PSServer.start

    def recording_start(self):
        started = start(self)
        with lock:
            live[self.url] = self._token
        return started

    def probe(epoch, logs):  # runs on the driver between the epochs of either trial
        with lock:
            servers = dict(live)
        if len(servers) < 2:
            return
        (url_a, token_a), (url_b, token_b) = list(servers.items())[:2]
        for url, own, other in ((url_a, token_a, token_b), (url_b, token_b, token_a)):
            try:
                with PSClient(url, other, retries=0) as intruder:
                    intruder.health()
                    checks.append((url, "accepted"))
            except PSError as exc:
                checks.append((url, "401" if "HTTP 401" in str(exc) else str(exc)))
            except Exception as exc:  # the other trial's server may have just stopped
                checks.append((url, f"gone: {type(exc).__name__}"))
            else:
                continue
            try:
                with PSClient(url, own, retries=0) as owner:
                    checks.append((url, "own-ok" if owner.health()["status"] == "ok" else "own-bad"))
            except Exception as exc:
                checks.append((url, f"gone: {type(exc).__name__}"))

    monkeypatch.setattr(PSServer, "start", recording_start)
    result = minimize(small_model, {"units": hp.choice("units", [8, 16])}, x_train, y_train, max_evals=2,
                      parallelism=2, validation_split=0.2, epochs=6, batch_size=32, seed=0, verbose=0,
                      callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=probe)], spark=spark)
    assert [t.status for t in result.trials] == ["ok", "ok"]
    assert len(live) == 2 and len(set(live.values())) == 2  # two servers: distinct ports and tokens
    refused = [c for c in checks if c[1] == "401"]
    assert refused, f"the two trials never ran at the same time: {checks}"
    assert not [c for c in checks if c[1] in ("accepted", "own-bad")], checks
    assert ("own-ok" in {c[1] for c in checks})
