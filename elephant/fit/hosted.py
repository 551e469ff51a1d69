"""An epoch served by its own tasks: the parameter server (or its shards) lives in the epoch's barrier stage.

A fit from a Spark Connect client always trains this way (its client cannot be
reached by the executors, :mod:`elephant.fit.connect`), and a classic fit does
with ``SparkModel(ps_placement="executors")`` (:mod:`elephant.fit.classic`),
so that the server's CPU and bytes are spread over the executors instead of
one driver host. Each epoch is one barrier stage, one task per worker:

1. the driver's (or client's) store holds the center, the rule's state and
   the clock between epochs; :func:`epoch_hosting` takes each shard's start
   from its snapshot into the :class:`Hosting` the stage's closure carries;
2. task ``s < S`` starts an ordinary :class:`~elephant.ps.store.Store` over
   shard ``s``'s slice, its app and a server on its executor's address, and
   every task learns the ``S`` urls through ``BarrierTaskContext.allGather``;
3. every task trains its partition against them (:func:`train_hosted`), as a
   classic task trains against the driver's server;
4. each hosting task waits until every partition has finished the epoch on its
   store, stops its server and returns the store's
   :class:`~elephant.ps.snapshots.Outcome` with its shard index
   (:func:`encode_result`: a JSON header and raw arrays, no pickle), and
   :func:`absorb_results` hands each shard of the driver's store its own.

An epoch is a transaction by construction: a failed stage (a hosting task's
executor lost included) leaves the driver's store at the epoch's start, and
the epoch is trained again (``SparkModel(epoch_retries=)``) on every shard.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from elephant import arrow as A
from elephant import checkpoint, session
from elephant.errors import PSError
from elephant.ps.client import plain_number
from elephant.worker import TaskSpec

__all__ = ["Hosting", "ShardStart", "absorb_results", "decode_result", "encode_result", "epoch_hosting",
           "lost_servers", "max_bodies", "store_shards", "train_hosted"]


def store_shards(store) -> tuple:
    """The stores of a fit's parameter server, one per shard (one: an unsharded :class:`Store`)."""
    return tuple(getattr(store, "shards", (store,)))


def max_bodies(store) -> list[int]:
    """Each shard's request-body limit (:func:`~elephant.ps.app.max_body_bytes` of its slice)."""
    from elephant.ps.app import max_body_bytes

    return [max_body_bytes(shard.template) for shard in store_shards(store)]


@dataclasses.dataclass(frozen=True)
class ShardStart:
    """Where one shard's store starts an epoch: its slice of the center, its rule and the rule's state."""

    center: list
    state: Any
    clock: int
    optimizer: Any
    max_body: int


@dataclasses.dataclass(frozen=True)
class Hosting:
    """What the hosting tasks need to serve an epoch: each shard's start (task ``s`` hosts shard ``s``)."""

    shards: tuple
    num_workers: int
    round_timeout: float
    norm_guard: float | None
    ports: list


def epoch_hosting(store, bodies: Sequence[int], num_workers: int, round_timeout: float, norm_guard: float | None,
                  ports: list) -> Hosting:
    """The :class:`Hosting` of the next epoch: every shard of ``store`` as it is now."""
    start = store.snapshot()
    shots = getattr(start, "shards", (start,))  # a ShardedSnapshot holds every shard's
    shards = tuple(ShardStart(center=shot.center, state=shot.state, clock=shot.clock, optimizer=shard.optimizer,
                              max_body=limit)
                   for shot, shard, limit in zip(shots, store_shards(store), bodies, strict=True))
    return Hosting(shards=shards, num_workers=num_workers, round_timeout=round_timeout, norm_guard=norm_guard,
                   ports=list(ports))


#: Seconds a hosting task waits for the epoch's other partitions between checks of the other shards' servers.
PEER_CHECK_S = 2.0
#: Seconds it still waits for the epoch after finding another shard's server gone, before it gives up.
LOST_GRACE_S = 10.0


def lost_servers(urls: Sequence[str], own: int) -> list[str]:
    """The servers among ``urls`` (but the ``own``-th) that no longer accept a connection."""
    lost = []
    for index, url in enumerate(urls):
        if index == own or not url:
            continue
        address = urlsplit(url)
        try:
            socket.create_connection((address.hostname, address.port), timeout=2.0).close()
        except OSError:
            lost.append(url)
    return lost


def train_hosted(spec: TaskSpec, hosting: Hosting, blocks) -> bytes:
    """One barrier task of a hosted epoch: its partition's stats and (a hosting task's) shard outcome, encoded."""
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
            return encode_result(stats, None)
        # Every partition has finished: the store holds the whole epoch. (Waiting on the store, not
        # with ctx.barrier(), which costs about a second per call.) A task that hosted another shard
        # and failed took its server down and will never finish: end this task too, so that the
        # stage fails now rather than when (or if) Spark kills it.
        while not store.wait_finished(spec.epoch, timeout=PEER_CHECK_S):
            lost = lost_servers(urls, partition)
            # a host whose store saw every finish stops its server: the last finishes may still be on their way here
            if lost and not store.wait_finished(spec.epoch, timeout=LOST_GRACE_S):
                raise PSError(f"partition {partition}: the parameter-server shard(s) at {', '.join(lost)} stopped "
                              f"before every partition finished epoch {spec.epoch} (the task hosting it failed)")
        return encode_result(stats, (partition, store.outcome()))
    finally:
        if server is not None:
            server.stop()


def absorb_results(store, encoded: Sequence[bytes], rule_module: str) -> list[dict[str, Any]]:
    """Take an epoch's encoded task results into ``store`` (each shard its outcome); the partitions' stats."""
    results = [decode_result(data, rule_module) for data in encoded]
    served = dict(r[1] for r in results if r[1] is not None)
    outcomes = [served[index] for index in range(len(store_shards(store)))]
    store.absorb(outcomes if len(outcomes) > 1 else outcomes[0])
    return [stats for r in results for stats in r[0]]


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
    text = json.dumps(header, default=plain_number).encode()
    return len(text).to_bytes(4, "little") + text + A.pack_arrays(arrays)


def decode_result(data: bytes, rule_module: str) -> tuple[list[dict], Any]:
    """``(stats, (shard, Outcome) or None)`` of :func:`encode_result`."""
    from elephant.ps.snapshots import Outcome
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
