"""elephant.fit.epoch.run_epoch: an epoch's Spark job as a transaction, with a fake job and a real store."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from elephant.config import Settings
from elephant.errors import DataError, FitError
from elephant.fit.epoch import run_epoch
from elephant.optimizers import Commit, Downpour, ModelAveraging
from elephant.ps.store import CommitKey, Store
from elephant.worker import TaskSpec

RUN = "r1"


class FakeModel:
    def __init__(self):
        self.weights = None

    def set_weights(self, weights):
        self.weights = [np.array(w) for w in weights]


class SparkJobFailed(Exception):
    """Stands for a Py4JJavaError: the task's error as text."""


def spec(epoch=0):
    return TaskSpec(run=RUN, epoch=epoch, model_bytes=b"", fingerprint="", optimizer=Downpour(), window=None,
                    batch_size=8, mode="asynchronous", ps_url="", token="", read_timeout=1.0)


def store(mode="asynchronous"):
    rule = Downpour() if mode == "asynchronous" else ModelAveraging()
    return Store([np.zeros(3)], rule, mode, 2, RUN)


def commit(s: Store, run: str, partition: int, value: float):
    s.commit(CommitKey(run, 0, partition, 0), 0, Commit(tensors=[np.full(3, value)], num_steps=1, num_samples=1,
                                                        base_clock=s.clock))


class Job:
    """Commits once per try, then fails ``failures`` times with ``cause``, then returns stats."""

    def __init__(self, s: Store, failures: int, cause: str = "RuntimeError: executor lost"):
        self.s, self.failures, self.cause = s, failures, cause
        self.tries: list[tuple[str, str]] = []  # (the spec's commit run, the job's description)

    def __call__(self, spec: TaskSpec, text: str):
        self.tries.append((spec.commit_run, text))
        commit(self.s, spec.commit_run, len(self.tries) % 2, 1.0)
        if len(self.tries) <= self.failures:
            raise SparkJobFailed(f"Job aborted.\nTraceback ...\n{self.cause}\n")
        return [{"partition": 0, "samples": 4}]


def run(s, job, barrier, **settings):
    return run_epoch(s, job, spec(), epochs=3, barrier=barrier, settings=Settings(**settings), model=FakeModel())


def test_a_successful_job_is_one_try_and_its_stats_are_returned():
    s = store()
    job = Job(s, failures=0)
    assert run(s, job, barrier=False) == [{"partition": 0, "samples": 4}]
    assert job.tries == [(RUN, f"elephant fit {RUN}: epoch 1 of 3")]
    assert s.clock == 1


def test_a_failed_barrier_epoch_is_rolled_back_and_trained_again_under_a_new_run():
    s = store()
    job = Job(s, failures=2)
    assert run(s, job, barrier=True, epoch_retries=2) == [{"partition": 0, "samples": 4}]
    assert [r for r, _ in job.tries] == [RUN, f"{RUN}.e0t1", f"{RUN}.e0t2"]
    assert job.tries[2][1].endswith(", try 3")
    assert s.clock == 1 and np.allclose(s.center()[0], 1.0)  # only the last try's commit is in the center


def test_retries_run_out_with_a_fit_error_and_the_center_at_the_epochs_start():
    s = store()
    with pytest.raises(FitError, match=r"epoch 1 of 3 failed in Spark 2 times: RuntimeError: executor lost\. "
                                       r"The fit stopped: the epoch was rolled back \(1 commits undone"):
        run(s, Job(s, failures=5), barrier=True, epoch_retries=1)
    assert s.clock == 0 and np.allclose(s.center()[0], 0.0)


def test_an_asynchronous_epoch_is_rolled_back_but_not_retried():
    s = store()
    job = Job(s, failures=1)
    with pytest.raises(FitError, match="failed in Spark: RuntimeError"):
        run(s, job, barrier=False)
    assert len(job.tries) == 1 and s.clock == 0 and s.run == f"{RUN}.e0t1"


def test_a_data_error_in_a_task_is_not_retried():
    s = store()
    job = Job(s, failures=1, cause="elephant.errors.DataError: label 7 is out of range")
    with pytest.raises(FitError, match="DataError: label 7 is out of range"):
        run(s, job, barrier=True, epoch_retries=3)
    assert len(job.tries) == 1


def test_on_failure_keep_gives_the_model_the_partial_center_and_rolls_nothing_back():
    s, model = store(), FakeModel()
    with pytest.raises(FitError, match="on_failure='keep'"):
        run_epoch(s, Job(s, failures=1), spec(), epochs=3, barrier=True, settings=Settings(on_failure="keep"),
                  model=model)
    assert s.clock == 1 and s.run == RUN
    assert np.allclose(model.weights[0], 1.0)


def test_an_elephant_error_raised_on_the_driver_passes_through_untouched():
    s = store()

    def job(spec, text):
        raise DataError("the driver's own check")

    with pytest.raises(DataError, match="the driver's own check"):
        run(s, job, barrier=True)
    assert s.run == RUN  # no rollback


def test_an_interrupted_job_raises_keyboard_interrupt_without_a_rollback():
    s, interrupted = store(), threading.Event()

    def job(spec, text):
        commit(s, spec.commit_run, 0, 1.0)
        interrupted.set()  # Ctrl-C cancelled the job group, so the job failed
        raise SparkJobFailed("Job 3 cancelled")

    with pytest.raises(KeyboardInterrupt):
        run_epoch(s, job, spec(), epochs=3, barrier=True, settings=Settings(), model=FakeModel(),
                  interrupted=interrupted)
    assert s.clock == 1 and s.run == RUN
