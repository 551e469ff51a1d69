"""A real sweep on local Spark: a trial pruned at an epoch end, a driver stopped mid-trial, and the resume."""

import _thread
import threading

import numpy as np
import optuna
import pytest
from optuna.storages.journal import JournalFileBackend, JournalStorage
from optuna.trial import TrialState

from elephant.search import hp, minimize

from .test_search import small_model


class PruneAt(optuna.pruners.BasePruner):
    """Prunes the trials in ``numbers`` once they have reported ``step`` (epochs trained)."""

    def __init__(self, numbers, step):
        self.numbers, self.step = set(numbers), step

    def prune(self, study, trial):
        return trial.number in self.numbers and trial.last_step is not None and trial.last_step >= self.step


def _ps_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("elephant-ps")]


def test_pruned_trial_then_a_stopped_driver_resumes_from_the_trials_backup(spark, digits, tmp_path, monkeypatch):
    import keras

    from elephant.search.job import FitJob

    x_train, x_test, y_train, y_test = digits
    journal = str(tmp_path / "sweep.journal")
    space = {"units": hp.choice("units", [8, 16]), "lr": hp.loguniform("lr", np.log(3e-3), np.log(3e-2))}
    common = dict(metric="val_accuracy", mode="max", validation_data=(x_test, y_test), epochs=3, num_workers=1,
                  frequency="epoch", parallelism=1, max_evals=3, storage=journal, pruner=PruneAt({0}, step=1),
                  seed=0, verbose=0, spark=spark)
    epoch_ends, cancelled = [], threading.Event()
    cancel = FitJob.cancel
    monkeypatch.setattr(FitJob, "cancel", lambda job: (cancel(job), cancelled.set()))

    def stop_the_driver(epoch, logs):  # after trial 2's first epoch: Ctrl-C reaches the driver mid-trial
        if len(epoch_ends) == 5:
            _thread.interrupt_main()
            # the main thread sees the interrupt at its next poll; hold the trial here, before its second
            # epoch, until the driver has cancelled it, however fast that epoch would be
            assert cancelled.wait(timeout=60), "the driver did not cancel the running trial"

    watch = keras.callbacks.LambdaCallback(on_epoch_begin=stop_the_driver,
                                           on_epoch_end=lambda epoch, logs: epoch_ends.append(epoch))
    with pytest.raises(KeyboardInterrupt):
        minimize(small_model, space, x_train, y_train, callbacks=[watch], **common)
    assert not _ps_threads() and list(spark.sparkContext.statusTracker().getActiveJobsIds()) == []
    assert epoch_ends == [0, 0, 1, 2, 0]  # trial 0 stopped after its first epoch: pruned

    storage = JournalStorage(JournalFileBackend(journal))
    left = optuna.load_study(study_name="elephant-search", storage=storage)
    assert [t.state for t in left.trials] == [TrialState.PRUNED, TrialState.COMPLETE, TrialState.RUNNING]
    assert (tmp_path / "sweep-trials" / "trial-2").is_dir()  # its backup after one epoch

    result = minimize(small_model, space, x_train, y_train, **common)  # the same call again
    frame = result.to_pandas()
    assert list(frame["status"]) == ["pruned", "ok", "failed", "ok"], frame["error"].tolist()
    assert list(frame["epochs"]) == [1, 3, 1, 3]
    pruned, interrupted, retry = result.trials[0], result.trials[2], result.trials[3]
    assert pruned.score is not None and interrupted.error == "interrupted: the driver stopped while it ran"
    assert retry.resumed_from == 2 and retry.params == interrupted.params
    assert len(retry.history["val_accuracy"]) == 2  # it trained epochs 2 and 3 only, from the backup
    assert result.best_trial in (result.trials[1], retry) and result.best_model is result.best_trial.model
    assert not _ps_threads() and list(spark.sparkContext.statusTracker().getActiveJobsIds()) == []

    study = optuna.load_study(study_name="elephant-search", storage=storage)
    assert [t.state for t in study.trials] == [TrialState.PRUNED, TrialState.COMPLETE, TrialState.FAIL,
                                               TrialState.COMPLETE]
    assert sorted(study.trials[3].intermediate_values) == [1, 2, 3]  # epoch 1 replayed from the interrupted trial
