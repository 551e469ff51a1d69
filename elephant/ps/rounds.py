"""The store's waiting side: synchronous rounds and SSP admission (no HTTP).

* **synchronous**: a round is ``(epoch, step)``; each commit waits until every
  active partition of the epoch has committed that step or finished, then
  ``apply_round`` runs once and every waiter gets the round's result;
* **SSP**: with a ``staleness_bound`` a pull (and the reply to a commit, which
  doubles as the next pull) waits for admission (optimizers.md §10.2).

A :class:`elephant.ps.store.Store` holds one :class:`Rounds` and keeps what
is the store's: the lock, the center, the clock, fencing (its ledger), the
checks of a commit, the waiting (with its timeout, rollback and closing: its
:class:`~elephant.ps.waits.Waits`) and the errors it raises. :class:`Rounds`
keeps the rounds themselves: which commits are pending, a streaming rule's
running sum, when a round closes and which rule call closes it, and what each
waiter gets. It reaches the store through two things given to it: the store's
condition (its lock, held on every call, and the waiters' wake-up) and an
``apply`` callback that runs a closed round's rule on the center and records
its commits. A commit entered in a round gets a :class:`Ticket`: the store
waits until it is done, then asks for the result.

The per-epoch bookkeeping (:class:`Epoch`) lives here too; the rules of
admission and of a round's closing are :mod:`elephant.protocol`'s, which the
simulator follows as well.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

from elephant.errors import PSError
from elephant.optimizers.base import DistributedOptimizer
from elephant.protocol import Commit, CommitKey, Reply, round_complete, ssp_admitted

logger = logging.getLogger(__name__)

__all__ = ["Epoch", "Rounds", "Ticket"]

#: A closed round's rule over the store's ``(state, center, clock)``: returns ``(center, replies, state)``.
RoundRule = Callable[[Any, list, int], tuple]

#: The store's side of closing a round: ``apply(epoch, what, rule, commits)`` runs ``rule`` on the center
#: (lock held), records the applied ``(key, attempt, commit)`` entries and returns the new clock, the center
#: the workers get, the rule's replies and the other fields of the round's :class:`Reply` (a dict); it
#: raises if the rule failed (the center is then unchanged).
Apply = Callable[["Epoch", str, RoundRule, list], tuple]


@dataclasses.dataclass
class _Round:
    step: int
    pending: dict[int, tuple] = dataclasses.field(default_factory=dict)  # p -> (key, attempt, commit, ticket)
    done: bool = False
    error: str | None = None
    clock: int = 0
    center: list = dataclasses.field(default_factory=list)
    replies: dict = dataclasses.field(default_factory=dict)
    attempts: dict = dataclasses.field(default_factory=dict)
    acc: Any = None  # a streaming rule's running sum of the pending commits
    served: dict = dataclasses.field(default_factory=dict)  # the rest of the replies' fields (compressed replies)


@dataclasses.dataclass
class Epoch:
    """One epoch's bookkeeping in a store: SSP clocks, finished partitions, fences, applied keys, open rounds."""

    commits: list[int]  # applied commits per partition (SSP clocks)
    finished: set[int] = dataclasses.field(default_factory=set)
    attempts: dict[int, int] = dataclasses.field(default_factory=dict)
    applied: set[tuple[int, int]] = dataclasses.field(default_factory=set)
    rounds: dict[int, _Round] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(eq=False)
class Ticket:
    """A commit's place in its synchronous round (from :meth:`Rounds.enter`): the store waits until :attr:`done`."""

    ep: Epoch
    round: _Round
    key: CommitKey
    attempt: int
    what: str

    @property
    def done(self) -> bool:
        """Whether the round ended: applied, failed or abandoned."""
        return self.round.done

    @property
    def newer_attempt(self) -> int | None:
        """The attempt of this partition that the applied round took instead of this one, if any."""
        applied = self.round.attempts.get(self.key.partition)
        return applied if applied is not None and applied > self.attempt else None


class Rounds:
    """Synchronous rounds and SSP admission of one :class:`elephant.ps.store.Store`.

    Every method runs with the store's lock held.

    Args:
        optimizer: the store's distributed optimizer (its round rules and ``staleness_bound``).
        mode: the store's synchronisation mode.
        num_workers: the store's number of partitions.
        round_timeout: the store's wait limit, in seconds (named in timeout messages).
        cond: the store's condition: its lock, notified when a round ends.
        apply: the store's side of closing a round (see :data:`Apply`).
    """

    def __init__(self, optimizer: DistributedOptimizer, mode: str, num_workers: int, round_timeout: float,
                 cond: threading.Condition, apply: Apply):
        self._optimizer, self._mode, self._num_workers = optimizer, mode, num_workers
        self._round_timeout, self._cond, self._apply = round_timeout, cond, apply

    def admission(self, ep: Epoch, epoch: int, partition: int,
                  what: str) -> tuple[Callable[[], bool], Callable[[], str]] | None:
        """What ``partition`` must wait for before it starts a window: None, or ``(ready, timeout message)``."""
        bound = self._optimizer.staleness_bound
        if self._mode == "synchronous" or bound is None:
            return None

        def message() -> str:
            active = {p: c for p, c in enumerate(ep.commits) if p not in ep.finished}
            slowest = min(active, key=active.get)
            return (f"{what} waited {self._round_timeout:g} s for admission under staleness_bound={bound}: "
                    f"partition {partition} has {ep.commits[partition]} commits in epoch {epoch}, the slowest "
                    f"active partition {slowest} has {active[slowest]}")

        return (lambda: ssp_admitted(ep.commits, ep.finished, partition, bound)), message

    def enter(self, ep: Epoch, key: CommitKey, attempt: int, commit: Commit, what: str) -> Ticket:
        """Enter a fenced, checked ``commit`` in its round; close the round if it is complete.

        A rule that streams rounds (``streams_rounds``) sums the commit into the
        round here, and the round keeps only its metadata: once the caller drops
        its references the tensors are freed while the round waits for the other
        partitions.

        Raises:
            PSError: a streamed round could not take the commit (it then fails for every waiter).
        """
        rnd = ep.rounds.setdefault(key.step, _Round(key.step))
        ticket = Ticket(ep, rnd, key, attempt, what)
        if self._optimizer.streams_rounds:
            self._stream(ep, rnd, key, attempt, commit, what)
            commit = dataclasses.replace(commit, tensors=[])
        rnd.pending[key.partition] = (key, attempt, commit, ticket)  # a same or newer attempt replaces a pending one
        self._close(ep, rnd)
        return ticket

    def close_ready(self, ep: Epoch) -> None:
        """Close every round of ``ep`` that no longer waits for anyone (after a partition finished)."""
        for step in sorted(ep.rounds):
            self._close(ep, ep.rounds[step])

    def abandon(self, ep: Epoch, reason: str) -> None:
        """End every open round of ``ep`` unapplied (a rollback): each waiter wakes to ``reason``."""
        for rnd in ep.rounds.values():
            rnd.done, rnd.error = True, reason
        self._cond.notify_all()

    def withdraw(self, ticket: Ticket) -> str:
        """Take ``ticket``'s commit out of its round after a timeout, so that "failed" means "not applied".

        A streamed round cannot take a commit out of its sum: it fails instead.
        Returns the timeout message, naming the partitions that committed and those missing.
        """
        ep, rnd, key, p = ticket.ep, ticket.round, ticket.key, ticket.key.partition
        missing = set(range(self._num_workers)) - ep.finished - rnd.pending.keys() - {p}
        message = (f"{ticket.what} waited {self._round_timeout:g} s for round (epoch {key.epoch}, step {key.step}); "
                   f"committed: {sorted(rnd.pending.keys() - {p})}, missing: {sorted(missing)}")
        if self._optimizer.streams_rounds:
            self._fail(ep, rnd, f"partition {p} timed out waiting for it")
        elif rnd.pending.get(p, (None,) * 4)[3] is ticket:
            del rnd.pending[p]
            if not rnd.pending:
                ep.rounds.pop(key.step, None)
        return message

    def result(self, ticket: Ticket) -> Reply:
        """The ended round's reply to ``ticket``'s commit.

        Raises:
            PSError: the round failed or was abandoned.
        """
        rnd, key = ticket.round, ticket.key
        if rnd.error is not None:
            raise PSError(f"{ticket.what}: round (epoch {key.epoch}, step {key.step}) failed: {rnd.error}")
        return Reply(clock=rnd.clock, center=list(rnd.center), tensors=rnd.replies.get(key.partition), **rnd.served)

    def _stream(self, ep: Epoch, rnd: _Round, key: CommitKey, attempt: int, commit: Commit, what: str) -> None:
        """Sum ``commit`` into its streamed round; a retransmission is summed once."""
        p = key.partition
        if p in rnd.pending:
            summed = rnd.pending[p][1]
            if summed == attempt:  # the same commit sent again (a client retry): in the sum already
                return
            reason = f"task attempt {attempt} of partition {p} replaced attempt {summed}, whose commit is in the sum"
            self._fail(ep, rnd, reason)
            raise PSError(f"{what}: round (epoch {key.epoch}, step {key.step}) failed: {reason}")
        try:
            if rnd.acc is None:
                rnd.acc = self._optimizer.round_begin(self._num_workers)
            rnd.acc = self._optimizer.round_add(rnd.acc, p, commit)
        except Exception as exc:
            reason = f"the server rule of {type(self._optimizer).__name__} failed to add it: {exc!r}"
            logger.error("%s: %s", what, reason)
            self._fail(ep, rnd, reason)
            raise PSError(f"{what}: round (epoch {key.epoch}, step {key.step}) failed: {reason}") from exc

    def _fail(self, ep: Epoch, rnd: _Round, reason: str) -> None:
        """End ``rnd`` unapplied: each of its waiters raises with ``reason``."""
        if ep.rounds.get(rnd.step) is rnd:
            del ep.rounds[rnd.step]
        rnd.done, rnd.error, rnd.acc = True, reason, None
        self._cond.notify_all()

    def _close(self, ep: Epoch, rnd: _Round) -> None:
        """Apply ``rnd`` once every active partition has committed."""
        if rnd.done or not round_complete(rnd.pending.keys(), ep.finished, self._num_workers):
            return
        entries = sorted(rnd.pending.items())
        commits = {p: entry[2] for p, entry in entries}
        ep.rounds.pop(rnd.step, None)
        rnd.done = True
        what = f"round (step {rnd.step}, partitions {sorted(commits)})"
        optimizer = self._optimizer
        if optimizer.streams_rounds:
            acc, rnd.acc = rnd.acc, None
            rule = lambda state, center, clock: optimizer.round_end(state, center, clock, acc, sorted(commits))  # noqa: E731
        else:
            rule = lambda state, center, clock: optimizer.apply_round(state, center, clock, commits)  # noqa: E731
        try:
            clock, center, replies, served = self._apply(ep, what, rule, [entry[:3] for _, entry in entries])
        except Exception as exc:  # every waiter of the round reports it
            logger.error("%s failed: %r", what, exc)
            rnd.error = f"{type(exc).__name__}: {exc}"
            self._cond.notify_all()
            return
        for p, (_, attempt, _, _) in entries:
            rnd.attempts[p] = attempt
        rnd.clock, rnd.center, rnd.replies, rnd.served = clock, center, dict(replies or {}), served
        self._cond.notify_all()
