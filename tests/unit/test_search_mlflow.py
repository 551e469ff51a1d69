"""MLflow runs of a search with stub fits: a parent run, one child per trial, epochs as steps, end states."""

from __future__ import annotations

import optuna
import pytest

from elephant.errors import ConfigError
from elephant.search import hp, run_search
from elephant.search.tracking import MlflowTracker, flatten, tracking_uri_for

mlflow = pytest.importorskip("mlflow")

# MLflow's SQLite store uses a SQLAlchemy loader strategy that SQLAlchemy 2.1 deprecates.
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")

SPACE = {"x": hp.uniform("x", -2.0, 2.0), "net": hp.choice("net", [{"units": 8}, {"units": 16}])}


def test_arguments_and_defaults(tmp_path):
    assert tracking_uri_for(str(tmp_path / "runs" / "sweep.journal")) == f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    assert tracking_uri_for(f"sqlite:///{tmp_path / 's.db'}") == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert flatten({"a": 1, "b": {"c": "x" * 600}}) == {"a": "1", "b.c": "x" * 500}
    with pytest.raises(ConfigError, match=r"`mlflow` must be False, True, a tracking URI or a dict with keys "
                                          r"\['tracking_uri', 'experiment', 'log_model'\]; received mlflow=3"):
        MlflowTracker.from_argument(3)
    with pytest.raises(ConfigError, match="received mlflow={'experiment_name': 'x'}"):
        MlflowTracker.from_argument({"experiment_name": "x"})


def test_parent_and_child_runs_with_epochs_and_end_states(tmp_path):
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])

    def objective(params, job):
        number = len(calls)
        calls.append(number)
        if number == 1:
            raise RuntimeError("diverged")
        for epoch in range(3):
            value = (params["x"] - 0.5) ** 2 + 1 / (epoch + 1)
            if job.report(epoch, {"score": value, "loss": value, "note": "text"}):
                break
        return {"score": value, "model": model}

    class PruneSecondOk(optuna.pruners.BasePruner):
        def prune(self, study, trial):
            return trial.number == 2 and trial.last_step == 1

    calls = []
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MlflowTracker.from_argument({"tracking_uri": uri, "experiment": "sweeps"})
    result = run_search(objective, SPACE, max_evals=3, pruner=PruneSecondOk(), seed=0, tracker=tracker)
    assert [t.status for t in result.trials] == ["ok", "failed", "pruned"]

    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("sweeps")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    parent = runs["elephant-search"]
    assert parent.info.status == "FINISHED" and parent.data.tags["elephant.best_trial"] == "0"
    assert parent.data.metrics["best_score"] == result.best_score
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "best_model")] == ["best_model/model.keras"]
    children = [runs[f"trial-{n}"] for n in range(3)]
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    assert [c.info.status for c in children] == ["FINISHED", "FAILED", "KILLED"]
    assert children[1].data.tags["elephant.error"] == "RuntimeError: diverged"
    assert children[0].data.params["x"] == str(result.trials[0].params["x"])
    assert "net.units" in children[0].data.params
    history = client.get_metric_history(children[0].info.run_id, "loss")
    assert [m.step for m in history] == [1, 2, 3] and "note" not in children[0].data.metrics
    assert [m.step for m in client.get_metric_history(children[2].info.run_id, "score")] == [1]
    assert result.study.trials[0].user_attrs["elephant.mlflow_run_id"] == children[0].info.run_id


def test_a_resumed_search_reuses_its_parent_and_kills_the_interrupted_run(tmp_path):
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    journal = str(tmp_path / "sweep.journal")
    tracker = MlflowTracker.from_argument(True, storage=journal)
    run_search(lambda p, job: {"score": p["x"]}, SPACE, max_evals=1, storage=journal, seed=0, tracker=tracker)
    study = optuna.load_study(study_name="elephant-search", storage=JournalStorage(JournalFileBackend(journal)))
    zombie = study.ask()  # a driver that died with this trial running, its child run open
    zombie.suggest_float("x", -2.0, 2.0)
    zombie.suggest_categorical("net", [0, 1])
    run = tracker.client.create_run(tracker.experiment_id, run_name="trial-1",
                                    tags={"mlflow.parentRunId": tracker.parent})
    zombie.set_user_attr("elephant.mlflow_run_id", run.info.run_id)

    again = MlflowTracker.from_argument(True, storage=journal)
    result = run_search(lambda p, job: {"score": p["x"]}, SPACE, max_evals=2, storage=journal, seed=0, tracker=again)
    assert [t.status for t in result.trials] == ["ok", "failed", "ok"]
    assert again.parent == tracker.parent
    client = mlflow.MlflowClient(tracking_uri=tracking_uri_for(journal))
    assert client.get_run(run.info.run_id).info.status == "KILLED"
    assert client.get_run(again.parent).info.status == "FINISHED"
    names = sorted(r.info.run_name for r in client.search_runs([again.experiment_id]))
    assert names == ["elephant-search", "trial-0", "trial-1", "trial-2"]
