"""A trial's handle: one cancellable elephant fit that reports its epoch ends to the search.

Used by :mod:`elephant.search.engine` for trials and by :mod:`elephant.ensemble`
for members: each fit runs in its own driver thread and Spark job group.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import wait
from typing import Any

from elephant import session
from elephant.errors import ElephantError

__all__ = ["BUILD_LOCK", "POLL_S", "FitJob", "cancel_all"]

POLL_S = 0.2  # how often the driver checks deadlines and re-cancels late trials
BUILD_LOCK = threading.Lock()  # build_fn and SparkModel construction run one thread at a time


class FitJob:
    """Handle of one trial; with ``spark``, one cancellable elephant fit.

    :meth:`fit` sets the job group in the thread that runs it (groups are per
    thread in PySpark's pinned-thread mode); from a Spark Connect client it adds
    a tag of that name instead (tags are per thread too), and :meth:`cancel`
    interrupts the tag's operations. :meth:`cancel` works from any thread
    and is repeated by the caller (a job started after a cancel needs another);
    the fit also stops at its next epoch edge. :meth:`report` is called at each
    epoch end (by the fit's last callback, or by a stub objective): once the
    search's pruner says stop, ``pruned_at`` holds the epoch and the fit ends
    there; the fit's last epoch is reported with ``final=True`` and never
    pruned. ``backup_dir``, set by the search, is where the trial's epoch
    backups go (None: no backups).
    """

    def __init__(self, spark=None, label: str = "job"):
        self.cancelled = threading.Event()
        self.spark = spark
        self.group = f"elephant-{label}-{uuid.uuid4().hex[:8]}"
        self.sm = None
        self.pruned_at: int | None = None
        self.backup_dir: str | None = None
        self._report: Callable[[int, Mapping[str, Any], bool], bool] | None = None

    def bind(self, report: Callable[[int, Mapping[str, Any], bool], bool]) -> None:
        """Send epoch ends to ``report(epoch, logs, final)``, which answers whether the trial is pruned."""
        self._report = report

    def report(self, epoch: int, logs: Mapping[str, Any], final: bool = False) -> bool:
        """The epoch ``epoch`` (0-based) ended with ``logs``: True when the trial should stop here (pruned).

        ``final``: it was the fit's last epoch, so the trial is complete
        whatever the pruner would say (stopping it saves nothing).
        """
        if self._report is None or self.pruned_at is not None:
            return self.pruned_at is not None
        if self._report(epoch, logs, final):
            self.pruned_at = epoch
        return self.pruned_at is not None

    def cancel(self) -> None:
        """Stop the trial's Spark work: its job groups (classic) or the operations of its tags (Spark Connect)."""
        self.cancelled.set()
        if self.spark is None:
            return
        groups = [self.group] + ([self.sm.job_group] if self.sm is not None and self.sm.job_group else [])
        if session.is_connect(self.spark):
            for tag in groups:
                self.spark.interruptTag(tag)
        else:
            for group in groups:
                self.spark.sparkContext.cancelJobGroup(group)

    def check(self) -> None:
        if self.cancelled.is_set():
            raise ElephantError(f"{self.group} was cancelled by the driver (time limit or failure elsewhere)")

    def fit(self, make_model: Callable[[], Any], settings: Mapping[str, Any], x, y, fit_kwargs: Mapping[str, Any]):
        """Build the model (under :data:`BUILD_LOCK`), wrap it in a SparkModel and fit; ``(sm, history)``."""
        import keras

        from elephant.spark_model import SparkModel

        job, connect = self, session.is_connect(self.spark)

        class StopWhenCancelled(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                job.check()

            on_epoch_end = on_epoch_begin

        last = int(fit_kwargs.get("epochs", 1)) - 1

        class ReportEpoch(keras.callbacks.Callback):  # last: after validation and the user's callbacks
            def on_epoch_end(self, epoch, logs=None):
                if job.report(epoch, dict(logs or {}), final=epoch >= last):
                    self.model.stop_training = True  # the fit's finally releases its jobs, server and blocks

        if connect:  # a Connect client's tags belong to the thread that adds them, as job groups do
            self.spark.addTag(self.group)
        else:
            self.spark.sparkContext.setJobGroup(self.group, f"elephant {self.group}", interruptOnCancel=True)
        try:
            self.check()
            with BUILD_LOCK:
                self.sm = SparkModel(make_model(), spark=self.spark, **settings)
            kwargs = dict(fit_kwargs)
            callbacks = [copy.deepcopy(c) for c in kwargs.pop("callbacks", None) or []]  # one set per fit
            if self.backup_dir is not None and not any(isinstance(c, keras.callbacks.BackupAndRestore)
                                                       for c in callbacks):
                callbacks.append(keras.callbacks.BackupAndRestore(self.backup_dir))
            callbacks += [StopWhenCancelled()] + ([ReportEpoch()] if self._report is not None else [])
            history = self.sm.fit(x, y, callbacks=callbacks, verbose=0, **kwargs)
            self.check()
            return self.sm, history
        finally:
            if connect:
                self.spark.removeTag(self.group)
            else:
                self.spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)


def cancel_all(jobs, futures) -> None:
    """Cancel ``jobs`` every 0.2 s until every future is done."""
    while not all(f.done() for f in futures):
        for job in jobs:
            job.cancel()
        wait(futures, timeout=POLL_S)


