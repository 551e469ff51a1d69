"""What a fit reports back to the façade that started it: :class:`FitReport`."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

__all__ = ["FitReport", "new_run_id"]


def new_run_id() -> str:
    """A fit's run id: 12 hex digits, in the job group, the commit keys and the log lines."""
    return uuid.uuid4().hex[:12]


@dataclasses.dataclass
class FitReport:
    """Filled in as a fit goes, so a failed fit reports as much as it got to.

    Attributes:
        run: the fit's run id (the Spark job group is ``elephant-<run>``).
        plan: workers, global and per-worker batch, window, the rule's config
            and ``overlap`` (:meth:`elephant.fit.plan.FitPlan.as_dict`).
        ps_url: the parameter server's address (None: not started, or hosted
            by a task under Spark Connect); shard 0's for a sharded server.
        ps_urls: every shard's address, in shard order (empty: not started, or hosted).
        metrics: the store's counters at the end (``/metrics``).
        ledger: the applied ``(commit key, attempt)`` pairs, in order.
        optimizer_states: per epoch, each partition's source of its worker's
            Keras optimizer state (``"kept"``, ``"shared"``, ``"new"``,
            ``"stale"``; :func:`elephant.replicas.training_replica`).
        learning_rates: per epoch, the learning rate each partition's task started its
            pass at (the compiled one times ``plan["learning_rate_scale"]``).
        epoch_stats: per epoch, each partition's task statistics as the task returned them
            (:func:`elephant.worker.run_partition`: steps, commits, seconds, ``peak_rss``...).
    """

    run: str = dataclasses.field(default_factory=new_run_id)
    plan: dict[str, Any] | None = None
    ps_url: str | None = None
    ps_urls: tuple[str, ...] = ()
    metrics: dict[str, Any] | None = None
    ledger: list | None = None
    optimizer_states: list[dict[int, str]] = dataclasses.field(default_factory=list)
    learning_rates: list[dict[int, float]] = dataclasses.field(default_factory=list)
    epoch_stats: list[list[dict[str, Any]]] = dataclasses.field(default_factory=list)

    @property
    def job_group(self) -> str:
        return f"elephant-{self.run}"
