"""A store's record of who committed what: applied commits, fences, epochs and rolled-back runs (no HTTP).

What makes a commit apply once, kept by a :class:`Ledger` for a
:class:`~elephant.ps.store.Store`:

* **idempotency**: a commit whose key ``(run, epoch, partition, step)`` was
  applied is a replay, acknowledged and not applied again (first apply wins).
  Each epoch's applied ``(partition, step)`` pairs are kept in its
  :class:`~elephant.ps.rounds.Epoch`, and every applied ``(key, attempt)`` in
  apply order in the ledger;
* **fencing**: per ``(epoch, partition)`` the highest Spark ``taskAttemptId()``
  seen wins; a lower attempt gets :class:`~elephant.errors.StaleAttemptError`;
* **rollback**: the run ids of rolled-back epoch tries are retired; their
  requests get :class:`~elephant.errors.RolledBackError`.

The ledger also keeps the epochs' bookkeeping (:class:`~elephant.ps.rounds.Epoch`,
made when an epoch is first seen) and the latest epoch seen. It has no lock:
the store holds its own on every call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from elephant.errors import RolledBackError, StaleAttemptError
from elephant.protocol import CommitKey
from elephant.ps.metrics import Metrics
from elephant.ps.rounds import Epoch
from elephant.ps.snapshots import Snapshot

logger = logging.getLogger("elephant.ps.store")  # the store's logger, as before the ledger had a module of its own

__all__ = ["Ledger"]


class Ledger:
    """The applied commits, the fences, the epochs and the retired run ids of one store; the store's lock held.

    Args:
        num_workers: the store's number of partitions (the length of an epoch's SSP clocks).
        metrics: the store's counters (fenced requests and dropped replays are counted).
        on_new_epoch: called when an epoch is first seen (the store resets the workers' view of the center).
    """

    def __init__(self, num_workers: int, metrics: Metrics, on_new_epoch: Callable[[], None]):
        self._num_workers, self._metrics, self._on_new_epoch = num_workers, metrics, on_new_epoch
        self._epochs: dict[int, Epoch] = {}
        self._applied: list[tuple[CommitKey, int]] = []
        self._retired: set[str] = set()  # run ids of rolled-back epoch tries
        #: The highest epoch seen, or None; what a pull that names no epoch is admitted in.
        self.latest_epoch: int | None = None

    def __len__(self) -> int:
        return len(self._applied)

    def entries(self) -> list[tuple[CommitKey, int]]:
        """Applied ``(key, attempt)`` pairs in apply order (a copy)."""
        return list(self._applied)

    def epochs(self) -> frozenset[int]:
        """The epochs seen (a rollback drops those begun since its snapshot)."""
        return frozenset(self._epochs)

    def epoch(self, epoch: int) -> Epoch:
        """The bookkeeping of ``epoch``, made when it is first seen."""
        if epoch not in self._epochs:
            self._epochs[epoch] = Epoch(commits=[0] * self._num_workers)
            self._on_new_epoch()  # each epoch's workers start from the exact center
            self.latest_epoch = max(epoch, self.latest_epoch if self.latest_epoch is not None else epoch)
        return self._epochs[epoch]

    # -------------------------------------------------------------- fencing
    def fence(self, epoch: int, partition: int, attempt: int, what: str) -> Epoch:
        """Attempt fencing: raise :class:`StaleAttemptError` below the partition's highest attempt, else record it."""
        ep = self.epoch(epoch)
        highest = ep.attempts.get(partition, -1)
        if attempt < highest:
            error = self.superseded(f"{what} was superseded by task attempt {highest} of the same partition")
            logger.warning("fenced %s: task attempt %d of the partition superseded it", what, highest)
            raise error
        ep.attempts[partition] = attempt
        return ep

    def check_current(self, run: str, serving: str, what: str) -> None:
        """Raise :class:`RolledBackError` if ``run`` was rolled back (``serving``: the run id served now)."""
        if run in self._retired:
            raise self.superseded(f"{what}: its epoch try was rolled back; run {serving} replaces {run}",
                                  RolledBackError)

    def superseded(self, message: str, kind: type[StaleAttemptError] = StaleAttemptError) -> StaleAttemptError:
        """Count a fenced request and return its error."""
        self._metrics.count("stale_attempts_fenced")
        return kind(message)

    # ------------------------------------------------------------ commits
    def replay(self, what: str) -> None:
        """Count (and log) an acknowledged replay of an applied commit."""
        self._metrics.count("replays_dropped")
        logger.info("acknowledged a replay of the applied %s", what)

    def record(self, ep: Epoch, key: CommitKey, attempt: int) -> None:
        """Record an applied commit: its key in its epoch, a tick of its partition's SSP clock, the ledger entry."""
        ep.applied.add((key.partition, key.step))
        ep.commits[key.partition] += 1
        self._applied.append((key, attempt))

    def extend(self, entries: list[tuple[CommitKey, int]]) -> None:
        """Add the applied ``(key, attempt)`` pairs of an epoch served by another store."""
        self._applied.extend(entries)

    # ------------------------------------------------------------ rollback
    def rewind(self, snapshot: Snapshot, run: str) -> list[Epoch]:
        """Go back to ``snapshot``: forget the commits applied since, drop the bookkeeping of the epochs begun since
        (returned) and refuse ``run`` from now on (its epoch try was rolled back)."""
        dropped = [self._epochs.pop(epoch) for epoch in set(self._epochs) - snapshot.epochs]
        del self._applied[snapshot.ledger_size:]
        self.latest_epoch = snapshot.latest_epoch
        self._retired.add(run)
        return dropped
