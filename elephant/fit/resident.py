"""A fit whose epochs run as one Spark job: the tasks keep their replica, optimizer state and data between epochs.

A job per epoch pays, every epoch, Spark's launch and return of a stage, each
task's set-up (its spec unpickled, its replica found, its optimizer state
read from the executor's files) and the read of its partition from the
cache. Where every worker can run at once (the job is one barrier stage) and
each task can hold its partition (numpy shards, or a partition of at most
half its shuffle buffer's samples, so that the partition held and the
buffer's shuffled copy stay within the buffer's bytes), the fit runs its
epochs as one job instead:

1. the driver starts the job (:class:`ResidentJob`) on a thread of its own,
   with the first epoch's :class:`~elephant.worker.TaskSpec`;
2. each task (:func:`train_resident`) waits for the next epoch the driver
   opens on the server's :class:`~elephant.ps.course.Course`, trains it as
   a task of that epoch would (:func:`~elephant.worker.run_partition`, the
   blocks it read the first time, :class:`HeldBlocks`), and reports its
   stats with its finish;
3. between epochs the driver runs what it runs after an epoch's job:
   the center into the model, validation, every Keras callback in order,
   then opens the next epoch with what changed (:data:`EPOCH_FIELDS`: a
   learning rate a callback set, a re-decided window...); closing the
   course ends the tasks and the job. Where no callback can change the
   next epoch (:func:`overlaps_validation`), the driver opens it before
   it validates the epoch that ended, so the tasks train while it
   validates (:meth:`ResidentJob.open_ahead`).

The epoch stays a transaction (:func:`~elephant.fit.epoch.run_epoch`): a task
that fails fails the barrier stage, the job's failure reaches the driver as
the epoch's, the store is rolled back to the epoch's start and a new job
starts from that epoch. Where the conditions do not hold (:func:`why_not`),
the fit runs a job per epoch, as it always could.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from elephant import session
from elephant.ps.course import CLOSED, Course
from elephant.worker import TaskSpec

log = logging.getLogger(__name__)

__all__ = ["EPOCH_FIELDS", "ONE_JOB", "OVERLAP_VALIDATION", "PASSIVE_CALLBACKS", "HeldBlocks", "ResidentJob",
           "epoch_changes", "overlaps_validation", "starved_jobs", "train_resident", "why_not"]

#: Whether a fit whose conditions allow it (:func:`why_not`) runs its epochs as one job (True, the default) or a job
#: per epoch (False). A module setting, not a fit argument: it changes how the epochs are launched, never what they
#: train; a job per epoch is kept to compare against and for Spark's own retry of a failed task.
ONE_JOB = True

#: Whether a fit run as one job opens its next epoch before the driver validates the epoch that ended, where nothing
#: the user passed can change the next epoch (:func:`overlaps_validation`): the tasks train while the driver validates.
OVERLAP_VALIDATION = True

#: Keras' callbacks that only read the model and the logs at an epoch's end (the exact classes, not subclasses): with
#: none but these, what the driver does between two epochs cannot change the next one.
PASSIVE_CALLBACKS = ("History", "ProgbarLogger", "CSVLogger", "ModelCheckpoint", "TensorBoard", "RemoteMonitor")

#: The fields of a :class:`~elephant.worker.TaskSpec` that may change from one epoch of a fit to the next: what the
#: driver opens each epoch with. A spec that differs from the job's in any other field needs a new job.
EPOCH_FIELDS = ("epoch", "window", "learning_rate", "last_epoch", "learning_rate_warmup", "warmup_window",
                "skip_steps", "resume_steps")


def epoch_changes(spec: TaskSpec) -> dict[str, Any]:
    """What an epoch's tasks train with beyond the job's first spec: its :data:`EPOCH_FIELDS`, as JSON values."""
    changes = {name: getattr(spec, name) for name in EPOCH_FIELDS}
    changes["resume_steps"] = list(spec.resume_steps)
    return changes


def applied(spec: TaskSpec, changes: dict[str, Any]) -> TaskSpec:
    """``spec`` as the epoch ``changes`` open it (each epoch with a fresh copy of the distributed optimizer, as a
    task of its own would unpickle)."""
    known = {name: changes[name] for name in EPOCH_FIELDS if name in changes}
    known["resume_steps"] = tuple(known.get("resume_steps", ()))
    return dataclasses.replace(spec, optimizer=copy.deepcopy(spec.optimizer), **known)


def same_job(running: TaskSpec, spec: TaskSpec) -> bool:
    """Whether the job started with ``running`` can train ``spec``'s epoch (they differ in :data:`EPOCH_FIELDS`
    at most)."""
    return dataclasses.replace(running, **{name: getattr(spec, name) for name in EPOCH_FIELDS}) == spec


def why_not(*, hosted: bool, shards: int, slots: int, num_workers: int, coalesced: bool, in_memory: bool,
            partition_samples: Sequence[int], buffer: int | None, spark_validation: bool = False) -> str | None:
    """Why a fit's epochs cannot run as one job (the fit then runs a job per epoch), or None where they can.

    Args:
        hosted: the server runs in the epochs' tasks (``ps_placement="executors"``).
        shards: the parameter server's shards.
        slots: the cluster's task slots.
        num_workers: the fit's workers (tasks at once).
        coalesced: the data were coalesced to ``num_workers`` partitions (Spark runs no barrier stage over them).
        in_memory: the tasks' data are numpy shards shipped to them (held anyway).
        partition_samples: each partition's samples.
        buffer: the samples of a task's shuffle buffer (None: a whole partition).
        spark_validation: ``validation_data`` in Spark, evaluated by a Spark job after each epoch (which the fit's
            own tasks, holding the cluster's slots, would keep waiting).
    """
    if not ONE_JOB:
        return "elephant.fit.resident.ONE_JOB is False"
    if hosted:
        return "the parameter server runs in each epoch's tasks (ps_placement='executors')"
    if shards > 1:
        return f"the parameter server is split into {shards} shards"
    if slots < num_workers:
        return f"the cluster's {slots} task slots cannot run the {num_workers} workers at once"
    if coalesced:
        return "the data's partitions were coalesced, and Spark runs no barrier stage over them"
    if spark_validation:
        return "validation_data in Spark is evaluated by a Spark job of its own after each epoch"
    largest = max(partition_samples, default=0)
    if not in_memory and buffer is not None and 2 * largest > buffer:
        return (f"a partition ({largest} samples) is larger than half a task's shuffle buffer ({buffer} samples), "
                "so a task cannot hold it beside the buffer: each epoch streams it again from Spark's cache")
    return None


def overlaps_validation(callbacks: Sequence[Any] | None, inside_saves: bool) -> str | None:
    """Why the driver's validation of an epoch cannot overlap the next epoch's training, or None where it can.

    It can where the next epoch is decided before the validation: every callback the user passed is one of
    Keras' :data:`PASSIVE_CALLBACKS` (a callback of any other kind may set the learning rate, stop the fit or read
    the server), and no backup is written inside the epochs (``BackupAndRestore(save_freq=N)``)."""
    if not OVERLAP_VALIDATION:
        return "elephant.fit.resident.OVERLAP_VALIDATION is False"
    if inside_saves:
        return "BackupAndRestore saves inside the epochs"
    for callback in callbacks or ():
        kind = type(callback)
        if not (kind.__module__.startswith("keras.") and kind.__name__ in PASSIVE_CALLBACKS):
            return f"the callback {kind.__name__} may change the next epoch"
    return None


class HeldBlocks:
    """A partition's blocks: read from Spark's iterator on the first pass, and kept for the passes after it."""

    def __init__(self, blocks: Iterable[tuple]):
        self._source: Iterator[tuple] | None = iter(blocks)
        self._held: list[tuple] = []

    def blocks(self) -> Iterator[tuple]:
        """This pass's blocks, in the partition's order."""
        yield from self._held  # every block after the first pass; before, what a pass that stopped early read
        if self._source is not None:
            for block in self._source:
                self._held.append(block)
                yield block
            self._source = None

    def complete(self) -> None:
        """Read what a pass left unread (it stopped early), so the next pass sees the whole partition."""
        if self._source is not None:
            self._held.extend(self._source)
            self._source = None


def train_resident(spec: TaskSpec, partition: int, attempt: int, blocks: Iterable[tuple], client,
                   cores: int, job: int | None = None) -> int:
    """One task of a fit run as one job (the course's ``job``): every epoch the driver opens on the course, until
    it closes it, or starts another job.

    Returns the epochs trained.
    """
    from elephant import worker

    held = HeldBlocks(blocks)
    epoch, trained = spec.epoch, 0
    while True:
        opened = client.next_epoch(epoch, job)
        if opened == CLOSED:
            return trained
        here = applied(spec, opened)
        worker.run_partition(here, partition, attempt, held.blocks(), client, cores, report=True)
        held.complete()
        epoch, trained = here.epoch + 1, trained + 1


def _job(rdd, spec: TaskSpec, job: int):
    """The Spark job of a fit run from ``spec``'s epoch on: one barrier stage, a task per partition, whose tasks
    ask the course for the epochs of ``job`` (its generation)."""
    def task(iterator):
        from pyspark import BarrierTaskContext

        from elephant.ps.shard_client import connect_shards

        ctx = BarrierTaskContext.get()
        with connect_shards(spec.shard_urls, spec.token, spec.shard_plan, read_timeout=spec.read_timeout) as client:
            yield train_resident(spec, ctx.partitionId(), ctx.taskAttemptId(), iterator, client, ctx.cpus(), job)

    return rdd.barrier().mapPartitions(task)


class ResidentJob:
    """The driver's side of a fit run as one job: the job on a thread, the course it trains through.

    ``job(spec, description)`` is the epoch's job function for :func:`~elephant.fit.epoch.run_epoch`: it starts
    a job where none runs (the fit's first epoch, or the one after a failed try), opens ``spec``'s epoch and
    returns the partitions' stats once each has reported them. A failed job raises its error there.

    The job's tasks hold their task slots for the whole fit. So that another Spark job never waits on them for
    long (one a callback runs between epochs would wait forever), a watcher polls Spark's status tracker every
    ``poll`` seconds: once another job has waited ``starved_s`` seconds without a running task, the tasks end
    at the next epoch's boundary (at once, between epochs) and the next epoch starts a new job.
    """

    def __init__(self, sc, rdd, course: Course, poll: float = 0.5, starved_s: float = 1.0):
        self.sc, self.rdd, self.course = sc, rdd, course
        self.poll, self.starved_s = poll, starved_s
        self._thread: threading.Thread | None = None
        self._spec: TaskSpec | None = None
        self._between = threading.Event()  # set while the driver runs what it runs between two epochs
        self._lock = threading.Lock()
        self._give_way = False  # another job waits for the tasks' slots: the next epoch starts a new job
        self._yielded = False  # the course was closed for it between epochs (the tasks have ended)
        self._before: set[int] = set()  # the active jobs when the job started
        self._ours: set[int] | None = None  # the job's id (and any begun with it), known once it trained an epoch
        self._ahead: TaskSpec | None = None  # the epoch opened ahead of the driver's call (open_ahead)
        self.jobs = 0  # the jobs started (1 for a fit that never failed nor gave way)

    def __call__(self, spec: TaskSpec, text: str) -> list[dict[str, Any]]:
        ahead, self._ahead = self._ahead, None
        if ahead is not spec:
            self._begin(spec, text)
        reports = self.course.wait_reports(spec.commit_run, spec.epoch)
        if self._ours is None:  # the job has trained an epoch: it is among the active jobs begun since it started
            self._ours = set(self.sc.statusTracker().getActiveJobsIds()) - self._before
        self._between.set()
        return reports

    def open_ahead(self, spec: TaskSpec, text: str) -> None:
        """Open ``spec``'s epoch before the driver's call for it, which then only waits for its reports: the tasks
        train it while the driver validates the epoch before (:func:`overlaps_validation`)."""
        self._begin(spec, text)
        self._ahead = spec

    def _begin(self, spec: TaskSpec, text: str) -> None:
        """Open ``spec``'s epoch, on the running job where it can train it, else on a new one."""
        with self._lock:  # the watcher closes the course between epochs only
            self._between.clear()
            restart = self._give_way or self._thread is None or not self._thread.is_alive()  # yielded: gave way
        if restart or not same_job(self._spec, spec):
            self.stop()
            self._start(spec, text)
        self.course.open(spec.epoch, epoch_changes(spec))

    def _start(self, spec: TaskSpec, text: str) -> None:
        from pyspark import InheritableThread  # the fit's job group reaches the job

        self._spec, self.jobs, self._yielded, self._give_way = spec, self.jobs + 1, False, False
        generation = self.jobs
        stage = _job(self.rdd, spec, generation)
        description = text.replace(f"epoch {spec.epoch + 1} of", f"epochs {spec.epoch + 1}.. of")
        self.course.restart(generation)  # a task of a failed job that still waits is told to end
        self._before, self._ours = set(self.sc.statusTracker().getActiveJobsIds()), None

        def run() -> None:
            try:
                with session.job_description(self.sc, description):
                    stage.collect()
                ended: BaseException = RuntimeError("the fit's Spark job ended before its tasks reported the epoch")
            except BaseException as exc:  # noqa: BLE001 - the driver's wait raises it as the epoch's failure
                ended = exc
            if self.jobs == generation and self._thread is not None and not self._yielded:  # not ended by us
                self.course.fail(ended)

        self._thread = InheritableThread(target=run, name="elephant-fit-job", daemon=True)
        self._thread.start()
        threading.Thread(target=self._watch, args=(self._thread, generation), name="elephant-fit-watch",
                         daemon=True).start()

    def _watch(self, thread: threading.Thread, generation: int) -> None:
        """Close the course for another job that has waited for task slots (see the class's docstring)."""
        import time

        tracker, since = self.sc.statusTracker(), None
        while thread.is_alive() and self.jobs == generation and not self._yielded:
            time.sleep(self.poll)
            ours = self._ours
            if ours is None:
                continue
            try:
                waiting = starved_jobs(tracker, set(tracker.getActiveJobsIds()) - ours)
            except Exception:  # noqa: BLE001 - the context stopping under the fit: its own error reaches the driver
                return
            since = (since or time.monotonic()) if waiting else None
            if since is None or time.monotonic() - since < self.starved_s:
                continue
            if not self._give_way:
                log.info("Spark job(s) %s wait for the task slots the fit's tasks hold: the tasks end after this "
                         "epoch, and the next epoch starts a new job", sorted(waiting))
            self._give_way = True  # the next epoch's call starts a new job, behind the waiting ones
            with self._lock:
                if self._between.is_set():  # the tasks wait for the next epoch: end them now
                    self._yielded = True
                    self.course.close()
                    return

    def stop(self, timeout: float = 60.0) -> None:
        """Close the course and wait for the job to end (its tasks return); a job still running then is left to the
        fit's cancel."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self.course.close()
        thread.join(timeout)


def starved_jobs(tracker, jobs: Iterable[int]) -> list[int]:
    """The ``jobs`` whose active stages have tasks left but none running (they wait for task slots)."""
    active_stages = set(tracker.getActiveStageIds())
    waiting = []
    for job in jobs:
        info = tracker.getJobInfo(job)
        stages = [tracker.getStageInfo(s) for s in (info.stageIds if info is not None else ()) if s in active_stages]
        stages = [s for s in stages if s is not None]
        if stages and all(s.numActiveTasks == 0 and s.numCompletedTasks < s.numTasks for s in stages):
            waiting.append(job)
    return waiting
