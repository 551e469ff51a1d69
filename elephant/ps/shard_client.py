"""A sharded parameter server: ``S`` ordinary stores, one client that fans out to them.

:func:`shard_stores` builds one :class:`~elephant.ps.store.Store` per shard of a
:class:`~elephant.ps.shards.ShardPlan`, each over its slice of the center with
the same optimizer; each can be served by its own app and
:class:`~elephant.ps.server.PSServer`, or reached in process.
:class:`ShardedClient` has the methods of :class:`~elephant.ps.client.PSClient`
and sends every request to all ``S`` shards' clients in parallel:

* a commit's tensors are split by the plan, and every shard receives every
  commit (same key, attempt, step and sample counts), so each shard's clock
  counts the same commits or rounds;
* the reply's center is the shards' centers joined by the plan; the rule's
  payload ``tensors`` is joined when every shard sent one, and is None when any
  shard acknowledged a replay (as one store's replay is);
* **clocks**: shard clocks agree once a commit has reached every shard, but a
  reply may catch them apart (another worker's commit reached one shard and not
  yet another, or failed half-way). The reply's ``clock`` is then the *least*
  shard clock, a base no shard can refuse as ahead of it; the client remembers
  each shard's own clock for the replies it handed out, so a commit whose
  ``base_clock`` is one of them is sent to every shard with the clock of the
  slice that shard served (staleness is exact per shard). An unknown
  ``base_clock`` goes to every shard as it is;
* **partial commits**: retries stay with the underlying clients (their
  idempotency keys make them safe). A commit that reached some shards and
  failed on others raises the error of the failed shard, naming it; sent
  again with the same key, it is an acknowledged replay where it was applied
  and applied where it was not, so each shard applies it exactly once.

Which rules shard correctly: a rule whose server step treats every element on
its own (``DistributedOptimizer.elementwise``) gives, on slices, the bytes it
gives on the whole tensors. Every registered rule is elementwise (checked by
``tests/unit/test_ps_shards.py`` against one store, byte for byte), ``Compressed``
as its inner rule is: its plan cuts at the codec's block ends and splits the
encoded layout (:meth:`~elephant.ps.shards.ShardPlan.split_commit`). Not
separable, and refused by :func:`check_shardable`:

* the store's ``norm_guard``: it compares a commit's L2 norm over *all* its
  tensors with the median of recent commits, so per-slice guards would judge
  different numbers and could refuse a commit on one shard only, leaving the
  shards apart; a client-computed norm would not help either, since shards
  applying commits in different orders keep different recent histories;
* any rule without ``elementwise = True`` (a custom rule that clips by a global
  norm, for instance).

In asynchronous mode two workers' commits may reach two shards in different
orders; each shard is then a correct store of its own, but a rule that uses
the clock (DynSGD's staleness) or the order of commits sees per-shard values.
``SparkModel.fit`` uses it in classic sessions (``SparkModel(ps_shards=)``):
the driver's :class:`~elephant.ps.sharded_store.ShardedStore` holds the
stores, one server each, and each task builds a :class:`ShardedClient` with
:func:`connect_shards`.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from elephant.errors import ConfigError, DataError, ElephantError, ProtocolError, PSError
from elephant.optimizers.base import DistributedOptimizer
from elephant.protocol import Commit, CommitKey, Reply
from elephant.ps.client import check_template, commit_what
from elephant.ps.shards import ShardPlan, check_per_shard
from elephant.ps.store import Store

logger = logging.getLogger(__name__)

__all__ = ["ShardedClient", "shard_stores", "check_shardable", "connect_shards"]

_METHODS = ("health", "pull", "commit", "finish", "metrics", "close")
#: Replies whose per-shard clocks a client remembers, for the base clocks of later commits.
CLOCK_MEMORY = 64


def check_shardable(optimizer: DistributedOptimizer, norm_guard: float | None = None) -> None:
    """Refuse what a sharded parameter server cannot apply as one store would.

    Raises:
        ConfigError: ``norm_guard`` is set, or ``optimizer`` does not declare
            ``elementwise = True``.
    """
    if norm_guard is not None:
        raise ConfigError("a sharded parameter server cannot apply `norm_guard`: it compares a commit's L2 norm over "
                          "all its tensors, which no shard sees; received norm_guard=" + repr(norm_guard))
    if not getattr(optimizer, "elementwise", False):
        raise ConfigError(f"{type(optimizer).__name__}'s server rule is not declared elementwise (elementwise=True), "
                          f"so a sharded parameter server cannot apply it to slices; received optimizer={optimizer!r}")


def shard_stores(center: Sequence[np.ndarray], plan: ShardPlan, optimizer: DistributedOptimizer, mode: str,
                 num_workers: int, run: str, *, round_timeout: float = 600.0, norm_guard: float | None = None,
                 clock: int = 0, states: Sequence[Any] | None = None) -> list[Store]:
    """One :class:`Store` per shard of ``plan``, each over its slice of ``center``, with the same ``optimizer``.

    Args:
        center: the full initial weights (``get_weights()`` order); each store copies its slice.
        plan: the :class:`ShardPlan` (from :func:`~elephant.ps.shards.plan_shards` over ``center``).
        optimizer, mode, num_workers, run, round_timeout, clock: as :class:`Store`'s, the
            same for every shard. Defaults: ``round_timeout=600``, ``clock=0``.
        norm_guard: must stay None (default); see :func:`check_shardable`.
        states: the rule's server state of each shard to start from (a resumed fit), one per shard;
            default None: each shard's ``optimizer.server_init`` over its slice.

    Raises:
        ConfigError: ``plan`` is not a :class:`ShardPlan`, the rule or ``norm_guard``
            cannot be sharded, or a :class:`Store` argument is invalid.
        DataError: ``center`` does not match ``plan``.
    """
    if not isinstance(plan, ShardPlan):
        raise ConfigError(f"`plan` must be a ShardPlan (from plan_shards); received plan={plan!r}")
    check_shardable(optimizer, norm_guard)
    if states is not None and len(states) != plan.num_shards:
        raise ConfigError(f"`states` must hold one rule state per shard ({plan.num_shards}); "
                          f"received {len(states)} states")
    states = [None] * plan.num_shards if states is None else list(states)
    return [Store(part, optimizer, mode, num_workers, run, round_timeout=round_timeout, clock=clock, state=state)
            for part, state in zip(plan.split(center), states)]


class ShardedClient:
    """The :class:`~elephant.ps.client.PSClient` interface over the ``S`` shards of a parameter server.

    Args:
        clients: one client per shard, in the plan's shard order: anything with
            ``health``, ``pull``, ``commit``, ``finish``, ``metrics`` and
            ``close`` (a :class:`PSClient` or an :class:`InProcessClient`). The
            sharded client owns them and closes them in :meth:`close`.
        plan: the :class:`~elephant.ps.shards.ShardPlan` the shards were built by.

    The requests to shards 1..S-1 run on a pool of ``S - 1`` threads the client
    owns (named ``elephant-ps-shards``), shard 0's in the calling thread; every
    call waits for all ``S`` answers. A client serves one task at a time, like
    :class:`PSClient`.

    Raises:
        ConfigError: ``plan`` is not a :class:`ShardPlan`, or ``clients`` is not
            one client per shard.
    """

    def __init__(self, clients: Sequence[Any], plan: ShardPlan):
        clients = check_per_shard(plan, clients, "clients", "client")
        for i, client in enumerate(clients):
            missing = [name for name in _METHODS if not callable(getattr(client, name, None))]
            if missing:
                raise ConfigError(f"`clients[{i}]` lacks the client method(s) {missing}; received {client!r}")
        self._clients, self._plan = clients, plan
        self._addresses = [str(getattr(c, "address", type(c).__name__)) for c in clients]
        self.address = "shards[" + ", ".join(self._addresses) + "]"
        self._pool: ThreadPoolExecutor | None = None
        if len(clients) > 1:
            self._pool = ThreadPoolExecutor(len(clients) - 1, thread_name_prefix="elephant-ps-shards")
        self._lock = threading.Lock()
        self._clocks: collections.OrderedDict[int, tuple[int, ...]] = collections.OrderedDict()
        self._closed = False

    plan = property(lambda self: self._plan, doc="The shard plan.")

    # ------------------------------------------------------------- fan-out
    def _fan(self, what: str, call: Callable[[int, Any], Any]) -> list[Any]:
        """``call(i, client)`` for every shard, in parallel; raise the first shard's error, naming it."""
        if self._closed:
            raise PSError(f"{what} to {self.address}: the sharded client is closed")
        futures = [self._pool.submit(call, i, c) for i, c in enumerate(self._clients[1:], 1)] if self._pool else []
        results: list[Any] = [None] * len(self._clients)
        errors: list[tuple[int, Exception]] = []
        try:
            results[0] = call(0, self._clients[0])
        except Exception as exc:
            errors.append((0, exc))
        for i, future in enumerate(futures, 1):
            try:
                results[i] = future.result()
            except Exception as exc:
                errors.append((i, exc))
        if errors:
            raise self._shard_error(what, errors)
        return results

    def _shard_error(self, what: str, errors: list[tuple[int, Exception]]) -> Exception:
        for i, exc in errors:
            logger.warning("%s: shard %d of %d (%s) failed: %s", what, i, len(self._clients), self._addresses[i], exc)
        i, exc = errors[0]
        where = f"shard {i} of {len(self._clients)} ({self._addresses[i]})"
        more = f" (shards {[j for j, _ in errors[1:]]} failed too)" if len(errors) > 1 else ""
        error: Exception
        if isinstance(exc, ElephantError):
            try:
                error = type(exc)(f"{where}: {exc}{more}")
            except TypeError:
                error = PSError(f"{where}: {exc}{more}")
        else:
            error = PSError(f"{what} to {where} failed: {exc!r}{more}")
        error.__cause__ = exc
        return error

    def _join(self, replies: list[Reply], what: str) -> Reply:
        """One reply from the shards' replies (see the module docstring for the clock)."""
        clocks = tuple(int(r.clock) for r in replies)
        try:
            center = self._plan.join([r.center for r in replies])
            tensors = None if any(r.tensors is None for r in replies) else self._plan.join([r.tensors for r in replies])
        except DataError as exc:
            raise PSError(f"{what}: the replies of {self.address} do not fit the shard plan: {exc}") from None
        for a in center + (tensors or []):
            a.setflags(write=False)
        clock = min(clocks)
        if clock != max(clocks):
            logger.debug("%s: shard clocks %s disagree; the reply's clock is the least, %d", what, clocks, clock)
        with self._lock:
            self._clocks[clock] = clocks
            self._clocks.move_to_end(clock)
            while len(self._clocks) > CLOCK_MEMORY:
                self._clocks.popitem(last=False)
        return Reply(clock=clock, center=center, tensors=tensors)

    def _checked(self, reply: Reply, template: Sequence[Any] | None, what: str) -> Reply:
        try:
            return check_template(reply, template)
        except ProtocolError as exc:
            raise PSError(f"{what}: {self.address} sent an invalid reply: {exc}") from None

    def _base_clocks(self, base_clock: int) -> tuple[int, ...]:
        with self._lock:
            return self._clocks.get(int(base_clock), (base_clock,) * len(self._clients))

    # ------------------------------------------------------------------ API
    def health(self) -> dict[str, Any]:
        """``{"status", "run", "clock", "mode", "shards"}``: status "ok" when every shard says so, the least
        clock, and every shard's own answer under ``"shards"``."""
        answers = self._fan("health check", lambda i, c: c.health())
        first = answers[0]
        return {"status": "ok" if all(a.get("status") == "ok" for a in answers) else "degraded",
                "run": first.get("run"), "clock": min(int(a.get("clock", 0)) for a in answers),
                "mode": first.get("mode"), "shards": answers}

    def pull(self, worker: int, template: Sequence[Any] | None = None, epoch: int | None = None) -> Reply:
        """The joined center and the least shard clock, checked against ``template`` if given."""
        what = f"pull (worker {worker})"
        replies = self._fan(what, lambda i, c: c.pull(worker, epoch=epoch))
        return self._checked(self._join(replies, what), template, what)

    def commit(self, key: CommitKey, attempt: int, commit: Commit, template: Sequence[Any] | None = None) -> Reply:
        """Send each shard its slice of ``commit``; the joined reply."""
        key = CommitKey(*key)
        what = commit_what(key, attempt)
        try:
            parts = self._plan.split_commit(commit.tensors)
        except DataError as exc:
            raise PSError(f"{what} rejected by {self.address}: {exc}") from None
        bases = self._base_clocks(commit.base_clock)

        def send(i: int, client: Any) -> Reply:
            return client.commit(key, attempt, Commit(tensors=parts[i], num_steps=commit.num_steps,
                                                      num_samples=commit.num_samples, base_clock=bases[i]))

        return self._checked(self._join(self._fan(what, send), what), template, what)

    def finish(self, run: str, epoch: int, partition: int, attempt: int, stats: dict | None = None) -> None:
        """Tell every shard that ``partition`` has no more data in ``epoch``; ``stats`` go to shard 0 (which
        holds the course of a fit run as one job)."""
        what = f"finish (run {run}, epoch {epoch}, partition {partition}, attempt {attempt})"
        reported = [] if stats is None else [stats]
        self._fan(what, lambda i, c: c.finish(run, epoch, partition, attempt, *(reported if i == 0 else [])))

    def next_epoch(self, epoch: int, job: int | None = None) -> dict[str, Any]:
        """Shard 0's course: the next epoch (:meth:`~elephant.ps.client.PSClient.next_epoch`)."""
        return self._clients[0].next_epoch(epoch, job)

    def metrics(self) -> dict[str, Any]:
        """``run``, ``mode`` and ``num_workers`` (shard 0's), the least ``clock``, ``bytes_in`` and
        ``bytes_out`` summed, and every shard's own metrics under ``"shards"``."""
        answers = self._fan("metrics", lambda i, c: c.metrics())
        first = answers[0]
        return {"run": first.get("run"), "mode": first.get("mode"), "num_workers": first.get("num_workers"),
                "clock": min(int(a.get("clock", 0)) for a in answers),
                "bytes_in": sum(int(a.get("bytes_in", 0)) for a in answers),
                "bytes_out": sum(int(a.get("bytes_out", 0)) for a in answers), "shards": answers}

    def close(self) -> None:
        """Stop the thread pool and close every shard's client (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        failed: list[tuple[int, Exception]] = []
        for i, client in enumerate(self._clients):
            try:
                client.close()
            except Exception as exc:
                failed.append((i, exc))
        if failed:
            raise self._shard_error("close", failed)

    def __enter__(self) -> ShardedClient:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ShardedClient({self.address!r}, shards={self._plan.num_shards})"

    def __reduce__(self):
        raise TypeError("ShardedClient holds a thread pool and open clients; build one inside each Spark task from "
                        "the shards' urls, the token and the plan")


def connect_shards(urls: Sequence[str], token: str, plan: Any = None, **options: Any) -> Any:
    """The client a Spark task talks to its parameter server through, built inside the task.

    Args:
        urls: the shards' urls in the plan's shard order (one url: an unsharded server).
        token: the run's bearer token.
        plan: the :class:`ShardPlan`, or its :meth:`~ShardPlan.as_data` (what a task spec carries);
            needed for more than one url, ignored for one.
        **options: keyword arguments of every :class:`~elephant.ps.client.PSClient` (``read_timeout``...).

    Returns:
        For one url the :class:`~elephant.ps.client.PSClient` itself; for more a
        :class:`ShardedClient` over one :class:`PSClient` per url (it closes them).

    Raises:
        ConfigError: no url, or several without a plan of as many shards.
    """
    from elephant.ps.client import PSClient

    urls = list(urls)
    if not urls:
        raise ConfigError("`urls` must hold the url of every shard; received none")
    if len(urls) == 1:
        return PSClient(urls[0], token, **options)
    if plan is None:
        raise ConfigError(f"{len(urls)} shard urls need the shard plan; received plan=None")
    plan = plan if isinstance(plan, ShardPlan) else ShardPlan.from_data(plan)
    clients = []
    try:
        for url in urls:
            clients.append(PSClient(url, token, **options))
        return ShardedClient(clients, plan)
    except BaseException:
        for client in clients:
            client.close()
        raise
