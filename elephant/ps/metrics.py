"""A store's counters: commits applied, refused and replayed, rounds, pulls, bytes, and the staleness histogram.

:class:`Metrics` is kept by :class:`~elephant.ps.store.Store` (no HTTP). Every
count but the byte counts is made with the store's lock held. The byte counts,
added by the app after each request, take the metrics' own :attr:`Metrics.lock`
instead, since an apply may hold the store's lock for a while. Whoever reads or
replaces every counter at once (the ``/metrics`` JSON, a hosted store's
:class:`~elephant.ps.snapshots.Outcome`) holds both locks, the store's first.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

__all__ = ["COUNTERS", "Metrics"]

#: The counters :meth:`Metrics.summary` reports, in its order.
COUNTERS = (
    "commits_applied", "rounds_applied", "replays_dropped", "stale_attempts_fenced",
    "commits_rejected", "pulls", "bytes_in", "bytes_out", "epochs_rolled_back", "commits_rolled_back",
    "commits_norm_refused", "samples_applied",
)


class Metrics:
    """The counters and the staleness histogram ``{tau: commits}`` of one store."""

    def __init__(self):
        #: Taken for the byte counts, and with the store's lock to read or replace every counter at once.
        self.lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._staleness: Counter[int] = Counter()

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``name`` (the store's lock held)."""
        self._counts[name] += n

    def count_applied(self, num_samples: int, staleness: int) -> None:
        """Count an applied commit, its samples and its staleness (the store's lock held)."""
        self._counts["commits_applied"] += 1
        self._counts["samples_applied"] += num_samples
        self._staleness[staleness] += 1

    def count_bytes(self, received: int, sent: int) -> None:
        """Add request and response body sizes (takes :attr:`lock`, not the store's)."""
        with self.lock:
            self._counts["bytes_in"] += received
            self._counts["bytes_out"] += sent

    @property
    def samples_applied(self) -> int:
        """Samples trained in the commits applied so far (read without a lock, for progress displays)."""
        return self._counts["samples_applied"]

    def summary(self, run: str, mode: str, clock: int, num_workers: int, waiting: int) -> dict[str, Any]:
        """The counters, the store's fields given, the staleness histogram, its mean and max (both locks held)."""
        hist = dict(sorted(self._staleness.items()))
        total = sum(hist.values())
        out: dict[str, Any] = {name: self._counts[name] for name in COUNTERS}
        out.update(run=run, mode=mode, clock=clock, num_workers=num_workers,
                   staleness=hist, staleness_max=max(hist, default=0), waiting=waiting,
                   staleness_mean=sum(t * c for t, c in hist.items()) / total if total else 0.0)
        return out

    def totals(self) -> tuple[dict[str, int], dict[int, int]]:
        """Copies of the counters and the staleness histogram, for an outcome (both locks held)."""
        return dict(self._counts), dict(self._staleness)

    def add(self, counts: dict[str, int], staleness: dict[int, int]) -> None:
        """Add another store's :meth:`totals` to these (both locks held)."""
        self._counts.update(counts)
        self._staleness.update(staleness)
