"""The store's waiting side: synchronous rounds and SSP admission (no HTTP).

* **synchronous**: a round is ``(epoch, step)``; each commit waits until every
  active partition of the epoch has committed that step or finished, then
  ``apply_round`` runs once and every waiter gets the round's result;
* **SSP**: with a ``staleness_bound`` a pull (and the reply to a commit, which
  doubles as the next pull) waits for admission (optimizers.md §10.2).

:class:`RoundsMixin` holds these waits for :class:`elephant.ps.store.Store`,
which owns the lock, the center and the error types; the per-epoch bookkeeping
(:class:`_Epoch`, :class:`_Round`) and the admission rule :func:`ssp_admitted`
live here too.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence, Set
from typing import Any

from elephant.errors import PSError
from elephant.optimizers.base import Commit, Reply
from elephant.ps.wire import CommitKey

logger = logging.getLogger(__name__)

__all__ = ["RoundsMixin", "ssp_admitted"]


def ssp_admitted(commits: Sequence[int], finished: Set[int], partition: int, bound: int | None) -> bool:
    """Stale Synchronous Parallel admission (optimizers.md §10.2).

    ``partition`` may start its next window when it is at most ``bound``
    commits ahead of the slowest partition that has not finished the epoch.
    Finished partitions leave the minimum; ``bound=None`` always admits.

    Args:
        commits: commits applied this epoch, by partition.
        finished: partitions that finished the epoch.
        partition: the partition asking to start a window.
        bound: the staleness bound ``s``, or None (unbounded).
    """
    if bound is None or partition in finished:
        return True
    return commits[partition] - min(c for p, c in enumerate(commits) if p not in finished) <= bound


@dataclasses.dataclass
class _Round:
    step: int
    pending: dict[int, tuple] = dataclasses.field(default_factory=dict)  # p -> (key, attempt, commit, token)
    done: bool = False
    error: str | None = None
    clock: int = 0
    center: list = dataclasses.field(default_factory=list)
    replies: dict = dataclasses.field(default_factory=dict)
    attempts: dict = dataclasses.field(default_factory=dict)
    acc: Any = None  # a streaming rule's running sum of the pending commits


@dataclasses.dataclass
class _Epoch:
    commits: list[int]  # applied commits per partition (SSP clocks)
    finished: set[int] = dataclasses.field(default_factory=set)
    attempts: dict[int, int] = dataclasses.field(default_factory=dict)
    applied: set[tuple[int, int]] = dataclasses.field(default_factory=set)
    rounds: dict[int, _Round] = dataclasses.field(default_factory=dict)


class RoundsMixin:
    """Synchronous rounds and SSP admission of :class:`elephant.ps.store.Store`.

    :meth:`_submit_round` and the wait it returns take the store's lock (``_cond``); the other
    methods run with it held. The store provides the state (``_optimizer``,
    ``_mode``, ``_num_workers``, ``_round_timeout``, ``_state``, ``_center``,
    ``_clock``, ``_counts``) and the helpers ``_fence``, ``_replay``,
    ``_check_base_clock``, ``_check_norm``, ``_checked``, ``_record``, ``_superseded`` (the
    store's ``StaleAttemptError``), ``_check_current`` (its ``RolledBackError``) and ``_wait`` (which raises its
    ``RoundTimeoutError`` and ``StoreClosedError``).
    """

    def _admit(self, ep: _Epoch, epoch: int, partition: int, what: str) -> None:
        """Block (lock held) until SSP admits ``partition`` to start a window."""
        bound = self._optimizer.staleness_bound
        if self._mode == "synchronous" or bound is None:
            return

        def message() -> str:
            active = {p: c for p, c in enumerate(ep.commits) if p not in ep.finished}
            slowest = min(active, key=active.get)
            return (f"{what} waited {self._round_timeout:g} s for admission under staleness_bound={bound}: "
                    f"partition {partition} has {ep.commits[partition]} commits in epoch {epoch}, the slowest "
                    f"active partition {slowest} has {active[slowest]}")

        self._wait(lambda: ssp_admitted(ep.commits, ep.finished, partition, bound), message)

    def _admitted_reply(self, ep: _Epoch, key: CommitKey, what: str, tensors: Any, pulled: bool = False) -> Reply:
        """The reply doubles as the next pull: wait for SSP admission; if the wait (or a
        replay) hands out a center other than the rule's own result, tell the rule it was pulled."""
        clock = self._clock
        self._admit(ep, key.epoch, key.partition, what)
        if pulled or self._clock != clock:
            self._state = self._optimizer.on_pull(self._state, self._center, self._clock, key.partition)
        return Reply(clock=self._clock, center=list(self._center), tensors=tensors)

    def _submit_round(self, key: CommitKey, attempt: int, commit: Commit, what: str,
                      norm: float | None = None) -> Callable[[], Reply]:
        """Enter ``commit`` in its round; return the wait for the round's result.

        A rule that streams rounds (``streams_rounds``) sums the commit into the
        round here, and the round keeps only its metadata: once the caller drops
        its references the tensors are freed while the round waits for the other
        partitions.
        """
        p, token = key.partition, object()
        with self._cond:
            ep = self._fence(key.run, key.epoch, p, attempt, what)
            if (p, key.step) in ep.applied:
                self._replay(what)
                self._state = self._optimizer.on_pull(self._state, self._center, self._clock, p)
                reply = Reply(clock=self._clock, center=list(self._center))
                return lambda: reply
            self._check_base_clock(commit, what)
            self._check_norm(norm, what)
            rnd = ep.rounds.setdefault(key.step, _Round(key.step))
            if self._optimizer.streams_rounds:
                self._stream(ep, rnd, key, attempt, commit, what)
                commit = dataclasses.replace(commit, tensors=[])
            rnd.pending[p] = (key, attempt, commit, token)  # a same or newer attempt replaces a pending commit
            self._close_round(ep, rnd)

        def withdraw() -> str:  # on timeout: leave the round, so "failed" means "not applied"
            missing = set(range(self._num_workers)) - ep.finished - rnd.pending.keys() - {p}
            message = (f"{what} waited {self._round_timeout:g} s for round (epoch {key.epoch}, step {key.step}); "
                       f"committed: {sorted(rnd.pending.keys() - {p})}, missing: {sorted(missing)}")
            if self._optimizer.streams_rounds:  # a sum cannot be taken apart: the round fails instead
                self._fail_round(ep, rnd, f"partition {p} timed out waiting for it")
            elif rnd.pending.get(p, (None,) * 4)[3] is token:
                del rnd.pending[p]
                if not rnd.pending:
                    ep.rounds.pop(key.step, None)
            return message

        def wait() -> Reply:
            with self._cond:
                self._wait(lambda: rnd.done, withdraw)
                self._check_current(key.run, what)
                if rnd.error is not None:
                    raise PSError(f"{what}: round (epoch {key.epoch}, step {key.step}) failed: {rnd.error}")
                if rnd.attempts[p] > attempt:
                    raise self._superseded(f"{what} was superseded by task attempt {rnd.attempts[p]} in its round")
                return Reply(clock=rnd.clock, center=list(rnd.center), tensors=rnd.replies.get(p))

        return wait

    def _stream(self, ep: _Epoch, rnd: _Round, key: CommitKey, attempt: int, commit: Commit, what: str) -> None:
        """Sum ``commit`` into its streamed round (lock held); a retransmission is summed once."""
        p = key.partition
        if p in rnd.pending:
            summed = rnd.pending[p][1]
            if summed == attempt:  # the same commit sent again (a client retry): in the sum already
                return
            reason = f"task attempt {attempt} of partition {p} replaced attempt {summed}, whose commit is in the sum"
            self._fail_round(ep, rnd, reason)
            raise PSError(f"{what}: round (epoch {key.epoch}, step {key.step}) failed: {reason}")
        try:
            if rnd.acc is None:
                rnd.acc = self._optimizer.round_begin(self._num_workers)
            rnd.acc = self._optimizer.round_add(rnd.acc, p, commit)
        except Exception as exc:
            reason = f"the server rule of {type(self._optimizer).__name__} failed to add it: {exc!r}"
            logger.error("%s: %s", what, reason)
            self._fail_round(ep, rnd, reason)
            raise PSError(f"{what}: round (epoch {key.epoch}, step {key.step}) failed: {reason}") from exc

    def _fail_round(self, ep: _Epoch, rnd: _Round, reason: str) -> None:
        """End ``rnd`` unapplied (lock held): each of its waiters raises with ``reason``."""
        if ep.rounds.get(rnd.step) is rnd:
            del ep.rounds[rnd.step]
        rnd.done, rnd.error, rnd.acc = True, reason, None
        self._cond.notify_all()

    def _close_round(self, ep: _Epoch, rnd: _Round) -> None:
        """Apply ``rnd`` once every active partition has committed (lock held)."""
        if rnd.done or not rnd.pending or not set(range(self._num_workers)) - ep.finished <= rnd.pending.keys():
            return
        entries = sorted(rnd.pending.items())
        commits = {p: entry[2] for p, entry in entries}
        clock, state, center = self._clock, self._state, self._center
        ep.rounds.pop(rnd.step, None)
        rnd.done = True
        what = f"round (step {rnd.step}, partitions {sorted(commits)})"
        if self._optimizer.streams_rounds:
            acc, rnd.acc = rnd.acc, None
            rule = lambda: self._optimizer.round_end(state, center, clock, acc, sorted(commits))  # noqa: E731
        else:
            rule = lambda: self._optimizer.apply_round(state, center, clock, commits)  # noqa: E731
        try:
            self._center, replies, self._state = self._checked(what, rule)
        except Exception as exc:  # every waiter of the round reports it
            logger.error("%s failed: %r", what, exc)
            rnd.error = f"{type(exc).__name__}: {exc}"
            self._cond.notify_all()
            return
        self._clock += 1
        self._counts["rounds_applied"] += 1
        for p, (key, attempt, commit, _) in entries:
            self._record(ep, key, attempt, commit, clock)
            rnd.attempts[p] = attempt
        rnd.clock, rnd.center, rnd.replies = self._clock, self._center, dict(replies or {})
        self._cond.notify_all()
