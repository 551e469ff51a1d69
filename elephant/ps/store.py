"""The parameter server's state: center weights, clock, idempotency, rounds (no HTTP).

:class:`Store` owns the center variable and calls the distributed optimizer's
server rule (the runtime half of :mod:`elephant.optimizers.base`):

* **asynchronous**: validation, fencing, deduplication, the rule, the clock
  increment and the staleness record of a commit form one critical section;
* **hogwild**: fencing and deduplication are bookkept under the lock but the
  rule runs without it, so concurrent commits can overwrite each other's
  update (lost updates; racy by design, for experiments only);
* **synchronous**: each commit waits for its round ``(epoch, step)`` to close
  (:mod:`elephant.ps.rounds`); ``apply_round`` runs once and every waiter gets its result.

Idempotency (a replayed commit is acknowledged, not applied again) and fencing
(the highest task attempt of a partition wins) are the ledger's; SSP admission
(a pull waits under a ``staleness_bound``) is the rounds' (optimizers.md §10.2).

The store holds the center, the rule's state, the clock and the lock; it
fences, waits, applies, rolls back and hands over its outcome. It is composed
of parts that keep one concern each; the store's lock guards their state (the
byte counts alone have a lock of their own, the metrics'):

* :class:`elephant.ps.rounds.Rounds`: synchronous rounds and SSP admission;
* :class:`elephant.ps.ledger.Ledger`: the applied commits, the fences, the
  epochs' bookkeeping and the rolled-back run ids (what makes a commit apply once);
* :class:`elephant.ps.guard.NormGuard`: the norm guard (``norm_guard``);
* :class:`elephant.ps.metrics.Metrics`: the counters and the staleness histogram;
* :class:`elephant.ps.waits.Waits`: the requests held until a round closes, SSP admits or an epoch ends;
* :class:`elephant.ps.view.ReplyView`: the workers' view of the center, with compressed replies;
* :mod:`elephant.ps.checks`: the checks of the store's arguments, a request, a commit and a rule's result;
* :mod:`elephant.ps.snapshots`: the :class:`Snapshot` a rollback returns to and the :class:`Outcome` handed over.

The center arrays are read-only snapshots that updates replace and never
mutate, so replies hand them out without copying.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from elephant.errors import (ConfigError, NormGuardError, PSError, ProtocolError, RolledBackError, RoundTimeoutError,
                             StaleAttemptError, StoreClosedError)
from elephant.optimizers.base import DistributedOptimizer
from elephant.protocol import Commit, CommitKey, Reply, ssp_admitted
from elephant.ps.checks import (check_base_clock, check_commit, check_partition, check_ratio, check_store_args,
                                commit_what, freeze, int_arg, run_rule)
from elephant.ps.guard import NormGuard
from elephant.ps.ledger import Ledger
from elephant.ps.metrics import Metrics
from elephant.ps.rounds import Epoch, RoundRule, Rounds, Ticket
from elephant.ps.snapshots import Outcome, Snapshot
from elephant.ps.view import ReplyView
from elephant.ps.waits import Waits

logger = logging.getLogger(__name__)

__all__ = ["CommitKey", "Store", "StaleAttemptError", "RoundTimeoutError", "StoreClosedError",
           "RolledBackError", "NormGuardError", "ssp_admitted"]


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
        check_store_args(optimizer, mode, num_workers, run, round_timeout)
        self._center = freeze([np.array(a, copy=True) for a in center])
        self._commit_template = optimizer.commit_template(self._center)  # the center's structure, or an encoded layout
        self._optimizer, self._mode, self._num_workers, self._run = optimizer, mode, num_workers, run
        self._round_timeout = float(round_timeout)
        self._metrics = Metrics()
        self._guard = NormGuard(norm_guard, self._metrics)
        self._state = optimizer.server_init(self.center(), num_workers) if state is None else state
        self._clock = int_arg("clock", clock)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._rounds = Rounds(optimizer, mode, num_workers, self._round_timeout, self._cond, self._apply_round)
        self._view = ReplyView(optimizer.reply_codec)  # the workers' center, with compressed replies
        self._view.reset(self._center)
        self._ledger = Ledger(num_workers, self._metrics, lambda: self._view.reset(self._center))
        self._waits = Waits(self._cond, self._round_timeout, lambda: self._run)
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
            return self._ledger.entries()

    def metrics(self) -> dict[str, Any]:
        """Counters, the staleness histogram ``{tau: count}`` with its mean and max, and more."""
        with self._lock, self._metrics.lock:
            return self._metrics.summary(self._run, self._mode, self._clock, self._num_workers, self._waits.waiting)

    @property
    def samples_applied(self) -> int:
        """Samples trained in the commits applied so far (read without the lock, for progress displays)."""
        return self._metrics.samples_applied

    def count_bytes(self, received: int, sent: int) -> None:
        """Add request and response body sizes to the metrics (called by the app)."""
        self._metrics.count_bytes(received, sent)  # not the store lock: an apply may hold that for a while

    def learning_rate_changed(self, ratio: float) -> None:
        """Tell the rule that the user's learning rate was multiplied by ``ratio`` (between epochs).

        Raises:
            ProtocolError: ``ratio`` is negative or not finite.
            PSError: the rule's hook failed (its state is unchanged).
        """
        check_ratio(ratio)
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
                            ledger_size=len(self._ledger), epochs=self._ledger.epochs(),
                            latest_epoch=self._ledger.latest_epoch)

    def outcome(self) -> Outcome:
        """The center, the rule's state, the clock, the applied keys and the counters, for :meth:`absorb`."""
        with self._cond, self._metrics.lock:
            counts, staleness = self._metrics.totals()
            return Outcome(center=list(self._center), state=copy.deepcopy(self._state), clock=self._clock,
                           ledger=self._ledger.entries(), counts=counts, staleness=staleness)

    def absorb(self, outcome: Outcome) -> None:
        """Go on from ``outcome``, an epoch served by another store that started from this one's state.

        The center, the rule's state and the clock become the outcome's; its
        applied keys and counters are added to this store's.
        """
        with self._cond, self._metrics.lock:
            self._center = freeze(outcome.center)
            self._state, self._clock = outcome.state, outcome.clock
            self._view.reset(self._center)
            self._ledger.extend(outcome.ledger)
            self._metrics.add(outcome.counts, outcome.staleness)

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
            for ep in self._ledger.rewind(snapshot, self._run):
                self._rounds.abandon(ep, "the epoch was rolled back")
            self._center, self._clock = list(snapshot.center), snapshot.clock
            self._view.reset(self._center)
            self._state = copy.deepcopy(snapshot.state)  # the snapshot stays valid for another rollback
            self._run = run
            self._metrics.count("epochs_rolled_back")
            self._metrics.count("commits_rolled_back", undone)
            self._cond.notify_all()
        logger.warning("rolled back %d commits; serving run %s", undone, run)
        return undone

    def close(self) -> None:
        """Refuse further requests; wake every waiting one with :class:`StoreClosedError`."""
        with self._cond:
            self._waits.close()

    # ---------------------------------------------------------------- helpers
    def _reply(self, tensors: Any = None) -> Reply:
        """A reply with the center as the workers hold it: the view, with compressed replies (lock held)."""
        return self._view.reply(self._clock, self._center, tensors)

    def _fence(self, run: str, epoch: int, partition: int, attempt: int, what: str) -> Epoch:
        """Closed check, run check and attempt fencing; the caller holds the lock."""
        self._waits.check_open(what)
        self._ledger.check_current(run, self._run, what)
        if run != self._run:
            self._metrics.count("commits_rejected")
            raise ProtocolError(f"{what} names run {run!r} but this parameter server serves run {self._run!r}")
        return self._ledger.fence(epoch, partition, attempt, what)

    def _validate(self, key: CommitKey, attempt: int, commit: Commit, check_finite: bool) -> str:
        """Lock-free structural checks (the center's structure never changes)."""
        what = commit_what(key, attempt)
        try:
            check_commit(key.partition, commit, self._num_workers, self._commit_template, check_finite)
        except ProtocolError as exc:
            with self._lock:
                self._metrics.count("commits_rejected")
            raise ProtocolError(f"{what}: {exc}") from None
        return what

    def _record(self, ep: Epoch, key: CommitKey, attempt: int, commit: Commit, clock_before: int) -> None:
        self._ledger.record(ep, key, attempt)
        self._metrics.count_applied(commit.num_samples, clock_before - commit.base_clock)

    def _admit(self, ep: Epoch, epoch: int, partition: int, what: str) -> None:
        """Block (lock held) until SSP admits ``partition`` to start a window."""
        admission = self._rounds.admission(ep, epoch, partition, what)
        if admission is not None:
            self._waits.until(*admission)

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
                self._waits.until(lambda: ticket.done, lambda: self._rounds.withdraw(ticket))
                self._ledger.check_current(key.run, self._run, what)
                reply = self._rounds.result(ticket)
                if ticket.newer_attempt is not None:
                    raise self._ledger.superseded(
                        f"{what} was superseded by task attempt {ticket.newer_attempt} in its round")
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
        self._center, replies, self._state = run_rule(what, self._optimizer, center, lambda: rule(state, center, clock))
        self._clock += 1
        self._metrics.count("rounds_applied")
        for key, attempt, commit in entries:
            self._record(ep, key, attempt, commit, clock)
        center, extra = self._view.advance(self._center, clock)
        return self._clock, center, replies, extra

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
        worker = int_arg("worker", worker)
        check_partition(worker, self._num_workers)
        what = f"pull (worker {worker})"
        with self._cond:
            self._waits.check_open(what)
            epoch = self._ledger.latest_epoch if epoch is None else int_arg("epoch", epoch)
            if epoch is not None:
                self._admit(self._ledger.epoch(epoch), epoch, worker, what)
            self._state = self._optimizer.on_pull(self._state, self._center, self._clock, worker)
            self._metrics.count("pulls")
            return self._reply()

    def finish(self, run: str, epoch: int, partition: int, attempt: int) -> None:
        """``partition`` has no more data in ``epoch``: it leaves rounds and the SSP minimum.

        Raises:
            StaleAttemptError: a newer attempt of the partition was seen.
            ProtocolError: wrong run, or an invalid epoch, partition or attempt.
        """
        epoch, partition, attempt = (int_arg(n, v) for n, v in zip(("epoch", "partition", "attempt"),
                                                                    (epoch, partition, attempt)))
        check_partition(partition, self._num_workers)
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
        epoch = int_arg("epoch", epoch)
        with self._cond:
            return self._waits.within(lambda: len(self._ledger.epoch(epoch).finished) >= self._num_workers, timeout)

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
        norm = self._guard.norm(commit)
        with self._cond:
            ep = self._fence(key.run, key.epoch, key.partition, attempt, what)
            if (key.partition, key.step) in ep.applied:
                self._ledger.replay(what)
                reply = self._admitted_reply(ep, key, what, None, pulled=True)
                return lambda: reply
            check_base_clock(commit, self._clock, what)
            self._guard.check(norm, what)
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
            new_center, tensors, state = run_rule(what, self._optimizer, center, lambda: self._optimizer.apply(
                state, center, clock, key.partition, commit))
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
