"""The course of a fit whose epochs run as one Spark job: what its tasks train next, and what they report.

A fit trained as one job (:mod:`elephant.fit.resident`) keeps its tasks alive
from epoch to epoch. Between two epochs the driver runs Keras' callbacks and
validation, then opens the next epoch here with what changed in the tasks'
spec (the epoch, the learning rate a callback set, a re-decided window);
each task waits for it (:meth:`Course.next`, which the server's ``/course``
route answers), trains, and reports its partition's stats with its finish
(:meth:`Course.report`); the driver waits for every report of the epoch
(:meth:`Course.wait_reports`). Closing the course ends the tasks.

Reports are kept per ``(run, epoch)``: a try rolled back under a new run id
(:meth:`~elephant.ps.store.Store.rollback`) never mixes its reports with the
next try's. Like the store, the course does no HTTP and no Spark: it is a
condition variable over a few dicts.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from elephant.errors import ProtocolError

__all__ = ["Course", "CLOSED", "WAIT_S"]

#: What :meth:`Course.next` returns once the course is closed: the task ends.
CLOSED = {"closed": True}
#: Seconds a task's request for the next epoch waits before it is answered "ask again".
WAIT_S = 5.0


class Course:
    """The epochs the driver opens for a fit's tasks and the stats the tasks report back.

    Args:
        num_workers: the partitions whose report completes an epoch.
    """

    def __init__(self, num_workers: int):
        self._num_workers = int(num_workers)
        self._cond = threading.Condition()
        self._opened: dict[int, dict[str, Any]] = {}  # the epoch open now -> the changes its tasks train with
        self._reports: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
        self._closed = False
        self._failure: BaseException | None = None
        self._job = 0  # the job whose tasks train now (restart); a task of an earlier one is told to end

    def open(self, epoch: int, changes: dict[str, Any]) -> None:
        """Open ``epoch``: the tasks waiting after an earlier one train it with ``changes`` to their spec."""
        with self._cond:
            self._opened = {int(epoch): dict(changes, epoch=int(epoch))}  # a retry opens an epoch again
            self._failure = None
            self._cond.notify_all()

    def restart(self, job: int = 0) -> None:
        """Start over for a new ``job``: no epoch opened, no failure, not closed (reports of earlier tries stay apart
        under their run ids). A task of an earlier job that still asks (Spark ends a failed barrier stage's other
        tasks only when they return) is told the course is closed, so it ends and frees its task slot."""
        with self._cond:
            self._opened, self._closed, self._failure, self._job = {}, False, None, int(job)
            self._cond.notify_all()

    def close(self) -> None:
        """End the course: every waiting and later :meth:`next` returns :data:`CLOSED`."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        """The job failed: wake :meth:`wait_reports`, which raises ``exc``."""
        with self._cond:
            self._failure = exc
            self._cond.notify_all()

    def next(self, epoch: int, timeout: float, job: int | None = None) -> dict[str, Any] | None:
        """The epoch the driver waits for, once it is ``epoch`` or later (its changes, with ``epoch``), :data:`CLOSED`,
        or None if ``timeout`` seconds passed first (the task asks again). A task Spark started again (a retried
        stage) that asks for its job's first epoch gets the epoch being trained, never one the fit has done. A task
        of another ``job`` than the one :meth:`restart` started gets :data:`CLOSED` (None: any job)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed or (job is not None and job != self._job):
                    return CLOSED
                current = max(self._opened, default=-1)
                if current >= epoch:
                    return dict(self._opened[current])
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def report(self, run: str, epoch: int, partition: int, stats: dict[str, Any]) -> None:
        """``partition`` has trained ``epoch`` of ``run`` (its try): these are its stats.

        Raises:
            ProtocolError: ``partition`` is not one of the fit's.
        """
        if not 0 <= partition < self._num_workers:
            raise ProtocolError(f"partition must be in [0, {self._num_workers}); received partition={partition!r}")
        with self._cond:
            self._reports.setdefault((run, int(epoch)), {})[int(partition)] = stats
            self._cond.notify_all()

    def wait_reports(self, run: str, epoch: int, poll: float = 0.5) -> list[dict[str, Any]]:
        """Every partition's stats of ``epoch`` of ``run``, in partition order, once all have reported.

        Waits ``poll`` seconds at a time, so that Ctrl-C reaches the calling thread.

        Raises:
            BaseException: what :meth:`fail` was given (the job failed first).
        """
        key = (run, int(epoch))
        with self._cond:
            while True:
                if self._failure is not None:
                    raise self._failure
                got = self._reports.get(key, {})
                if len(got) == self._num_workers:
                    self._reports.pop(key)
                    return [got[p] for p in sorted(got)]
                self._cond.wait(poll)
