"""The examples run as the README says, in this test session's Spark (no second session)."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name, argv, capsys, monkeypatch):
    from elephant.optimizers import registry as registry_module

    # an example may register its own rule; keep the registry of the other tests as it was
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))
    monkeypatch.setattr(registry_module, "_ALIASES", dict(registry_module._ALIASES))
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
    module.main()
    return capsys.readouterr().out


def number(pattern, text):
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in the example's output:\n{text}"
    return float(match.group(1))


@pytest.mark.parametrize("mode", ["asynchronous", "synchronous"])
def test_digits_example_reaches_95_percent_in_20_epochs(spark, capsys, monkeypatch, mode):
    out = run_example("digits_mlp", ["--mode", mode], capsys, monkeypatch)  # the README's command: 20 epochs
    assert f"elephant {mode}/default: 20 epochs" in out
    assert number(r"test accuracy (\d\.\d+)", out) >= 0.95


def test_diabetes_example_beats_the_mean_predictor(spark, capsys, monkeypatch):
    out = run_example("diabetes_regression", [], capsys, monkeypatch)
    assert number(r"test R\^2 (-?\d\.\d+)", out) > 0.2


def test_dataframe_example(spark, capsys, monkeypatch):
    out = run_example("dataframe_fit", [], capsys, monkeypatch)
    assert number(r"DataFrame fit: test accuracy (\d\.\d+)", out) >= 0.9


def test_custom_optimizer_example(spark, capsys, monkeypatch):
    out = run_example("custom_optimizer", [], capsys, monkeypatch)
    assert number(r"StaleClip on Spark: .* test accuracy (\d\.\d+)", out) >= 0.9
    assert number(r"simulate StaleClip\(.*\): \|center - 3\| = (\S+) after", out) < 0.1


def test_search_example_prints_trials_and_the_ensemble(spark, capsys, monkeypatch):
    out = run_example("search_digits", [], capsys, monkeypatch)
    assert "search of 8 trials with parallelism=2" in out
    best = number(r"best single model (\d\.\d+)", out)
    ensemble = number(r"top-3 mean ensemble (\d\.\d+)", out)
    assert best >= 0.9 and ensemble >= 0.9


# MLflow's SQLAlchemy store, as in tests/unit/test_search_mlflow.py
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")
@pytest.mark.filterwarnings("ignore:The number of trials is too small to compute importances")  # 4-6 trials here
# with most of the 6 trials pruned (which depends on the order concurrent trials report in) optuna's
# importance evaluator warns that its quantiles pick the same trials; the figure is still written
@pytest.mark.filterwarnings("ignore:Target and region quantiles select the same set of trials")
def test_pruned_sweep_example_continues_when_run_again_and_logs_each_trial_to_mlflow(spark, capsys, monkeypatch,
                                                                                     tmp_path):
    import mlflow
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    folder = str(tmp_path / "sweep")
    out = run_example("sweep_pruned_mlflow", ["--dir", folder, "--evals", "4", "--epochs", "3"], capsys, monkeypatch)
    assert number(r"val accuracy (\d\.\d+)", out) >= 0.8
    journal = JournalStorage(JournalFileBackend(f"{folder}/sweep.journal"))
    first = {t.number: t.datetime_start for t in optuna.load_study(study_name=None, storage=journal).trials}
    assert len(first) == 4

    run_example("sweep_pruned_mlflow", ["--dir", folder, "--evals", "6", "--epochs", "3"], capsys, monkeypatch)
    trials = optuna.load_study(study_name=None, storage=journal).trials
    assert len(trials) == 6 and {t.number: t.datetime_start for t in trials[:4]} == first  # none run again
    assert {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"} and "COMPLETE" in {t.state.name for t in trials}
    for kind in ("history", "intermediate", "timeline", "importances"):
        assert (tmp_path / "sweep" / f"{kind}.png").stat().st_size > 1000

    client = mlflow.MlflowClient(f"sqlite:///{folder}/mlflow.db")
    experiment = client.get_experiment_by_name("digits-sweep")
    runs = client.search_runs([experiment.experiment_id])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 6 and len(runs) == 7  # one parent for both calls
    state = {str(t.number): t.state.name for t in trials}
    for run in children:  # per-epoch metrics: 3 epochs when complete, 1 when pruned at ASHA's first rung
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "val_accuracy"))
        assert steps == ([1, 2, 3] if state[run.data.tags["elephant.trial"]] == "COMPLETE" else [1]), steps
