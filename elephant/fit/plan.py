"""The plan of a fit, decided once from numbers: workers, window, batch split, the rule made for the fit.

Both Spark runners (:mod:`elephant.fit.classic`, :mod:`elephant.fit.connect`)
and the simulator (:mod:`elephant.fit.simulated`) plan through these
functions, so a fit on Spark and its simulation train the same plan.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from elephant.config import Settings
from elephant.optimizers.base import DistributedOptimizer, worker_batch_size

__all__ = ["FitPlan", "decide_workers", "overlap_warning", "plan_fit"]


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


def overlap_warning(overlap: bool, mode: str, window: int | None, num_workers: int) -> str | None:
    """The fit-start warning for ``overlap=True`` where the convergence benchmark measured a loss, else None."""
    if not overlap or num_workers < 2:
        return None
    if mode == "synchronous" and num_workers >= 4:
        return (
            f"overlap=True in synchronous mode with {num_workers} workers: the steps taken while a round closes "
            "start from weights that miss that round's average; benchmarks/convergence.py (simulator, 3 seeds) "
            "measured the synchronous default at 4 workers 3.8 points behind blocking rounds on the Conv1D task and "
            "1.3 on the tabular one (elsewhere, and at 2 workers, within 0.7 point or 1.8 % of the regression's "
            "loss; EASGD at its window of 32 unchanged). Use overlap=False or fewer workers."
        )
    if window is not None and window < 5:
        return (
            f"overlap=True with a window of {window} steps: each delta then misses the center updates of one more "
            "flight, which doubles the staleness of short windows; benchmarks/convergence.py measured DOWNPOUR and "
            "DC-ASGD at window 1 up to 10 points further behind plain Keras at 2 workers and 19 at 4 with overlap "
            "than without (no loss for AGN, DynSGD and AEASGD at windows of 5 to 32). Use a longer window or "
            "overlap=False."
        )
    return None


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
