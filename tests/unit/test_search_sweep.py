"""The Optuna-backed search loop with stub fits: pruning, the trial table, resume from a journal, plots."""

from __future__ import annotations

import threading

import numpy as np
import optuna
import pytest
from optuna.storages.journal import JournalFileBackend, JournalStorage
from optuna.trial import TrialState

from elephant.errors import ConfigError
from elephant.search import hp, minimize, run_search
from elephant.search.compile import compile_space
from elephant.search.job import FitJob
from elephant.search.study import BACKUP_DIR, INTERRUPTED, RESUMED_FROM

SPACE = {"x": hp.uniform("x", -2.0, 2.0)}


def curve(x, epoch):
    """A learning curve: the further x is from 0.5, the worse at every epoch."""
    return (x - 0.5) ** 2 + 1.0 / (epoch + 1)


def stub_fit(epochs=6, seen=None):
    """An objective that trains ``epochs`` epochs, reports each and stops when pruned (as the Keras callback does)."""

    def objective(params, job):
        for epoch in range(epochs):
            value = curve(params["x"], epoch)
            if seen is not None:
                seen.append((params["x"], epoch))
            if job.report(epoch, {"score": value, "loss": value}):
                break
        return {"score": value, "history": {"score": [value]}}

    return objective


class PruneAt(optuna.pruners.BasePruner):
    """Prunes the trials in ``numbers`` once they have reported ``step``."""

    def __init__(self, numbers, step):
        self.numbers, self.step = set(numbers), step

    def prune(self, study, trial):
        return trial.number in self.numbers and trial.last_step is not None and trial.last_step >= self.step


# ------------------------------------------------------------------- pruning
def test_a_pruned_trial_stops_at_that_epoch_and_the_study_says_pruned():
    seen = []
    result = run_search(stub_fit(6, seen), SPACE, max_evals=4, pruner=PruneAt({1, 3}, step=2), seed=0)
    assert [t.status for t in result.trials] == ["ok", "pruned", "ok", "pruned"]
    assert [t.epochs for t in result.trials] == [6, 2, 6, 2]  # steps are epochs trained: pruned after the second
    pruned = result.trials[1]
    assert [e for x, e in seen if x == pruned.params["x"]] == [0, 1]  # no epoch after the decision
    assert pruned.score == curve(pruned.params["x"], 1) and pruned.model is None
    frozen = result.study.trials
    assert [t.state for t in frozen] == [TrialState.COMPLETE, TrialState.PRUNED] * 2
    assert frozen[1].intermediate_values == {1: curve(pruned.params["x"], 0), 2: curve(pruned.params["x"], 1)}
    assert frozen[1].value == pruned.score  # Optuna stores the last intermediate value
    assert result.best_trial.status == "ok" and result.top() == [t for t in result.top() if t.status == "ok"]


def test_asha_prunes_the_worse_trials_at_the_first_rung():
    result = run_search(stub_fit(9), SPACE, max_evals=12, sampler="random", pruner="asha", seed=0)
    by_status = {s: [t for t in result.trials if t.status == s] for s in ("ok", "pruned")}
    assert by_status["pruned"] and by_status["ok"]
    assert {t.epochs for t in by_status["pruned"]} <= {1, 3}  # rungs at 1, 3, 9 epochs
    assert all(t.epochs == 9 for t in by_status["ok"])
    best_pruned = min(abs(t.params["x"] - 0.5) for t in by_status["pruned"])
    assert min(abs(t.params["x"] - 0.5) for t in by_status["ok"]) <= best_pruned


@pytest.mark.parametrize("final", [True, False])
def test_the_last_epoch_is_recorded_but_never_put_to_the_pruner(final):
    def objective(params, job):  # 9 epochs: ASHA's rungs at 1, 3 and 9 put one at the last epoch
        for epoch in range(9):
            value = curve(params["x"], epoch)
            if job.report(epoch, {"score": value}, final=final and epoch == 8):
                break
        return {"score": value}

    result = run_search(objective, SPACE, max_evals=3, pruner=PruneAt({0, 1, 2}, step=9), seed=0)
    assert [t.epochs for t in result.trials] == [9] * 3
    frozen = result.study.trials
    assert all(9 in t.intermediate_values for t in frozen)
    if final:  # a trial that trained all its epochs is complete and counts for the best
        assert [t.status for t in result.trials] == ["ok"] * 3 and result.best_trial is not None
        assert [t.state for t in frozen] == [TrialState.COMPLETE] * 3
    else:  # an objective that does not say which epoch is its last is pruned at that rung
        assert [t.status for t in result.trials] == ["pruned"] * 3


def test_a_fit_job_passes_on_which_epoch_is_final():
    job, seen = FitJob(), []
    job.bind(lambda epoch, logs, final: seen.append((epoch, final)) or False)
    assert not job.report(0, {}) and not job.report(1, {}, final=True)
    assert seen == [(0, False), (1, True)]


def test_a_pruned_trials_slot_goes_to_the_next_trial():
    started, lock = [], threading.Lock()

    def objective(params, job):
        with lock:
            started.append(params["x"])
        for epoch in range(50):
            if job.report(epoch, {"score": 1.0}):
                return {"score": 1.0}
            job.cancelled.wait(0.01)
        return {"score": 1.0}

    result = run_search(objective, SPACE, max_evals=4, parallelism=2, pruner=PruneAt({0, 1, 2, 3}, step=1), seed=0)
    assert [t.status for t in result.trials] == ["pruned"] * 4 and len(started) == 4
    assert all(t.epochs == 1 for t in result.trials)


def test_the_trial_table_says_each_state():
    def objective(params, job):
        if job.backup_dir is not None:
            raise AssertionError("no backups without a storage or artifacts_dir")
        number = len(calls)
        calls.append(number)
        if number == 1:
            raise RuntimeError("diverged")
        if number == 2:
            job.cancelled.wait(30)
            raise RuntimeError("cancelled")
        return stub_fit(3)(params, job)

    calls = []
    result = run_search(objective, SPACE, max_evals=4, pruner=PruneAt({3}, step=1), trial_timeout=0.5, seed=0)
    frame = result.to_pandas()
    assert list(frame["status"]) == ["ok", "failed", "timeout", "pruned"]
    assert list(frame["epochs"]) == [3, 0, 0, 1]
    assert list(frame.columns[:4]) == ["status", "score", "duration", "epochs"]
    assert frame.loc[1, "error"] == "RuntimeError: diverged"
    states = [t.state for t in result.study.trials]
    assert states == [TrialState.COMPLETE, TrialState.FAIL, TrialState.FAIL, TrialState.PRUNED]
    assert [t.user_attrs["elephant.status"] for t in result.study.trials] == ["ok", "failed", "timeout", "pruned"]


def test_hyperopt_algorithms_are_recorded_in_the_study_and_can_be_pruned():
    result = run_search(stub_fit(4), SPACE, max_evals=6, algo="tpe", pruner=PruneAt({2}, step=1), seed=3)
    assert [t.params["x"] for t in result.trials] == [t.params["x"] for t in result.study.trials]
    assert result.trials[2].status == "pruned"
    docs = {d["tid"]: d for d in result.hyperopt_trials.trials}
    assert sorted(docs) == list(range(6)) and docs[2]["result"]["loss"] == result.trials[2].score


def test_conditional_space_with_optuna_tpe():
    space = {"branch": hp.choice("branch", [{"x": hp.uniform("x", -2, 2)}, {"x": hp.uniform("x2", 0, 1)}])}
    result = run_search(lambda p, job: {"score": (p["branch"]["x"] - 0.5) ** 2}, space, max_evals=14, seed=0)
    assert len(result.trials) == 14 and all(t.status == "ok" for t in result.trials)
    for trial, frozen in zip(result.trials, result.study.trials):
        assert set(frozen.params) == ({"branch", "x"} if frozen.params["branch"] == 0 else {"branch", "x2"})


MIXED = {"x": hp.uniform("x", -2.0, 2.0), "lr": hp.loguniform("lr", np.log(1e-4), np.log(0.3)),
         "units": hp.choice("units", [16, 32, 64])}


@pytest.mark.parametrize("sampler", ["tpe", "random", "qmc", "cmaes", "gp", "nsga2"])
def test_every_optuna_sampler_runs_a_pruned_sweep_over_a_mixed_space_and_repeats_from_its_seed(sampler):
    if sampler == "cmaes":
        pytest.importorskip("cmaes")
    if sampler == "gp":
        pytest.importorskip("torch")
        pytest.importorskip("scipy")

    def objective(params, job):  # a learning curve whose floor depends on all three labels
        for epoch in range(4):
            value = curve(params["x"], epoch) + abs(np.log10(params["lr"]) + 2) + params["units"] / 640
            if job.report(epoch, {"score": value}):
                break
        return {"score": value}

    runs = [run_search(objective, MIXED, max_evals=10, sampler=sampler, pruner="asha", seed=0) for _ in range(2)]
    for result in runs:
        assert len(result.trials) == 10 and {t.status for t in result.trials} <= {"ok", "pruned"}
        assert "ok" in {t.status for t in result.trials}
        for t in result.trials:
            assert -2.0 <= t.params["x"] <= 2.0 and 1e-4 <= t.params["lr"] <= 0.3 and t.params["units"] in (16, 32, 64)
            assert t.epochs in ((4,) if t.status == "ok" else (1, 3))  # ASHA's rungs: 1 and 3 epochs
    assert [t.params for t in runs[0].trials] == [t.params for t in runs[1].trials]  # seeded, one at a time


def test_a_callable_space():
    def space(trial):
        return {"x": trial.suggest_float("x", -2, 2), "n": trial.suggest_int("n", 1, 3)}

    result = run_search(stub_fit(2), space, max_evals=5, sampler="random", seed=0)
    assert [t.status for t in result.trials] == ["ok"] * 5 and result.hyperopt_trials is None
    assert set(result.best_params) == {"x", "n"}
    with pytest.raises(ConfigError, match="hyperopt's algorithms need an hp space"):
        run_search(stub_fit(2), space, max_evals=1, algo="tpe")


# -------------------------------------------------------------------- resume
def _journal(path):
    return JournalStorage(JournalFileBackend(str(path)))


def _crash_mid_trial(path, epochs_done=1, backup_dir=None):
    """What a driver that died during a trial leaves in the journal: a RUNNING trial with its epochs so far."""
    study = optuna.load_study(study_name="elephant-search", storage=_journal(path))
    trial = study.ask()
    values = compile_space(SPACE)(trial)
    for step in range(1, epochs_done + 1):
        trial.report(curve(values["x"], step - 1), step)
    if backup_dir:
        trial.set_user_attr(BACKUP_DIR, backup_dir)
    return trial.number, values


def test_resume_keeps_finished_trials_and_retries_the_interrupted_one(tmp_path):
    path = tmp_path / "sweep.journal"
    first = run_search(stub_fit(3), SPACE, max_evals=3, pruner=PruneAt({1}, step=1), storage=str(path), seed=0)
    assert [t.status for t in first.trials] == ["ok", "pruned", "ok"]
    zombie, values = _crash_mid_trial(path, epochs_done=2, backup_dir=str(tmp_path / "trial-3"))

    dirs = {}

    def objective(params, job):
        dirs[params["x"]] = job.backup_dir
        return stub_fit(3)(params, job)

    second = run_search(objective, SPACE, max_evals=5, pruner=PruneAt({1}, step=1), storage=str(path), seed=1)
    frame = second.to_pandas()
    assert list(frame.index) == [0, 1, 2, 3, 4, 5]
    assert list(frame["status"]) == ["ok", "pruned", "ok", "failed", "ok", "ok"]
    assert frame.loc[3, "error"] == "interrupted: the driver stopped while it ran"
    retry = second.trials[4]
    assert retry.resumed_from == zombie and retry.params["x"] == values["x"]  # the same parameters again
    assert dirs[values["x"]] == str(tmp_path / "trial-3")  # it continues from the interrupted trial's backups
    assert second.trials[0].params == first.trials[0].params and second.trials[0].score == first.trials[0].score
    assert second.trials[1].epochs == 1
    assert len(dirs) == 2  # 3 earlier + the retry + 1 new = max_evals; the interrupted trial does not count

    # The journal is Optuna's own: its API reads every trial and the retry's replayed epochs.
    study = optuna.load_study(study_name="elephant-search", storage=_journal(path))
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.COMPLETE,
                                               TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert study.trials[3].user_attrs[INTERRUPTED] is True and study.trials[4].user_attrs[RESUMED_FROM] == zombie
    assert study.trials[4].intermediate_values == {1: curve(values["x"], 0), 2: curve(values["x"], 1),
                                                    3: curve(values["x"], 2)}

    third = run_search(stub_fit(3), SPACE, max_evals=5, storage=str(path), seed=2)  # nothing left to run
    assert len(third.trials) == 6 and third.best_score == second.best_score


@pytest.mark.parametrize("sampler", ["tpe", "random", "hyperopt-rand"])
def test_the_same_seeded_call_again_draws_fresh_points(tmp_path, sampler):
    """A driver killed and started again with the same seed must not train the first call's points again."""
    path = str(tmp_path / "sweep.journal")
    first = run_search(stub_fit(1), SPACE, max_evals=3, sampler=sampler, storage=path, seed=0)
    again = run_search(stub_fit(1), SPACE, max_evals=6, sampler=sampler, storage=path, seed=0)
    xs = [t.params["x"] for t in again.trials]
    assert xs[:3] == [t.params["x"] for t in first.trials] and len(set(xs)) == 6
    repeat = tmp_path / "repeat.journal"  # still reproducible: the derived seed depends on the seed and the study
    run_search(stub_fit(1), SPACE, max_evals=3, sampler=sampler, storage=str(repeat), seed=0)
    assert [t.params["x"] for t in run_search(stub_fit(1), SPACE, max_evals=6, sampler=sampler, storage=str(repeat),
                                              seed=0).trials] == xs


def test_resume_without_retry_only_marks_the_interrupted_trial_failed(tmp_path):
    path = tmp_path / "sweep.journal"
    run_search(stub_fit(2), SPACE, max_evals=1, storage=str(path), seed=0)
    zombie, _ = _crash_mid_trial(path)
    result = run_search(stub_fit(2), SPACE, max_evals=2, storage=str(path), retry_interrupted=False, seed=0)
    assert [(t.status, t.resumed_from) for t in result.trials] == [("ok", None), ("failed", None), ("ok", None)]


def test_an_sqlite_storage_resumes_too(tmp_path):
    url = f"sqlite:///{tmp_path / 'sweep.db'}"
    run_search(stub_fit(2), SPACE, max_evals=2, storage=url, seed=0)
    result = run_search(stub_fit(2), SPACE, max_evals=3, storage=url, study_name="elephant-search", seed=0)
    assert [t.status for t in result.trials] == ["ok"] * 3


@pytest.mark.parametrize(
    "change, match",
    [
        ({"space": {"x": hp.uniform("x", -3.0, 2.0)}}, r"study 'elephant-search' was made for another space: this "
                                                        r"space adds \['x: uniform\(-3.0, 2.0\)'\] and lacks "
                                                        r"\['x: uniform\(-2.0, 2.0\)'\]"),
        ({"metric": "loss"}, "study 'elephant-search' was made for metric='score', mode='min'; received "
                             "metric='loss', mode='min'"),
        ({"mode": "max"}, "received metric='score', mode='max'"),
    ],
)
def test_a_study_of_another_space_or_metric_is_refused(tmp_path, change, match):
    path = str(tmp_path / "sweep.journal")
    run_search(stub_fit(1), SPACE, max_evals=1, storage=path, seed=0)
    args = {"space": SPACE, "metric": "score", "mode": "min", **change}
    with pytest.raises(ConfigError, match=match):
        run_search(stub_fit(1), args.pop("space"), max_evals=2, storage=path, **args)


def test_a_study_not_made_by_elephant_is_refused(tmp_path):
    path = tmp_path / "other.journal"
    optuna.create_study(study_name="elephant-search", storage=_journal(path))
    with pytest.raises(ConfigError, match="study 'elephant-search' in this storage was not made by elephant's"):
        run_search(stub_fit(1), SPACE, max_evals=1, storage=str(path))


def test_artifacts_dir_gives_each_trial_a_backup_dir(tmp_path):
    dirs = []

    def objective(params, job):
        dirs.append(job.backup_dir)
        return {"score": params["x"]}

    run_search(objective, SPACE, max_evals=2, artifacts_dir=str(tmp_path / "art"), seed=0)
    assert dirs == [f"{tmp_path / 'art'}/trial-0", f"{tmp_path / 'art'}/trial-1"]


# --------------------------------------------------------------------- plots
@pytest.fixture(scope="module")
def swept():
    space = {"x": hp.uniform("x", -2.0, 2.0), "y": hp.uniform("y", 0.0, 1.0)}

    def objective(params, job):
        for epoch in range(3):
            value = curve(params["x"], epoch) + params["y"]
            if job.report(epoch, {"score": value}):
                break
        return {"score": value}

    return run_search(objective, space, max_evals=8, sampler="random", pruner=PruneAt({2}, step=1), seed=0)


@pytest.mark.parametrize("kind", ["history", "intermediate", "importances", "parallel", "slice", "contour",
                                  "timeline"])
def test_plots_write_png(swept, tmp_path, kind):
    import matplotlib.pyplot as plt

    figure = swept.plot(kind, path=tmp_path / f"{kind}.png")
    try:
        assert (tmp_path / f"{kind}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert figure.axes
    finally:
        plt.close(figure)


@pytest.mark.parametrize("kind", ["history", "intermediate", "timeline"])
def test_plotly_figures_are_written_as_interactive_pages(swept, tmp_path, kind):
    pytest.importorskip("plotly")
    figure = swept.plot(kind, path=tmp_path / f"{kind}.html", backend="plotly")
    page = (tmp_path / f"{kind}.html").read_text()
    assert "plotly" in page.lower() and figure.data  # a figure with traces, saved as a page
    assert type(figure).__module__.startswith("plotly")


def test_plot_errors(swept, monkeypatch):
    import sys

    from elephant.search.result import SearchResult

    with pytest.raises(ConfigError, match=r"`kind` must be one of \['history', 'intermediate', .*received kind='pie'"):
        swept.plot("pie")
    with pytest.raises(ConfigError, match="this SearchResult has no study to plot"):
        SearchResult([], "loss", "min", 0.0).plot()
    with pytest.raises(ConfigError, match=r"`backend` must be 'matplotlib' or 'plotly'; received backend='bokeh'"):
        swept.plot("history", backend="bokeh")
    monkeypatch.setitem(sys.modules, "plotly", None)
    with pytest.raises(ImportError, match=r"plot\('slice', backend='plotly'\) needs plotly: pip install plotly"):
        swept.plot("slice", backend="plotly")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"plot\('history'\) needs matplotlib: pip install 'elephant\[plots\]'"):
        swept.plot("history")


# ------------------------------------------------------- minimize's checks
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"sampler": "bayes"}, "Could not interpret sampler identifier: 'bayes'"),
        ({"pruner": "sha"}, "Could not interpret pruner identifier: 'sha'"),
        ({"storage": 3}, "`storage` must be None, a journal file path"),
        ({"retry_interrupted": "yes"}, "`retry_interrupted` must be True or False; received retry_interrupted='yes'"),
        ({"space": {"units": hp.normal("units", 8, 2)}}, r"label 'units': hp.normal\('units', 8, 2\) has no Optuna"),
    ],
)
def test_minimize_checks_the_new_arguments_before_spark(monkeypatch, kwargs, match):
    from elephant import search as S

    monkeypatch.setattr(S.session, "get_or_create", lambda: pytest.fail("Spark started before the checks"))

    def build(units):
        raise AssertionError("not built")

    args = {"space": {"units": hp.choice("u", [4, 8])}, **kwargs}
    x = np.zeros((4, 2), dtype="float32")
    with pytest.raises(ConfigError, match=match):
        minimize(build, args.pop("space"), x, np.zeros(4), max_evals=1, validation_split=0.5, **args)


def test_a_trial_interrupted_before_its_suggestions_is_retried_with_fresh_ones(tmp_path):
    path = tmp_path / "sweep.journal"
    run_search(stub_fit(1), SPACE, max_evals=1, storage=str(path), seed=0)
    optuna.load_study(study_name="elephant-search", storage=_journal(path)).ask()  # no label suggested yet
    result = run_search(stub_fit(1), SPACE, max_evals=2, storage=str(path), seed=0)
    assert [(t.status, t.params == {}) for t in result.trials] == [("ok", False), ("failed", True), ("ok", False)]
    assert result.trials[2].resumed_from == 1 and -2.0 <= result.trials[2].params["x"] <= 2.0
