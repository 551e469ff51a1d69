"""A fit from a Spark Connect client: the parameter server is hosted by the tasks of each epoch.

Under Spark Connect the Python process that calls ``fit`` is a client with no
SparkContext, and the executors usually cannot reach it, so the server cannot
live there as it does in a classic session. Each epoch is instead one barrier
``mapInArrow`` stage over the training DataFrame (selected, repartitioned to
the workers and cached once per fit), one task per worker, whose first ``S``
tasks serve the epoch, task ``s`` the server's shard ``s`` (``S = 1`` unless
``SparkModel(ps_shards=)`` asks for more or the model's size decides it, at
most one per worker): :mod:`elephant.fit.hosted` says how. The client's store
holds the center, the rule's state and the clock between epochs, and runs
validation, callbacks and backups there, as a classic driver does.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

from elephant import arrow as A
from elephant import data as D
from elephant import gpu, session
from elephant.config import FitArgs, Settings
from elephant.errors import ConfigError
from elephant.fit import hosted
from elephant.fit.epoch import collect_checked
from elephant.fit.plan import decide_workers
from elephant.sources import DataFrameSource, Source
from elephant.worker import TaskSpec

__all__ = ["HostedRun", "connect_slots"]

_LOCAL = re.compile(r"^local\[(\d+)(?:,\s*\d+)?\]$")
_LOCAL_CLUSTER = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]$")


def connect_slots(conf: dict[str, str | None]) -> int | None:
    """How many tasks the cluster behind a Connect session runs at once, from its conf; None if it does not say.

    A client cannot ask the cluster for its executors, so this reads what the
    conf states: ``local[N]``, ``local-cluster[N,C,M]``, else
    ``spark.executor.instances`` x ``spark.executor.cores``, divided by
    ``spark.task.cpus``.
    """
    master = (conf.get("spark.master") or "").strip()
    cpus = max(1, int(conf.get("spark.task.cpus") or 1))
    cores = None
    if master == "local":
        cores = 1
    elif m := _LOCAL.match(master):
        cores = int(m.group(1))
    elif m := _LOCAL_CLUSTER.match(master):
        cores = int(m.group(1)) * int(m.group(2))
    elif conf.get("spark.executor.instances") and conf.get("spark.executor.cores"):
        cores = int(conf["spark.executor.instances"]) * int(conf["spark.executor.cores"])
    return None if cores is None else max(1, cores // cpus)


def _conf(spark, keys) -> dict[str, str | None]:
    return {key: spark.conf.get(key, None) for key in keys}


_PREALLOCATE_KEY = "spark.executorEnv.XLA_PYTHON_CLIENT_PREALLOCATE"
_CONF_KEYS = ("spark.master", "spark.task.cpus", "spark.executor.instances", "spark.executor.cores",
              session.PS_PORTS_KEY, gpu.TASK_AMOUNT_KEY, _PREALLOCATE_KEY)


class HostedRun:
    """The Spark side of a fit from a Spark Connect client (see the module's docstring).

    Raises:
        ConfigError: ``x`` is not a DataFrame, or the number of workers is
            unknown or more than the cluster runs at once.
        DataError: the DataFrame's columns or rows do not fit the model.
    """

    def __init__(self, model, settings: Settings, spark, data: Source, args: FitArgs):
        if not isinstance(data, DataFrameSource):
            raise ConfigError(
                f"under Spark Connect SparkModel.fit trains on a DataFrame; received x of type "
                f"{type(data.x).__name__}. Make one with spark.createDataFrame (features as an array or Vector "
                "column, a label column), or run the script with a classic SparkSession to train on numpy arrays "
                "or RDDs")
        if settings.ps_placement == "driver":
            raise ConfigError(
                "under Spark Connect the parameter server runs in the epoch's tasks (the executors cannot reach "
                "the client); received ps_placement='driver'. Leave it None, or pass 'executors'")
        x = data.x
        self.spark, self.val = spark, None
        self._conf = _conf(spark, _CONF_KEYS)
        self.settings = settings
        slots = connect_slots(self._conf)
        self.num_workers = decide_workers(settings.num_workers, slots)
        if self.num_workers is None:
            raise ConfigError(
                f"under Spark Connect elephant cannot see how many tasks the cluster runs at once (spark.master="
                f"{self._conf['spark.master']!r}); pass SparkModel(num_workers=N) with N at most the cluster's "
                "task slots")
        if slots is not None and self.num_workers > slots:
            raise ConfigError(
                f"under Spark Connect every worker of an epoch runs at once (one of them hosts the parameter "
                f"server), but num_workers={self.num_workers} exceeds the {slots} task slots of this cluster; "
                "lower num_workers")
        columns = (args.features_col, args.label_col, args.weight_col)
        self._blocks = _block_stream(A.arrow_block_reader(*columns), args.class_weight)
        self.df = A.selected_dataframe(x, *columns).repartition(self.num_workers).cache()
        self._tag = None
        try:
            self.samples, self.partition_samples, self.row_bytes = self._check(model)
        except BaseException:
            self.df.unpersist()
            raise

    def _check(self, model) -> tuple[int, tuple[int, ...], float]:
        """Read and cache the data once, as a stream: ``(the number of samples, checked against the model, each
        partition's, the bytes of one sample)``."""
        blocks = self._blocks

        def summary(batches):
            import pyarrow as pa

            yield pa.RecordBatch.from_arrays([pa.array([json.dumps(D.stream_summary(blocks(batches)))])], ["summary"])

        parts = [json.loads(row[0]) for row in collect_checked(self.df.mapInArrow(summary, "summary string").collect)]
        samples = D.checked_samples(model, [(n, shapes) for n, shapes, _ in parts if n])
        return samples, tuple(n for n, _, _ in parts), max(size for _, _, size in parts)

    def head_rows(self, key: str | None, epoch: int, steps: int, batch_size: int,
                  buffer: int | None = None) -> list[tuple]:
        """Never asked for: a fit whose tasks host the server trains no head (:func:`elephant.fit.plan.plan_fit`)."""
        raise NotImplementedError("under Spark Connect the parameter server runs in the epoch's tasks, and such a fit "
                                  f"trains no head on the driver; received a request for {steps} head steps")

    def barrier(self, mode: str) -> bool:
        """Every epoch is one barrier stage here, in every mode (its task 0 hosts the server)."""
        return True

    def check_slots(self) -> None:
        """Checked when the run was made (every mode needs all its workers at once here)."""

    @property
    def devices(self) -> str:
        """The devices the tasks ask for, for the fit's first log line."""
        return gpu.describe_request(self._conf)

    def check_devices(self, backend: str) -> None:
        """Refuse a GPU request that cannot work (:func:`elephant.gpu.check_request`), as far as the conf tells."""
        preallocate = self._conf.get(_PREALLOCATE_KEY)
        gpu.check_request(self._conf, self._conf.get("spark.master") or "", backend,
                          {} if preallocate is None else {"XLA_PYTHON_CLIENT_PREALLOCATE": preallocate})

    #: The parameter server lives in the tasks of each epoch (its shards in the first ``ps_shards`` of them).
    hosted = True

    def open(self, store, token: str, job_group: str, model_bytes: bytes) -> tuple[Any, tuple[str, ...]]:
        """Tag the fit's jobs; the tasks get the archive itself (no broadcasts) and learn the servers' urls."""
        self._tag = job_group
        self.spark.addTag(self._tag)
        self._max_bodies = hosted.max_bodies(store)
        return model_bytes, ()

    def one_job(self, buffer: int | None, spark_validation: bool = False) -> bool:
        """Never: each epoch's stage hosts the server (:mod:`elephant.fit.resident` needs one on the driver)."""
        return False

    def job(self, store, barrier: bool):
        """One try of an epoch: the hosted stage, whose shards' outcomes the client's store absorbs."""
        def job(spec: TaskSpec, text: str) -> list[dict[str, Any]]:
            return hosted.absorb_results(store, self._epoch_job(store, spec), type(spec.optimizer).__module__)

        return job

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Ctrl-C reaches the client as in any Connect call (no job group to cancel from a handler)."""
        yield None

    def _epoch_job(self, store, spec: TaskSpec) -> list[bytes]:
        """The hosted stage of one epoch over the cached DataFrame: every task's encoded result."""
        settings, blocks = self.settings, self._blocks
        hosting = hosted.epoch_hosting(store, self._max_bodies, self.num_workers, settings.read_timeout,
                                       settings.norm_guard, session.parse_ports(self._conf[session.PS_PORTS_KEY]))

        def task(batches):
            import pyarrow as pa

            yield pa.RecordBatch.from_arrays([pa.array([hosted.train_hosted(spec, hosting, blocks(batches))],
                                                       pa.binary())], ["result"])

        return [row[0] for row in self.df.mapInArrow(task, "result binary", barrier=True).collect()]

    def cancel(self) -> None:
        if self._tag is not None:
            self.spark.interruptTag(self._tag)

    def close(self) -> None:
        if self._tag is not None:
            self.spark.removeTag(self._tag)
        self.df.unpersist()


def _block_stream(read, class_weight):
    """A function from a task's Arrow batches to its blocks, with class weights added (no reference to the run)."""
    add = D.add_class_weights(class_weight) if class_weight is not None else None

    def blocks(batches):
        for batch in batches:
            if batch.num_rows:
                yield add(read(batch)) if add is not None else read(batch)

    return blocks
