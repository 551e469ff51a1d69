"""A fit from a Spark Connect client: the parameter server is hosted by the tasks of each epoch.

Under Spark Connect the Python process that calls ``fit`` is a client with no
SparkContext, and the executors usually cannot reach it, so the server cannot
live there as it does in a classic session. Each epoch is instead one barrier
``mapInArrow`` stage over the training DataFrame, one task per worker, and the
stage's first ``S`` tasks serve the epoch, task ``s`` the server's shard ``s``
(``S = 1`` unless ``SparkModel(ps_shards=)`` asks for more, at most one per worker):

1. the client's store (a :class:`~elephant.ps.store.Store`, or a
   :class:`~elephant.ps.sharded_store.ShardedStore` of ``S`` stores) holds the
   center, the rule's state and the clock between epochs; the epoch's closure
   carries each shard's (and the model archive, the token and the rule) to the tasks;
2. each hosting task starts a store and a server over its shard on its
   executor's address, and every task learns the addresses through
   ``BarrierTaskContext.allGather``;
3. every task trains its partition against those servers, as in a classic fit
   (through a :class:`~elephant.ps.shard_client.ShardedClient` for ``S > 1``);
4. once every partition has finished the epoch (each hosting task waits for
   their ``finish`` calls on its store), the hosting tasks stop their servers
   and return their stores' :class:`~elephant.ps.store.Outcome`, which the
   client's store absorbs, shard by shard; validation, callbacks and backups
   then run on the client.

An epoch is a transaction by construction: a failed stage (a hosting task's
executor lost included) leaves the client's store at the epoch's start, and the
epoch is trained again as a failed synchronous epoch is
(``SparkModel(epoch_retries=)``). Every mode runs as a barrier stage, since the
server lives only as long as the stage's tasks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from elephant import arrow as A
from elephant import checkpoint
from elephant import data as D
from elephant import gpu, session
from elephant.config import FitArgs, Settings
from elephant.errors import ConfigError
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
            self.samples = self._check(model)
        except BaseException:
            self.df.unpersist()
            raise

    def _check(self, model) -> int:
        """Read and cache the data once: the number of samples, checked against the model."""
        blocks = self._blocks

        def summary(batches):
            import pyarrow as pa

            block = next(D.concat_blocks(blocks(batches)), None)
            found = [] if block is None else [D.num_samples(block[0]), D.shape_summary(block)]
            yield pa.RecordBatch.from_arrays([pa.array([json.dumps(found)])], ["summary"])

        rows = collect_checked(self.df.mapInArrow(summary, "summary string").collect)
        return D.checked_samples(model, [part for part in (json.loads(row[0]) for row in rows) if part])

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
        from elephant.ps.app import max_body_bytes

        self._tag = job_group
        self.spark.addTag(self._tag)
        self._max_bodies = [max_body_bytes(shard.template) for shard in _shards(store)]
        return model_bytes, ()

    def job(self, store, barrier: bool):
        """One try of an epoch: the hosted stage, whose shards' outcomes the client's store absorbs."""
        def job(spec: TaskSpec, text: str) -> list[dict[str, Any]]:
            results, outcomes = self._epoch_job(store, spec)
            store.absorb(outcomes if len(outcomes) > 1 else outcomes[0])
            return results

        return job

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Ctrl-C reaches the client as in any Connect call (no job group to cancel from a handler)."""
        yield None

    def _epoch_job(self, store, spec: TaskSpec):
        settings, blocks = self.settings, self._blocks
        start = store.snapshot()
        shots = getattr(start, "shards", (start,))  # a ShardedSnapshot holds every shard's
        shards = tuple(_ShardStart(center=shot.center, state=shot.state, clock=shot.clock, optimizer=shard.optimizer,
                                   max_body=limit)
                       for shot, shard, limit in zip(shots, _shards(store), self._max_bodies, strict=True))
        hosting = _Hosting(shards=shards, num_workers=self.num_workers, round_timeout=settings.read_timeout,
                           norm_guard=settings.norm_guard, ports=session.parse_ports(self._conf[session.PS_PORTS_KEY]))

        def task(batches):
            import pyarrow as pa

            stats, outcome = _train_hosted(spec, hosting, blocks(batches))
            yield pa.RecordBatch.from_arrays([pa.array([encode_result(stats, outcome)], pa.binary())], ["result"])

        rows = self.df.mapInArrow(task, "result binary", barrier=True).collect()
        results = [decode_result(row[0], type(spec.optimizer).__module__) for row in rows]
        served = dict(r[1] for r in results if r[1] is not None)
        return [stats for r in results for stats in r[0]], [served[index] for index in range(len(shards))]

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


def _shards(store) -> tuple:
    """The stores of the client's parameter server, one per shard (one: an unsharded :class:`Store`)."""
    return tuple(getattr(store, "shards", (store,)))


@dataclasses.dataclass(frozen=True)
class _ShardStart:
    """Where one shard's store starts an epoch: its slice of the center, its rule and the rule's state."""

    center: list
    state: Any
    clock: int
    optimizer: Any
    max_body: int


@dataclasses.dataclass(frozen=True)
class _Hosting:
    """What the hosting tasks need to serve an epoch: each shard's start (task ``s`` hosts shard ``s``)."""

    shards: tuple
    num_workers: int
    round_timeout: float
    norm_guard: float | None
    ports: list


def _train_hosted(spec: TaskSpec, hosting: _Hosting, blocks) -> tuple[list, Any]:
    """One barrier task of a hosted epoch: ``(the partition's stats, (shard, its store's Outcome) or None)``."""
    from pyspark import BarrierTaskContext

    from elephant import worker
    from elephant.ps.app import create_app
    from elephant.ps.server import start_server
    from elephant.ps.shard_client import connect_shards
    from elephant.ps.store import Store

    ctx = BarrierTaskContext.get()
    partition, server, store = ctx.partitionId(), None, None
    count = len(hosting.shards)
    try:
        if partition < count:
            start = hosting.shards[partition]
            store = Store(start.center, start.optimizer, spec.mode, hosting.num_workers, spec.commit_run,
                          round_timeout=hosting.round_timeout, state=start.state, norm_guard=hosting.norm_guard,
                          clock=start.clock)
            app = create_app(store, spec.token, max_body_bytes=start.max_body)
            host = ctx.getTaskInfos()[partition].address.rsplit(":", 1)[0]
            server = start_server(app, host, hosting.ports, 2 * hosting.num_workers + 4,
                                  ports_from=session.PS_PORTS_KEY)
        urls = tuple(ctx.allGather(server.url if server is not None else "")[:count])
        here = dataclasses.replace(spec, ps_url=urls[0], ps_urls=urls if count > 1 else ())
        with connect_shards(here.shard_urls, spec.token, spec.shard_plan, read_timeout=spec.read_timeout) as client:
            stats = worker.run_partition(here, partition, ctx.taskAttemptId(), blocks, client, ctx.cpus())
        if store is None:
            return stats, None
        # Every partition has finished: the store holds the whole epoch. (Waiting on the store, not
        # with ctx.barrier(), which costs about a second per call.)
        store.wait_finished(spec.epoch)
        return stats, (partition, store.outcome())
    finally:
        if server is not None:
            server.stop()


def _plain(value: Any) -> Any:
    """numpy scalars as Python numbers, for JSON."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"a value of type {type(value).__name__}")


def encode_result(stats: list[dict], served) -> bytes:
    """A task's stats and (a hosting task's) ``(shard, store outcome)`` as bytes: a JSON header, then the arrays.

    No pickle: the client reads what the tasks send without running any of it.
    """
    header: dict[str, Any] = {"stats": stats, "outcome": None}
    arrays: list[np.ndarray] = []
    if served is not None:
        shard, outcome = served
        structure, state_arrays = checkpoint.encode_state(outcome.state)
        header["outcome"] = {
            "clock": outcome.clock, "counts": outcome.counts, "state": structure,
            "staleness": [[int(k), v] for k, v in outcome.staleness.items()],
            "ledger": [[list(key), attempt] for key, attempt in outcome.ledger],
            "center": len(outcome.center), "shard": shard,
        }
        arrays = list(outcome.center) + state_arrays
    text = json.dumps(header, default=_plain).encode()
    return len(text).to_bytes(4, "little") + text + A.pack_arrays(arrays)


def decode_result(data: bytes, rule_module: str) -> tuple[list[dict], Any]:
    """``(stats, (shard, Outcome) or None)`` of :func:`encode_result`."""
    from elephant.ps.store import Outcome
    from elephant.protocol import CommitKey

    size = int.from_bytes(data[:4], "little")
    header = json.loads(data[4:4 + size])
    arrays = list(A.unpack_arrays(data[4 + size:]))
    found = header["outcome"]
    if found is None:
        return header["stats"], None
    count = found["center"]
    outcome = Outcome(
        center=arrays[:count], state=checkpoint.decode_state(found["state"], arrays[count:], rule_module),
        clock=found["clock"], ledger=[(CommitKey(*key), attempt) for key, attempt in found["ledger"]],
        counts=found["counts"], staleness={k: v for k, v in found["staleness"]},
    )
    return header["stats"], (found["shard"], outcome)
