"""The parameter server's state: center weights, clock, idempotency, rounds (no HTTP).

:class:`Store` owns the center variable and calls the distributed optimizer's
server rule (the runtime half of :mod:`elephant.optimizers.base`):

* **asynchronous**: validation, fencing, deduplication, the rule, the clock
  increment and the staleness record of a commit form one critical section;
* **hogwild**: fencing and deduplication are bookkept under the lock but the
  rule runs without it, so concurrent commits can overwrite each other's
  update (lost updates; racy by design, for experiments only);
* **synchronous**: a round is ``(epoch, step)``; each commit waits until every
  active partition of the epoch has committed that step or finished, then
  ``apply_round`` runs once and every waiter gets the round's result.

Idempotency: a commit whose key ``(run, epoch, partition, step)`` was applied
is acknowledged with the current center and not applied again (first apply
wins). Fencing: per ``(epoch, partition)`` the highest Spark
``taskAttemptId()`` seen wins; lower attempts get :class:`StaleAttemptError`.
With an SSP ``staleness_bound`` a pull (and the reply to a commit, which
doubles as the next pull) waits for admission (optimizers.md §10.2). Rounds
and admission are kept by a :class:`elephant.ps.rounds.Rounds` that the store
holds; the store fences, checks and waits, and applies a closed round's rule.

The center arrays are read-only snapshots that updates replace and never
mutate, so replies hand them out without copying.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from elephant.errors import (
    ConfigError,
    ElephantError,
    NormGuardError,
    PSError,
    ProtocolError,
    RolledBackError,
    RoundTimeoutError,
    StaleAttemptError,
    StoreClosedError,
)
from elephant.optimizers.base import DistributedOptimizer
from elephant.optimizers.codecs import encode_change
from elephant.optimizers.compress import check_reply_mode
from elephant.protocol import MODES, Commit, CommitKey, Reply, ReplyChange, ssp_admitted
from elephant.ps.rounds import Epoch, RoundRule, Rounds, Ticket
from elephant.ps.wire import all_finite, digest

logger = logging.getLogger(__name__)

__all__ = ["CommitKey", "Store", "Snapshot", "Outcome", "StaleAttemptError", "RoundTimeoutError", "StoreClosedError",
           "RolledBackError", "NormGuardError", "ssp_admitted"]

_COUNTERS = (
    "commits_applied", "rounds_applied", "replays_dropped", "stale_attempts_fenced",
    "commits_rejected", "pulls", "bytes_in", "bytes_out", "epochs_rolled_back", "commits_rolled_back",
    "commits_norm_refused", "samples_applied",
)

#: Commits whose norms the guard remembers, and how many it needs before it judges.
NORM_WINDOW, NORM_WARMUP = 64, 16


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What :meth:`Store.rollback` returns to: the store between two epochs."""

    center: list
    state: Any
    clock: int
    ledger_size: int
    epochs: frozenset
    latest_epoch: int | None


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a store served since it was made: handed from a store hosted elsewhere to :meth:`Store.absorb`.

    A fit from a Spark Connect client serves each epoch from a store inside a
    Spark task (:mod:`elephant.fit.connect`); the client's own store takes the
    epoch's result from it.
    """

    center: list
    state: Any
    clock: int
    ledger: list
    counts: dict
    staleness: dict


def _freeze(arrays: Sequence[Any]) -> list[np.ndarray]:
    out = [np.asarray(a) for a in arrays]
    for a in out:
        a.setflags(write=False)
    return out


def _squared_norm(t: Any) -> float:
    """``‖t‖²``; integer tensors (an encoded commit's codes) in float64, where their own dtype would overflow."""
    t = np.asarray(t)
    if t.dtype.kind in "iub":
        t = t.astype(np.float64)
    return float(np.vdot(t, t).real)


def _int_arg(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ProtocolError(f"`{name}` must be an int >= 0; received {name}={value!r}")
    return int(value)


class Store:
    """Center weights, clock and bookkeeping of one fit; thread-safe.

    Args:
        center: initial weights (Keras ``get_weights()`` order); copied.
        optimizer: the distributed optimizer whose server rule is applied.
        mode: ``"synchronous"``, ``"asynchronous"`` or ``"hogwild"``; one of
            ``optimizer.modes``.
        num_workers: number of partitions; ids are ``0..num_workers-1`` and
            every epoch starts with all of them active. Every partition must
            commit or call :meth:`finish`, or rounds and SSP admissions wait.
        run: the fit's run id; requests naming another run are rejected.
        round_timeout: seconds a synchronous round or an SSP admission may
            wait before :class:`RoundTimeoutError`. Default 600.
        state: the rule's server state to start from (a resumed fit);
            default ``optimizer.server_init(center, num_workers)``.
        clock: the clock to start from (a store that goes on from another's
            :class:`Outcome`). Default 0.
        norm_guard: refuse a commit whose L2 norm exceeds ``norm_guard``
            times the median of the last 64 accepted ones (once 16 were
            accepted), with :class:`NormGuardError`. Default None (off).

    Raises:
        ConfigError: an invalid argument, or ``mode`` not in ``optimizer.modes``.
    """

    def __init__(self, center: Sequence[np.ndarray], optimizer: DistributedOptimizer, mode: str,
                 num_workers: int, run: str, round_timeout: float = 600.0, state: Any = None,
                 norm_guard: float | None = None, clock: int = 0):
        if mode not in MODES:
            raise ConfigError(f"`mode` must be one of {MODES}; received mode={mode!r}")
        if mode not in optimizer.modes:
            raise ConfigError(f"{type(optimizer).__name__} supports modes {optimizer.modes}; received mode={mode!r}")
        check_reply_mode(optimizer, mode)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ConfigError(f"`num_workers` must be a positive int; received num_workers={num_workers!r}")
        if not isinstance(run, str) or not run:
            raise ConfigError(f"`run` must be a non-empty str; received run={run!r}")
        if not (isinstance(round_timeout, (int, float)) and round_timeout > 0):
            raise ConfigError(f"`round_timeout` must be > 0 seconds; received round_timeout={round_timeout!r}")
        self._center = _freeze([np.array(a, copy=True) for a in center])
        self._commit_template = optimizer.commit_template(self._center)  # the center's structure, or an encoded layout
        self._optimizer, self._mode, self._num_workers, self._run = optimizer, mode, num_workers, run
        self._round_timeout = float(round_timeout)
        if norm_guard is not None and not (isinstance(norm_guard, (int, float)) and not isinstance(norm_guard, bool)
                                           and math.isfinite(norm_guard) and norm_guard > 1):
            raise ConfigError(f"`norm_guard` must be a number > 1 or None; received norm_guard={norm_guard!r}")
        self._norm_guard = None if norm_guard is None else float(norm_guard)
        self._norms: collections.deque[float] = collections.deque(maxlen=NORM_WINDOW)
        self._state = optimizer.server_init(self.center(), num_workers) if state is None else state
        self._clock = _int_arg("clock", clock)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._bytes_lock = threading.Lock()
        self._rounds = Rounds(optimizer, mode, num_workers, self._round_timeout, self._cond, self._apply_round)
        self._epochs: dict[int, Epoch] = {}
        self._latest_epoch: int | None = None
        self._ledger: list[tuple[CommitKey, int]] = []
        self._retired: set[str] = set()  # run ids of rolled-back epoch tries
        self._closed = False
        self._waiting = 0  # requests blocked in a round or an SSP admission
        self._counts: Counter[str] = Counter()
        self._staleness: Counter[int] = Counter()
        #: With compressed replies (the rule's ``reply_codec``): the workers' view of the center and its digest.
        self._view: list[np.ndarray] | None = None
        self._view_digest: str | None = None
        self._reset_view()
        logger.info("store of run %s: mode=%s, optimizer=%r, num_workers=%d, %d tensors, %d bytes", run, mode,
                    optimizer, num_workers, len(self._center), sum(a.nbytes for a in self._center))

    # ------------------------------------------------------------------ reads
    run = property(lambda self: self._run, doc="The fit's run id.")
    mode = property(lambda self: self._mode, doc="The synchronisation mode.")
    num_workers = property(lambda self: self._num_workers, doc="Number of partitions.")
    optimizer = property(lambda self: self._optimizer, doc="The distributed optimizer.")
    clock = property(lambda self: self._clock, doc="Commits (asynchronous) or rounds (synchronous) applied.")
    round_timeout = property(lambda self: self._round_timeout, doc="Seconds a round or an SSP admission may wait.")
    streams_rounds = property(
        lambda self: self._mode == "synchronous" and self._optimizer.streams_rounds,
        doc="Whether synchronous rounds are summed as their commits arrive (the rule's ``streams_rounds``).")
    template = property(lambda self: list(self._center), doc="The center as read-only arrays (shapes, dtypes).")
    commit_template = property(lambda self: list(self._commit_template),
                               doc="Arrays with the shapes and dtypes of a commit (the rule's ``commit_template``).")

    def center(self) -> list[np.ndarray]:
        """A writable copy of the center weights."""
        return [np.array(a, copy=True) for a in self._center]

    def ledger(self) -> list[tuple[CommitKey, int]]:
        """Applied ``(key, attempt)`` pairs in apply order."""
        with self._lock:
            return list(self._ledger)

    def metrics(self) -> dict[str, Any]:
        """Counters, the staleness histogram ``{tau: count}`` with its mean and max, and more."""
        with self._lock, self._bytes_lock:
            hist = dict(sorted(self._staleness.items()))
            total = sum(hist.values())
            out: dict[str, Any] = {name: self._counts[name] for name in _COUNTERS}
            out.update(run=self._run, mode=self._mode, clock=self._clock, num_workers=self._num_workers,
                       staleness=hist, staleness_max=max(hist, default=0), waiting=self._waiting,
                       staleness_mean=sum(t * c for t, c in hist.items()) / total if total else 0.0)
            return out

    @property
    def samples_applied(self) -> int:
        """Samples trained in the commits applied so far (read without the lock, for progress displays)."""
        return self._counts["samples_applied"]

    def count_bytes(self, received: int, sent: int) -> None:
        """Add request and response body sizes to the metrics (called by the app)."""
        with self._bytes_lock:  # not the store lock: an apply may hold that for a while
            self._counts["bytes_in"] += received
            self._counts["bytes_out"] += sent

    def learning_rate_changed(self, ratio: float) -> None:
        """Tell the rule that the user's learning rate was multiplied by ``ratio`` (between epochs).

        Raises:
            ProtocolError: ``ratio`` is negative or not finite.
            PSError: the rule's hook failed (its state is unchanged).
        """
        if not (isinstance(ratio, (int, float)) and math.isfinite(ratio) and ratio >= 0):
            raise ProtocolError(f"a learning-rate ratio must be a finite number >= 0; received {ratio!r}")
        with self._cond:
            try:
                self._state = self._optimizer.on_learning_rate_change(self._state, float(ratio))
            except Exception as exc:
                raise PSError(f"{type(self._optimizer).__name__}.on_learning_rate_change failed: {exc!r}") from exc

    def snapshot(self) -> Snapshot:
        """The store as it is now, for :meth:`rollback` (taken between epochs).

        The center arrays are immutable and shared; the rule's state is deep-copied,
        since a rule may update its arrays in place.
        """
        with self._cond:
            return Snapshot(center=list(self._center), state=copy.deepcopy(self._state), clock=self._clock,
                            ledger_size=len(self._ledger), epochs=frozenset(self._epochs),
                            latest_epoch=self._latest_epoch)

    def outcome(self) -> Outcome:
        """The center, the rule's state, the clock, the applied keys and the counters, for :meth:`absorb`."""
        with self._cond, self._bytes_lock:
            return Outcome(center=list(self._center), state=copy.deepcopy(self._state), clock=self._clock,
                           ledger=list(self._ledger), counts=dict(self._counts), staleness=dict(self._staleness))

    def absorb(self, outcome: Outcome) -> None:
        """Go on from ``outcome``, an epoch served by another store that started from this one's state.

        The center, the rule's state and the clock become the outcome's; its
        applied keys and counters are added to this store's.
        """
        with self._cond, self._bytes_lock:
            self._center = _freeze(outcome.center)
            self._state, self._clock = outcome.state, outcome.clock
            self._reset_view()
            self._ledger.extend(outcome.ledger)
            self._counts.update(outcome.counts)
            self._staleness.update(outcome.staleness)

    def rollback(self, snapshot: Snapshot, run: str) -> int:
        """Undo everything applied since ``snapshot`` and serve the new run id ``run`` from now on.

        The center, the rule's state, the clock and the ledger return to the
        snapshot; the bookkeeping of the epochs begun since (applied keys,
        attempts, rounds) is dropped, so the epoch can be trained again. The
        old run id is refused from now on: a task of the rolled-back try that
        is still running can neither commit nor finish, and one waiting in a
        round or an SSP admission is woken with :class:`RolledBackError`.

        Returns:
            The number of commits undone.
        """
        if not isinstance(run, str) or not run or run == self._run:
            raise ConfigError(f"a rollback needs a new run id; received run={run!r} (current {self._run!r})")
        with self._cond:
            undone = len(self._ledger) - snapshot.ledger_size
            for epoch in set(self._epochs) - snapshot.epochs:
                self._rounds.abandon(self._epochs.pop(epoch), "the epoch was rolled back")
            del self._ledger[snapshot.ledger_size:]
            self._center, self._clock = list(snapshot.center), snapshot.clock
            self._reset_view()
            self._state = copy.deepcopy(snapshot.state)  # the snapshot stays valid for another rollback
            self._latest_epoch = snapshot.latest_epoch
            self._retired.add(self._run)
            self._run = run
            self._counts["epochs_rolled_back"] += 1
            self._counts["commits_rolled_back"] += undone
            self._cond.notify_all()
        logger.warning("rolled back %d commits; serving run %s", undone, run)
        return undone

    def close(self) -> None:
        """Refuse further requests; wake every waiting one with :class:`StoreClosedError`."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ---------------------------------------------------------------- helpers
    def _reset_view(self) -> None:
        """With compressed replies, the workers' view becomes the center (at the start, a new epoch, a rollback)."""
        if self._optimizer.reply_codec is not None:
            self._view = list(self._center)
            self._view_digest = digest(self._view)

    def _reply(self, tensors: Any = None) -> Reply:
        """A reply with the center as the workers hold it: the view, with compressed replies (lock held)."""
        if self._view is None:
            return Reply(clock=self._clock, center=list(self._center), tensors=tensors)
        return Reply(clock=self._clock, center=list(self._view), tensors=tensors, view=self._view_digest)

    def _epoch(self, epoch: int) -> Epoch:
        if epoch not in self._epochs:
            self._epochs[epoch] = Epoch(commits=[0] * self._num_workers)
            self._reset_view()  # each epoch's workers start from the exact center
            self._latest_epoch = max(epoch, self._latest_epoch if self._latest_epoch is not None else epoch)
        return self._epochs[epoch]

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self._num_workers:
            raise ProtocolError(f"partition {partition} is out of range for num_workers={self._num_workers}")

    def _fence(self, run: str, epoch: int, partition: int, attempt: int, what: str) -> Epoch:
        """Closed check, run check and attempt fencing; the caller holds the lock."""
        if self._closed:
            raise StoreClosedError(f"{what}: the parameter server of run {self._run} is shutting down")
        self._check_current(run, what)
        if run != self._run:
            self._counts["commits_rejected"] += 1
            raise ProtocolError(f"{what} names run {run!r} but this parameter server serves run {self._run!r}")
        ep = self._epoch(epoch)
        highest = ep.attempts.get(partition, -1)
        if attempt < highest:
            error = self._superseded(f"{what} was superseded by task attempt {highest} of the same partition")
            logger.warning("fenced %s: task attempt %d of the partition superseded it", what, highest)
            raise error
        ep.attempts[partition] = attempt
        return ep

    def _check_current(self, run: str, what: str) -> None:
        """Raise :class:`RolledBackError` if ``run`` was rolled back (lock held)."""
        if run in self._retired:
            raise self._superseded(f"{what}: its epoch try was rolled back; run {self._run} replaces {run}",
                                   RolledBackError)

    def _superseded(self, message: str, kind: type[StaleAttemptError] = StaleAttemptError) -> StaleAttemptError:
        """Count a fenced request and return its error (lock held)."""
        self._counts["stale_attempts_fenced"] += 1
        return kind(message)

    def _validate(self, key: CommitKey, attempt: int, commit: Commit, check_finite: bool) -> str:
        """Lock-free structural checks (the center's structure never changes)."""
        ints = [_int_arg(n, v) for n, v in zip(("epoch", "partition", "step", "attempt"), (*key[1:], attempt))]
        what = f"commit (run {key.run}, epoch {ints[0]}, partition {ints[1]}, step {ints[2]}, attempt {attempt})"
        try:
            self._check_partition(key.partition)
            for name in ("num_steps", "num_samples", "base_clock"):
                _int_arg(name, getattr(commit, name))
            if len(commit.tensors) != len(self._commit_template):
                raise ProtocolError(f"expected {len(self._commit_template)} tensors, received {len(commit.tensors)}")
            for i, (c, t) in enumerate(zip(self._commit_template, commit.tensors)):
                if getattr(t, "shape", None) != c.shape or getattr(t, "dtype", None) != c.dtype:
                    got = f"{getattr(t, 'dtype', type(t).__name__)}{list(getattr(t, 'shape', ()))}"
                    raise ProtocolError(f"tensor {i}: expected {c.dtype}{list(c.shape)}, received {got}")
                if check_finite and not all_finite(t):
                    raise ProtocolError(f"tensor {i} holds non-finite values (NaN or inf)")
        except ProtocolError as exc:
            with self._lock:
                self._counts["commits_rejected"] += 1
            raise ProtocolError(f"{what}: {exc}") from None
        return what

    def _checked(self, what: str, call: Callable[[], tuple]) -> tuple:
        """Run a server rule; wrap its failure and check the new center's structure."""
        name = type(self._optimizer).__name__
        try:
            new_center, replies, state = call()
        except ElephantError:
            raise
        except Exception as exc:
            raise PSError(f"{what}: the server rule of {name} failed: {exc!r}") from exc
        if len(new_center) != len(self._center):
            raise PSError(f"{what}: {name}'s server rule returned {len(new_center)} tensors, expected {len(self._center)}")
        for i, (c, t) in enumerate(zip(self._center, new_center)):
            if np.shape(t) != c.shape or np.asarray(t).dtype != c.dtype:
                raise PSError(f"{what}: {name}'s server rule returned {np.asarray(t).dtype}{list(np.shape(t))} "
                              f"for tensor {i}, expected {c.dtype}{list(c.shape)}")
        return _freeze(new_center), replies, state

    def _record(self, ep: Epoch, key: CommitKey, attempt: int, commit: Commit, clock_before: int) -> None:
        ep.applied.add((key.partition, key.step))
        ep.commits[key.partition] += 1
        self._ledger.append((key, attempt))
        self._counts["commits_applied"] += 1
        self._counts["samples_applied"] += commit.num_samples
        self._staleness[clock_before - commit.base_clock] += 1

    def _norm(self, commit: Commit) -> float | None:
        """The commit's L2 norm when the guard is on (computed before the lock is taken)."""
        if self._norm_guard is None:
            return None
        return math.sqrt(sum(_squared_norm(t) for t in commit.tensors))

    def _check_norm(self, norm: float | None, what: str) -> None:
        """Refuse a norm far beyond the recent ones (lock held); remember an accepted one."""
        if norm is None:
            return
        if len(self._norms) >= NORM_WARMUP:
            typical = float(np.median(self._norms))
            if norm > self._norm_guard * typical:
                self._counts["commits_norm_refused"] += 1
                logger.warning("%s refused: norm %.3g is over %g x the recent median %.3g", what, norm,
                               self._norm_guard, typical)
                raise NormGuardError(f"{what}: its norm {norm:.3g} is over norm_guard={self._norm_guard:g} times "
                                     f"the median {typical:.3g} of the last {len(self._norms)} commits; not applied")
        self._norms.append(norm)

    def _check_base_clock(self, commit: Commit, what: str) -> None:
        if commit.base_clock > self._clock:
            raise ProtocolError(f"{what}: base_clock {commit.base_clock} is ahead of the server clock {self._clock}")

    def _wait(self, ready: Callable[[], bool], on_timeout: Callable[[], str]) -> None:
        """Wait (lock held) until ``ready()``; after ``round_timeout`` raise with ``on_timeout()``'s message."""
        deadline = time.monotonic() + self._round_timeout
        run = self._run
        self._waiting += 1
        try:
            while not ready():
                if self._closed:
                    raise StoreClosedError(f"the parameter server of run {self._run} is shutting down")
                if self._run != run:
                    raise RolledBackError(f"run {run} was rolled back while this request waited")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    message = on_timeout()
                    logger.warning("%s", message)
                    raise RoundTimeoutError(message)
                self._cond.wait(remaining)
        finally:
            self._waiting -= 1

    def _replay(self, what: str) -> None:
        self._counts["replays_dropped"] += 1
        logger.info("acknowledged a replay of the applied %s", what)

    def _admit(self, ep: Epoch, epoch: int, partition: int, what: str) -> None:
        """Block (lock held) until SSP admits ``partition`` to start a window."""
        admission = self._rounds.admission(ep, epoch, partition, what)
        if admission is not None:
            self._wait(*admission)

    def _admitted_reply(self, ep: Epoch, key: CommitKey, what: str, tensors: Any, pulled: bool = False) -> Reply:
        """The reply doubles as the next pull: wait for SSP admission; if the wait (or a
        replay) hands out a center other than the rule's own result, tell the rule it was pulled."""
        clock = self._clock
        self._admit(ep, key.epoch, key.partition, what)
        if pulled or self._clock != clock:
            self._state = self._optimizer.on_pull(self._state, self._center, self._clock, key.partition)
        return self._reply(tensors)

    def _round_result(self, ticket: Ticket, key: CommitKey, what: str) -> Callable[[], Reply]:
        """The wait for the result of the round that ``ticket``'s commit was entered in."""

        def wait() -> Reply:
            with self._cond:
                self._wait(lambda: ticket.done, lambda: self._rounds.withdraw(ticket))
                self._check_current(key.run, what)
                reply = self._rounds.result(ticket)
                if ticket.newer_attempt is not None:
                    raise self._superseded(f"{what} was superseded by task attempt {ticket.newer_attempt} in its round")
                return reply

        return wait

    def _apply_round(self, ep: Epoch, what: str, rule: RoundRule,
                     entries: list[tuple[CommitKey, int, Commit]]) -> tuple[int, list, Any, dict]:
        """Run a closed round's ``rule`` on the center and record its commits (lock held; called by the rounds).

        Returns the new clock, the center the workers get (with compressed replies, their view of it), the
        rule's replies and the rest of the round's :class:`Reply` (with compressed replies, the view's digest and
        the encoded change); raises :class:`PSError` (nothing changed) if the rule failed or returned tensors
        unlike the center.
        """
        clock, state, center = self._clock, self._state, self._center
        self._center, replies, self._state = self._checked(what, lambda: rule(state, center, clock))
        self._clock += 1
        self._counts["rounds_applied"] += 1
        for key, attempt, commit in entries:
            self._record(ep, key, attempt, commit, clock)
        codec = self._optimizer.reply_codec
        if codec is None:
            return self._clock, self._center, replies, {}
        layout, view = encode_change(codec, self._view, self._center)  # once per round, whatever the workers
        change = ReplyChange(self._view_digest, clock, codec.name, codec.block, _freeze(layout))
        self._view, self._view_digest = _freeze(view), digest(view)
        return self._clock, self._view, replies, {"view": self._view_digest, "change": change}

    # -------------------------------------------------------------- requests
    def pull(self, worker: int, epoch: int | None = None) -> Reply:
        """The center and clock for ``worker``, as read-only arrays.

        With an SSP ``staleness_bound`` the pull waits while ``worker`` is more
        than ``s`` commits ahead of the slowest active worker of ``epoch``
        (default: the latest epoch seen).

        Raises:
            ProtocolError: ``worker`` or ``epoch`` is invalid.
            RoundTimeoutError: admission waited longer than ``round_timeout``.
            StoreClosedError: the store is closed.
        """
        worker = _int_arg("worker", worker)
        self._check_partition(worker)
        what = f"pull (worker {worker})"
        with self._cond:
            if self._closed:
                raise StoreClosedError(f"{what}: the parameter server of run {self._run} is shutting down")
            epoch = self._latest_epoch if epoch is None else _int_arg("epoch", epoch)
            if epoch is not None:
                self._admit(self._epoch(epoch), epoch, worker, what)
            self._state = self._optimizer.on_pull(self._state, self._center, self._clock, worker)
            self._counts["pulls"] += 1
            return self._reply()

    def finish(self, run: str, epoch: int, partition: int, attempt: int) -> None:
        """``partition`` has no more data in ``epoch``: it leaves rounds and the SSP minimum.

        Raises:
            StaleAttemptError: a newer attempt of the partition was seen.
            ProtocolError: wrong run, or an invalid epoch, partition or attempt.
        """
        epoch, partition, attempt = (_int_arg(n, v) for n, v in zip(("epoch", "partition", "attempt"),
                                                                     (epoch, partition, attempt)))
        self._check_partition(partition)
        what = f"finish (run {run}, epoch {epoch}, partition {partition}, attempt {attempt})"
        with self._cond:
            ep = self._fence(run, epoch, partition, attempt, what)
            ep.finished.add(partition)
            self._rounds.close_ready(ep)
            self._cond.notify_all()

    def wait_finished(self, epoch: int, timeout: float | None = None) -> bool:
        """Block until every partition has called :meth:`finish` for ``epoch``, or ``timeout`` seconds passed.

        A server hosted by a task of the epoch's own stage waits here before it
        stops, a while at a time, checking between waits that the other shards'
        servers still run (:func:`elephant.fit.hosted.train_hosted`).

        Args:
            epoch: the epoch.
            timeout: seconds to wait at most; None (default): no limit.

        Returns:
            Whether every partition finished (False: the time ran out first).

        Raises:
            StoreClosedError: the store was closed while waiting.
        """
        epoch = _int_arg("epoch", epoch)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while len(self._epoch(epoch).finished) < self._num_workers:
                if self._closed:
                    raise StoreClosedError(f"the parameter server of run {self._run} is shutting down")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def commit(self, key: CommitKey, attempt: int, commit: Commit, *, check_finite: bool = True) -> Reply:
        """Apply (or acknowledge a replay of) one commit; return the new center.

        Args:
            key: the idempotency key ``(run, epoch, partition, step)``.
            attempt: the Spark task attempt id (``TaskContext.taskAttemptId()``).
            commit: the worker rule's payload.
            check_finite: reject NaN and inf (default True; the HTTP app passes
                False because the wire decoder already checked).

        Returns:
            Clock and center after the commit (after its round in synchronous
            mode; after SSP admission for the next window with a staleness
            bound) and the rule's reply tensors (None for a replay).

        Raises:
            ProtocolError: wrong run, invalid key, or tensors unlike the center
                (count, shape, dtype, finite); nothing is applied.
            StaleAttemptError: a newer attempt of the partition was seen.
            RoundTimeoutError: the round or the SSP admission waited too long.
            StoreClosedError: the store is closed.
            PSError: the server rule failed (the center is unchanged).
        """
        return self.submit(key, attempt, commit, check_finite=check_finite)()

    def submit(self, key: CommitKey, attempt: int, commit: Commit, *,
               check_finite: bool = True) -> Callable[[], Reply]:
        """:meth:`commit` in two steps: hand the commit over, then wait for the reply.

        Returns a function that waits (in synchronous mode, for the round to
        close) and returns the reply, raising as :meth:`commit` does. Errors
        found on hand-over (validation, fencing, norm) are raised here. With a
        rule that streams rounds the commit is summed into its round before this
        returns and the store keeps none of its tensors, so a caller that drops
        its own references (the HTTP app does) lets them go while the round
        waits for the other partitions: the server then holds about one model
        per round, not one per partition.
        """
        key = CommitKey(*key)
        what = self._validate(key, attempt, commit, check_finite)
        norm = self._norm(commit)
        with self._cond:
            ep = self._fence(key.run, key.epoch, key.partition, attempt, what)
            if (key.partition, key.step) in ep.applied:
                self._replay(what)
                reply = self._admitted_reply(ep, key, what, None, pulled=True)
                return lambda: reply
            self._check_base_clock(commit, what)
            self._check_norm(norm, what)
            if self._mode == "synchronous":
                return self._round_result(self._rounds.enter(ep, key, attempt, commit, what), key, what)
            ep.applied.add((key.partition, key.step))  # claimed: a concurrent replay is dropped
            snapshot = (self._state, self._center, self._clock)
            if self._mode == "asynchronous":
                reply = self._apply_claimed(ep, key, attempt, commit, what, snapshot)
                return lambda: reply
        # hogwild: the rule runs without the lock; a concurrent commit may read the
        # same center, and then one of the two updates is lost.
        reply = self._apply_claimed(ep, key, attempt, commit, what, snapshot)
        return lambda: reply

    def _apply_claimed(self, ep: Epoch, key: CommitKey, attempt: int, commit: Commit, what: str,
                       snapshot: tuple) -> Reply:
        """Apply a claimed commit (lock held in asynchronous mode, taken here in hogwild)."""
        guard = self._cond if self._mode == "hogwild" else contextlib.nullcontext()
        state, center, clock = snapshot
        try:
            new_center, tensors, state = self._checked(
                what, lambda: self._optimizer.apply(state, center, clock, key.partition, commit))
        except BaseException:
            with guard:
                ep.applied.discard((key.partition, key.step))
            raise
        with guard:
            self._center, self._state = new_center, state
            self._clock += 1
            self._record(ep, key, attempt, commit, clock)
            self._cond.notify_all()
            return self._admitted_reply(ep, key, what, tensors)
