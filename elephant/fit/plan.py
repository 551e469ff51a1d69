"""The plan of a fit, decided once from numbers: workers, window, batch split, the rule made for the fit.

Both Spark runners (:mod:`elephant.fit.classic`, :mod:`elephant.fit.connect`)
and the simulator (:mod:`elephant.fit.simulated`) plan through these
functions, so a fit on Spark and its simulation train the same plan.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from elephant.config import Settings
from elephant.optimizers.base import DistributedOptimizer, overlap_warning, worker_batch_size

__all__ = ["FitPlan", "decide_workers", "plan_fit"]


def decide_workers(requested: int | None, available: int | None, samples: int | None = None) -> int | None:
    """How many workers train: ``requested`` (``SparkModel(num_workers=)``), else what the input or cluster offers.

    ``available`` is an RDD's partitions, a DataFrame's or numpy fit's default
    parallelism, or a Connect cluster's task slots (None: unknown). A numpy fit
    never has more workers than ``samples``, so that no shard is empty.
    """
    workers = requested or available
    if workers is not None and samples is not None:
        workers = min(workers, samples)
    return workers


@dataclasses.dataclass(frozen=True)
class FitPlan:
    """What one fit trains with.

    Attributes:
        num_workers: partitions trained in parallel.
        batch_size: ``fit``'s ``batch_size``; ``worker_batch_size`` each worker's
            batch (``batch_size`` split among the workers when ``splits_batch``).
        window: local steps per commit (None: one commit per partition pass).
        overlap: whether workers train on while a commit is in flight.
        rule: the distributed optimizer made for this fit (``for_fit``).
    """

    num_workers: int
    batch_size: int
    worker_batch_size: int
    window: int | None
    splits_batch: bool
    overlap: bool
    rule: DistributedOptimizer

    def as_dict(self) -> dict[str, Any]:
        """The plan as ``SparkModel.fit_plan`` shows it."""
        return {"num_workers": self.num_workers, "batch_size": self.batch_size,
                "worker_batch_size": self.worker_batch_size, "window": self.window,
                "optimizer": self.rule.get_config(), "overlap": self.overlap}

    def warnings(self, mode: str) -> list[str]:
        """The fit-start warnings for settings measured to train worse (the rule's and ``overlap``'s)."""
        found = [self.rule.setup_warning(self.window, self.num_workers, self.splits_batch),
                 overlap_warning(self.overlap, mode, self.window, self.num_workers)]
        return [w for w in found if w]

    def describe(self) -> str:
        """One log line: the workers, the rule, the window, the batches and the overlap."""
        if self.worker_batch_size != self.batch_size:
            batches = (f"batch_size={self.batch_size} is the global batch: each worker trains batches of "
                       f"{self.worker_batch_size} (pass SparkModel(batch_split=False) for full batches per worker)")
        else:
            batches = f"each worker trains batches of {self.batch_size}"
        flights = ("workers train on while a commit is in flight (overlap=False waits for each reply)" if self.overlap
                   else "workers wait for each commit's reply")
        return (f"elephant fit: {self.num_workers} workers, {self.rule.describe(self.num_workers)}, "
                f"window={self.window}; {batches}; {flights}")


def plan_fit(settings: Settings, local_optimizer: Any, num_workers: int, batch_size: int) -> FitPlan:
    """The plan of a fit of ``num_workers`` workers with ``settings``, for a model compiled with ``local_optimizer``."""
    window, split = settings.window, settings.splits_batch
    return FitPlan(
        num_workers=num_workers, batch_size=batch_size,
        worker_batch_size=worker_batch_size(batch_size, num_workers, split), window=window, splits_batch=split,
        overlap=settings.overlap, rule=settings.optimizer.for_fit(local_optimizer, num_workers, split, window),
    )
