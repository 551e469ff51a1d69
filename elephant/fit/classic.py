"""The Spark side of a fit in a classic session: cached blocks, a broadcast model, the server on the driver.

The training data become an RDD of numpy blocks cached on the executors,
memory first and their disks for the rest (``fit(cache=)``), or one broadcast
per shard for numpy input, the model archive one broadcast,
and the parameter server runs on the driver host at :func:`elephant.session.ps_host`:
an unsharded one in the driver's process (its own threads), a sharded one as
one process per shard (:mod:`elephant.ps.shard_process`; each shard's commits
then get a core of their own instead of sharing the driver's GIL), or, with
:data:`SHARDS_IN_PROCESSES` False, one server per shard in the driver's
threads. Each epoch is one Spark job (a barrier stage in synchronous mode) in
the fit's job group. With ``SparkModel(ps_placement="executors")`` the server
(its shards) runs instead in the first tasks of each epoch, a barrier stage
in every mode (:mod:`elephant.fit.hosted`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from elephant import data as D
from elephant import framework, gpu, session
from elephant.config import FitArgs, Settings
from elephant.fit import hosted
from elephant.fit.epoch import collect_checked
from elephant.fit.head import partition_head
from elephant.fit.resident import ResidentJob, why_not
from elephant.ps.course import Course
from elephant.sources import Source, release
from elephant.worker import TaskSpec

log = logging.getLogger(__name__)

__all__ = ["ClassicRun", "training_rdd", "SHARDS_IN_PROCESSES"]

#: Whether a sharded server's shards run in processes of their own (True, the default) or in the driver's
#: threads (False). A module setting, not a fit argument: it changes where the same bytes are computed, never
#: what is trained; threads are kept to compare against and to debug a shard in the driver's own process.
SHARDS_IN_PROCESSES = True


def training_rdd(model, settings: Settings, sc, data: Source, args: FitArgs, barrier: bool = False):
    """``(rdd_of_blocks, num_workers, validation_data_or_None)``, cached (:func:`cache_level`) and checked.

    The RDD's ``elephant_samples`` is the number of training samples,
    ``elephant_partition_samples`` each partition's and ``elephant_row_bytes``
    the bytes of one sample: counted (and the blocks checked against the
    model) by one Spark job when the data live in Spark. Epochs that are
    ``barrier`` stages get the data repartitioned, never coalesced.
    """
    training = data.training(model, sc, settings.num_workers, args, settings.seed, barrier=barrier)
    rdd = training.rdd
    if training.samples is None:
        level = cache_level(args.cache)
        if level is not None:
            rdd = rdd.persist(level)
        try:
            with session.job_description(rdd.context, "elephant fit: check and cache the training data"):
                parts = collect_checked(rdd.mapPartitions(lambda blocks: [D.stream_summary(blocks)]).collect)
            rdd.elephant_samples = D.checked_samples(model, [(n, shapes) for n, shapes, _ in parts if n])
        except BaseException:  # bad data, or Ctrl-C while the job ran: nothing stays cached
            release(rdd)
            raise
        rdd.elephant_partition_samples = tuple(n for n, _, _ in parts)
        rdd.elephant_row_bytes = max(row for _, _, row in parts)
        size = rdd.elephant_samples * rdd.elephant_row_bytes / 2**20
        where = "read from their source every epoch" if level is None else f"cached on the executors at {_named(level)}"
        log.info("training data: %d samples in %d partitions, %.4g MiB, %s", rdd.elephant_samples, len(parts), size,
                 where)
    else:
        rdd.elephant_samples = training.samples
        rdd.elephant_partition_samples, rdd.elephant_row_bytes = training.partition_samples, training.row_bytes
    rdd.elephant_coalesced, rdd.elephant_in_memory = training.coalesced, training.samples is not None
    return rdd, training.num_workers, training.validation


def cache_level(cache):
    """The storage level a fit's training data are cached at (``fit(cache=)``): MEMORY_AND_DISK where not given,
    so that partitions the executors' storage memory cannot hold spill to their disks instead of being computed
    from the source again; None where ``cache`` is False."""
    if cache is False:
        return None
    if cache is None:
        from pyspark import StorageLevel

        return StorageLevel.MEMORY_AND_DISK
    return cache


def _named(level) -> str:
    """A storage level's name in pyspark.StorageLevel (MEMORY_AND_DISK...), else how pyspark writes it."""
    from pyspark import StorageLevel

    return next((name for name in dir(StorageLevel) if name.isupper() and getattr(StorageLevel, name) == level),
                str(level))


def _epoch_job(rdd, spec: TaskSpec, barrier: bool) -> list[dict[str, Any]]:
    def task(iterator):
        from pyspark import BarrierTaskContext, TaskContext

        from elephant import worker
        from elephant.ps.shard_client import connect_shards

        ctx = BarrierTaskContext.get() if barrier else TaskContext.get()
        with connect_shards(spec.shard_urls, spec.token, spec.shard_plan, read_timeout=spec.read_timeout) as client:
            return worker.run_partition(spec, ctx.partitionId(), ctx.taskAttemptId(), iterator, client, ctx.cpus())

    stage = rdd.barrier() if barrier else rdd
    return stage.mapPartitions(task).collect()


def _hosted_epoch_job(rdd, spec: TaskSpec, hosting) -> list[bytes]:
    """The barrier stage of an epoch whose first tasks serve the parameter server: each task's encoded result."""
    def task(iterator):
        yield hosted.train_hosted(spec, hosting, iterator)

    return rdd.barrier().mapPartitions(task).collect()


def _hostable(optimizer) -> bool:
    """Whether the shards can serve from processes; where not, why is logged and they serve from threads."""
    from elephant.ps.shard_process import unhostable

    why = unhostable(optimizer)
    if why:
        log.warning("the parameter-server shards serve from the driver's threads, not processes: %s", why)
    return why is None


def _read_once(broadcast):
    """A driver's broadcast's value, without keeping the copy pyspark caches on the broadcast when it reads it."""
    value = broadcast.value
    vars(broadcast).pop("_value", None)
    return value


class ClassicRun:
    """The Spark side of a fit in a classic session (see the module's docstring)."""

    def __init__(self, model, settings: Settings, spark, data: Source, args: FitArgs, job_group: str):
        self.sc = spark.sparkContext
        self.settings = settings
        framework.ship(self.sc, framework.current_backend())  # before the first job: its Python workers are the fit's
        self.conf = dict(self.sc.getConf().getAll())  # read once: each getConf() is ~27 ms of Py4J calls
        self.devices = gpu.describe_request(self.conf)
        #: Whether the epoch's tasks host the parameter server (else the driver does; it may be sharded).
        self.hosted = settings.ps_placement == "executors"
        self._group = job_group  # every job of the fit runs in it, from the data's check on: Ctrl-C cancels them all
        self.sc.setJobGroup(job_group, f"elephant fit {job_group.removeprefix('elephant-')}", interruptOnCancel=True)
        try:
            with self.guard():
                self.rdd, self.num_workers, self.val = training_rdd(model, settings, self.sc, data, args,
                                                                       self.barrier(settings.mode))
        except BaseException:
            self.sc.setLocalProperty("spark.jobGroup.id", None)
            raise
        self.samples = self.rdd.elephant_samples
        self.partition_samples: tuple[int, ...] = self.rdd.elephant_partition_samples
        self.row_bytes: float = self.rdd.elephant_row_bytes
        self._servers: list[Any] = []
        self._processes = None  # the ShardedStore whose shards serve from processes
        self._broadcast = None
        self._max_bodies: list[int] = []
        self._ports: list[int] = []
        self._course: Course | None = None  # the server's, where one server runs in this process
        self._shards = 1
        self._resident: ResidentJob | None = None  # the fit's one job, where its epochs run as one

    def barrier(self, mode: str) -> bool:
        """Whether an epoch in ``mode`` is one barrier stage (synchronous rounds, or a server in its tasks)."""
        return mode == "synchronous" or self.hosted

    def check_slots(self) -> None:
        settings = self.settings
        slots = session.task_slots(self.sc, self.conf)
        session.check_barrier_slots(self.num_workers, slots, settings.optimizer.staleness_bound, settings.mode,
                                    hosted=self.hosted)

    def check_devices(self, backend: str) -> None:
        """Refuse a GPU request that cannot work (:func:`elephant.gpu.check_request`)."""
        gpu.check_request(self.conf, self.sc.master, backend, self.sc.environment)

    def head_rows(self, key: str | None, epoch: int, steps: int, batch_size: int,
                  buffer: int | None = None) -> list[tuple]:
        """Every partition's rows of the driver's head (:mod:`elephant.fit.head`) in partition order: each
        partition's first ``steps`` batches of ``batch_size`` as its task orders ``epoch`` (shuffled through
        ``buffer`` samples), read by one job over the cached blocks (numpy input: from the driver's broadcasts)."""
        rows = partition_head(key, epoch, steps, batch_size, buffer)
        shipped = getattr(self.rdd, "elephant_broadcasts", None)
        if shipped:  # numpy input: the driver reads the blocks it shipped, the very ones each task reads, without a job
            found = [head for i, broadcast in enumerate(shipped) for head in rows(i, [_read_once(broadcast)])]
        else:
            with session.job_description(self.sc, "elephant fit: the rows of the first epoch's first steps"), \
                    self.guard():
                found = collect_checked(self.rdd.mapPartitionsWithIndex(rows).collect)
        return [part for _, part in sorted(found, key=lambda item: item[0])]

    def open(self, store, token: str, job_group: str, model_bytes: bytes) -> tuple[Any, tuple[str, ...]]:
        """Broadcast the model and start the servers: ``(the tasks' model_bytes, the servers' urls)``.

        One server per shard of ``store`` (a :class:`~elephant.ps.sharded_store.ShardedStore`'s
        ``shards``, else the store itself) on a port of :func:`elephant.session.ps_ports`, the
        urls in shard order: an unsharded store's in the driver's process with its own threads,
        a sharded one's each in a process of its own (:meth:`ShardedStore.serve_in_processes`;
        in the driver's threads where :data:`SHARDS_IN_PROCESSES` is False). ``job_group`` is
        the one the run was made with, set then so that the data's check ran in it too.
        """
        from elephant.ps.app import create_app, max_body_bytes
        from elephant.ps.server import start_server

        sc = self.sc
        self._broadcast = sc.broadcast(model_bytes)
        self._ports = session.ps_ports(sc)
        self._shards = len(hosted.store_shards(store))
        if self.hosted:  # the epochs' tasks start the servers, and say where in each epoch
            self._max_bodies = hosted.max_bodies(store)
            return self._broadcast, ()
        host, ports = session.ps_host(sc), self._ports
        threads = 2 * self.num_workers + 4
        if SHARDS_IN_PROCESSES and getattr(store, "num_shards", 1) > 1 and _hostable(store.optimizer):
            self._processes = store  # stopped in close(), also when a shard fails to start
            urls = store.serve_in_processes(token, host, ports, threads, ports_from=session.PS_PORTS_KEY)
            return self._broadcast, urls
        shards = hosted.store_shards(store)
        self._course = Course(self.num_workers) if len(shards) == 1 else None
        for shard in shards:  # stopped in close(), also when a later one fails
            app = create_app(shard, token, max_body_bytes=max_body_bytes(shard.template), course=self._course)
            self._servers.append(start_server(app, host, ports, threads, ports_from=session.PS_PORTS_KEY))
        return self._broadcast, tuple(server.url for server in self._servers)

    def one_job(self, buffer: int | None, spark_validation: bool = False) -> bool:
        """Whether the fit's epochs run as one Spark job (:mod:`elephant.fit.resident`; after :meth:`open`, where
        tasks whose shuffle buffer holds ``buffer`` samples train them, and ``spark_validation`` says whether a
        Spark job validates each epoch), logged either way."""
        why = why_not(hosted=self.hosted, shards=self._shards,
                      slots=session.task_slots(self.sc, self.conf), num_workers=self.num_workers,
                      coalesced=self.rdd.elephant_coalesced, in_memory=self.rdd.elephant_in_memory,
                      partition_samples=self.partition_samples, buffer=buffer, spark_validation=spark_validation)
        if why is None:
            self._resident = ResidentJob(self.sc, self.rdd, self._course)
            log.info("the fit's epochs run as one Spark job (its tasks keep their replica and data between epochs)")
        else:
            log.info("a Spark job per epoch: %s", why)
        return why is None

    def job(self, store, barrier: bool):
        """One try of an epoch: ``job(spec, description)`` runs the epoch's Spark job and returns its stats."""
        if self._resident is not None:
            return self._resident

        def job(spec: TaskSpec, text: str) -> list[dict[str, Any]]:
            with session.job_description(self.sc, text):
                if not self.hosted:
                    return _epoch_job(self.rdd, spec, barrier)
                hosting = hosted.epoch_hosting(store, self._max_bodies, self.num_workers, self.settings.read_timeout,
                                               self.settings.norm_guard, self._ports)
                encoded = _hosted_epoch_job(self.rdd, spec, hosting)
            return hosted.absorb_results(store, encoded, type(spec.optimizer).__module__)

        return job

    @contextlib.contextmanager
    def guard(self) -> Iterator[Any]:
        """Inside, Ctrl-C cancels the fit's jobs; yields the event that says it did."""
        with session.interrupt_cancels(self.sc, self._group) as interrupted:
            yield interrupted

    def cancel(self) -> None:
        """Stop the fit's running jobs (an interrupted or failed fit must not train against a dead server)."""
        if self._group is not None:
            self.sc.cancelJobGroup(self._group)

    def close(self) -> None:
        resident, self._resident = self._resident, None
        if resident is not None:  # its tasks end before their server does
            resident.stop()
        servers, self._servers = self._servers, []
        failed = []
        processes, self._processes = self._processes, None
        if processes is not None:
            try:
                processes.stop_processes()
            except Exception as exc:
                failed.append(exc)
        for server in servers:  # every one, even after one fails to stop
            try:
                server.stop()
            except Exception as exc:
                failed.append(exc)
        if self._group is not None:
            self.sc.setLocalProperty("spark.jobGroup.id", None)
        if self._broadcast is not None:
            self._broadcast.unpersist()
        release(self.rdd)
        if failed:
            raise failed[0]
