"""The driver's view of a sharded parameter server: ``S`` stores behind the :class:`Store` methods a fit uses.

A fit (:mod:`elephant.fit.loop`, :mod:`elephant.fit.epoch`,
:mod:`elephant.fit.backup`) reads and steers its parameter server through a
few :class:`~elephant.ps.store.Store` methods: the center, a snapshot and a
rollback around each epoch, the metrics and the ledger, the rule's hook for a
changed learning rate, and closing. :class:`ShardedStore` has those methods
over the ``S`` stores of a :class:`~elephant.ps.shards.ShardPlan` (built by
:func:`~elephant.ps.shard_client.shard_stores`), so the fit does not know how
many shards there are. :func:`make_store` gives the fit its store: a plain
:class:`Store` for one shard (the unsharded path, unchanged), else a
:class:`ShardedStore`.

The shards start as stores in the driver's process. :meth:`ShardedStore.serve_in_processes`
moves each into a process of its own on the driver host, serving its own
URL (:mod:`elephant.ps.shard_process`; what a classic fit does for ``S > 1``,
:class:`elephant.fit.classic.ClassicRun`), and holds a
:class:`~elephant.ps.shard_process.ShardProcess` per shard in its place: the
same methods, each a request over a pipe. :meth:`ShardedStore.stop_processes`
ends them and takes every shard's final state back into a closed store in
this process, so the center, metrics and ledgers stay readable after the fit.

What the methods answer:

* ``center()``, ``template``: the shards' centers joined by the plan (the full
  weight list);
* ``absorb()``: every shard takes the outcome of an epoch served elsewhere;
* ``snapshot()`` / ``rollback()``: every shard's, together; ``rollback``
  returns the commits undone on shard 0 (every commit reaches every shard);
* ``snapshot().state``: the list of the shards' rule states, in shard order:
  what a backup saves, and what :func:`make_store` takes back as ``state``;
* ``metrics()``: shard 0's counters and staleness histogram (every commit,
  pull, replay and rollback reaches every shard, so each shard counts the
  same ones and shard 0 speaks for all), except ``bytes_in`` and
  ``bytes_out``, summed over the shards, the refusals ``commits_rejected``
  and ``stale_attempts_fenced``, the largest shard's count (a refusal may
  reach one shard only), ``clock``, the least shard clock, and ``waiting``,
  the largest; every shard's own metrics are under ``"shards"``;
* ``ledger()`` and ``samples_applied``: shard 0's; ``shard_ledgers()`` gives
  every shard's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from elephant.errors import ConfigError
from elephant.optimizers.base import DistributedOptimizer
from elephant.protocol import CommitKey
from elephant.ps.shards import ShardPlan, check_per_shard, plan_shards
from elephant.ps.snapshots import Snapshot
from elephant.ps.store import Store

logger = logging.getLogger(__name__)

__all__ = ["ShardedSnapshot", "ShardedStore", "make_store"]

#: Refusal counters: merged as the largest shard's count (the other counters are shard 0's, bytes summed).
REFUSALS = ("commits_rejected", "stale_attempts_fenced")


@dataclasses.dataclass(frozen=True)
class ShardedSnapshot:
    """Every shard's :class:`~elephant.ps.snapshots.Snapshot`, in shard order; for :meth:`ShardedStore.rollback`."""

    shards: tuple[Snapshot, ...]

    @property
    def state(self) -> list[Any]:
        """The shards' rule states, in shard order (what a backup saves)."""
        return [s.state for s in self.shards]

    @property
    def clock(self) -> int:
        return min(s.clock for s in self.shards)


class ShardedStore:
    """The :class:`Store` methods a fit uses, over the ``S`` stores of ``plan`` (see the module's docstring).

    Args:
        stores: one store per shard of ``plan``, in its order, each over its slice of the center.
        plan: the :class:`~elephant.ps.shards.ShardPlan` the stores were built by.

    Raises:
        ConfigError: ``plan`` is not a :class:`ShardPlan`, or ``stores`` is not one store per shard.
    """

    def __init__(self, stores: Sequence[Store], plan: ShardPlan):
        stores = tuple(check_per_shard(plan, stores, "stores", "store"))
        self._stores, self._plan = stores, plan

    # ------------------------------------------------------------------ reads
    shards = property(lambda self: self._stores, doc="The shards' stores, in the plan's order.")
    plan = property(lambda self: self._plan, doc="The shard plan.")
    num_shards = property(lambda self: len(self._stores), doc="Number of shards ``S``.")
    run = property(lambda self: self._stores[0].run, doc="The run id the shards serve (the same on each).")
    mode = property(lambda self: self._stores[0].mode, doc="The synchronisation mode.")
    num_workers = property(lambda self: self._stores[0].num_workers, doc="Number of partitions.")
    optimizer = property(lambda self: self._stores[0].optimizer, doc="The distributed optimizer.")
    clock = property(lambda self: min(s.clock for s in self._stores), doc="The least shard clock.")
    streams_rounds = property(lambda self: self._stores[0].streams_rounds, doc="As :attr:`Store.streams_rounds`.")

    @property
    def template(self) -> list[np.ndarray]:
        """The full center (shapes, dtypes), joined from the shards' templates."""
        return self._plan.join([s.template for s in self._stores])

    def center(self) -> list[np.ndarray]:
        """A writable copy of the full center weights, joined from the shards' copies."""
        return self._plan.join([s.center() for s in self._stores])

    def ledger(self) -> list[tuple[CommitKey, int]]:
        """Shard 0's applied ``(key, attempt)`` pairs in apply order (every shard applies every commit)."""
        return self._stores[0].ledger()

    def shard_ledgers(self) -> list[list[tuple[CommitKey, int]]]:
        """Every shard's ledger, in shard order."""
        return [s.ledger() for s in self._stores]

    @property
    def samples_applied(self) -> int:
        """Samples trained in the commits shard 0 applied (read without locks, for progress displays)."""
        return self._stores[0].samples_applied

    def metrics(self) -> dict[str, Any]:
        """The shards' metrics merged (see the module's docstring), every shard's own under ``"shards"``."""
        each = [s.metrics() for s in self._stores]
        out = dict(each[0])
        out["bytes_in"] = sum(m["bytes_in"] for m in each)
        out["bytes_out"] = sum(m["bytes_out"] for m in each)
        for name in REFUSALS:
            out[name] = max(m[name] for m in each)
        out["clock"] = min(m["clock"] for m in each)
        out["waiting"] = max(m["waiting"] for m in each)
        out["shards"] = each
        return out

    # ---------------------------------------------------------------- changes
    def learning_rate_changed(self, ratio: float) -> None:
        """Tell every shard's rule that the learning rate was multiplied by ``ratio``.

        Raises:
            ProtocolError, PSError: as :meth:`Store.learning_rate_changed`; shards
                before the failing one have taken the change (the fit stops on it).
        """
        for store in self._stores:
            store.learning_rate_changed(ratio)

    def snapshot(self) -> ShardedSnapshot:
        """Every shard as it is now, for :meth:`rollback` (taken between epochs)."""
        return ShardedSnapshot(tuple(s.snapshot() for s in self._stores))

    def rollback(self, snapshot: ShardedSnapshot, run: str) -> int:
        """Return every shard to ``snapshot`` and serve the new run id ``run``; the commits undone on shard 0.

        Raises:
            ConfigError: ``snapshot`` is not one of this store's, or ``run`` is not a new run id.
        """
        if not isinstance(snapshot, ShardedSnapshot) or len(snapshot.shards) != len(self._stores):
            raise ConfigError(f"a rollback of {len(self._stores)} shards needs a ShardedSnapshot of as many; "
                              f"received {type(snapshot).__name__}")
        undone = [s.rollback(shot, run) for s, shot in zip(self._stores, snapshot.shards)]
        if len(set(undone)) > 1:
            logger.warning("rollback to run %s undid %s commits on the shards", run, undone)
        return undone[0]

    def absorb(self, outcomes: Sequence[Any]) -> None:
        """Go on from an epoch served elsewhere: each shard's store absorbs its :class:`~elephant.ps.snapshots.Outcome`.

        ``outcomes`` holds one outcome per shard, in shard order (a Spark Connect
        fit's hosting tasks return them, :mod:`elephant.fit.connect`).

        Raises:
            ConfigError: not one outcome per shard (no shard has absorbed anything then).
        """
        outcomes = check_per_shard(self._plan, outcomes, "outcomes", "outcome")
        for store, outcome in zip(self._stores, outcomes):
            store.absorb(outcome)

    def wait_finished(self, epoch: int) -> None:
        """Block until every partition has finished ``epoch`` on every shard."""
        for store in self._stores:
            store.wait_finished(epoch)

    def close(self) -> None:
        """Close every shard (waiting requests are woken with ``StoreClosedError``)."""
        for store in self._stores:
            store.close()

    # -------------------------------------------------------------- processes
    @property
    def in_processes(self) -> bool:
        """Whether the shards are served by processes of their own (:meth:`serve_in_processes`)."""
        from elephant.ps.shard_process import ShardProcess

        return any(isinstance(s, ShardProcess) for s in self._stores)

    def serve_in_processes(self, token: str, host: str, ports: Sequence[int], threads: int, *,
                           ports_from: str = "the given ports", ready_timeout: float = 120.0) -> tuple[str, ...]:
        """Move every shard into a process of its own, serving on ``host``; the shards' URLs, in shard order.

        Each process starts from its store's center, rule state, clock and run id, with a server of
        ``threads`` handler threads on the first port of ``ports`` it can bind (``[0]``: any free
        port) and the store's request-body limit (:func:`~elephant.ps.app.max_body_bytes`). The
        stores in this process are then dropped; :meth:`stop_processes` brings the state back.

        Raises:
            PSError: the shards already serve from processes, or one failed to start (the others
                are stopped, and this store keeps its in-process shards).
        """
        from elephant.errors import PSError
        from elephant.ps.app import max_body_bytes
        from elephant.ps.shard_process import start_shards

        if self.in_processes:
            raise PSError(f"the shards of run {self.run} already serve from processes; stop_processes() first")
        specs = []
        for store in self._stores:
            shot = store.snapshot()
            specs.append(dict(center=list(shot.center), state=shot.state, clock=shot.clock, run=store.run,
                              optimizer=store.optimizer, mode=store.mode, num_workers=store.num_workers,
                              round_timeout=store.round_timeout, token=token, host=host, ports=list(ports),
                              ports_from=ports_from, max_body_bytes=max_body_bytes(store.template), threads=threads))
        self._round_timeout = self._stores[0].round_timeout
        processes = start_shards(specs, ready_timeout=ready_timeout)
        self._stores = tuple(processes)
        return tuple(p.url for p in processes)

    def stop_processes(self) -> None:
        """End the shards' processes and go on with their final state in closed stores of this process.

        A shard whose process was gone keeps its stopped handle (its reads raise ``PSError``). Idempotent;
        nothing to do for in-process shards.
        """
        from elephant.ps.shard_process import ShardProcess

        stores = []
        for shard in self._stores:
            outcome = shard.stop() if isinstance(shard, ShardProcess) else None
            if outcome is None:
                stores.append(shard)
                continue
            store = Store(outcome.center, shard.optimizer, shard.mode, shard.num_workers, shard.run,
                          round_timeout=self._round_timeout, state=outcome.state, clock=outcome.clock)
            store.absorb(outcome)  # the ledger and the counters (the new store's are empty)
            store.close()
            stores.append(store)
        self._stores = tuple(stores)

    def __repr__(self) -> str:
        return f"ShardedStore(run={self.run!r}, shards={self.num_shards}, bytes={self._plan.shard_bytes()})"

    def __reduce__(self):
        raise TypeError("ShardedStore lives on the driver and cannot be pickled into a Spark task; tasks reach "
                        "its shards through connect_shards(urls, token, plan)")


def make_store(center: Sequence[np.ndarray], optimizer: DistributedOptimizer, mode: str, num_workers: int, run: str,
               *, shards: int = 1, round_timeout: float = 600.0, state: Any = None,
               norm_guard: float | None = None) -> Store | ShardedStore:
    """A fit's parameter-server state: a :class:`Store` for ``shards=1`` (default), else a :class:`ShardedStore`.

    Args:
        center, optimizer, mode, num_workers, run, round_timeout, norm_guard: as :class:`Store`'s.
        shards: ``S``; the plan is :func:`~elephant.ps.shards.plan_shards` over ``center``.
        state: the rule's state to start from (a resumed fit): one store's state for ``S=1``, the list
            of the shards' states (``snapshot().state``) for more; default None (``server_init``).

    Raises:
        ConfigError: as :class:`Store`, :func:`~elephant.ps.shards.plan_shards` (a model too small to
            cut into ``shards`` pieces) and :func:`~elephant.ps.shard_client.shard_stores` (``norm_guard``
            or a rule that is not elementwise with more than one shard).
    """
    from elephant.ps.shard_client import shard_stores

    if shards == 1:
        return Store(center, optimizer, mode, num_workers, run, round_timeout=round_timeout, state=state,
                     norm_guard=norm_guard)
    from elephant.optimizers.compress import Compressed

    plan = plan_shards(center, shards, codec=optimizer.codec if isinstance(optimizer, Compressed) else None)
    stores = shard_stores(center, plan, optimizer, mode, num_workers, run, round_timeout=round_timeout,
                          norm_guard=norm_guard, states=state)
    logger.info("sharded parameter server of run %s: %d shards of %s bytes", run, shards, plan.shard_bytes())
    return ShardedStore(stores, plan)
