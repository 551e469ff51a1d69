"""The window decision: a step's and a commit's prior costs, accuracy's bounds on a window, and the choice.

A rule that adapts its window (``DistributedOptimizer.adapts_window``) commits
every ``window`` local steps, the fewest whose compute outweighs a commit's
cost by the fit's ``comm_budget``, bounded by accuracy (:func:`decide_window`).
:func:`~elephant.fit.plan.plan_fit` decides it from the model's size and
:meth:`~elephant.fit.plan.FitPlan.rechecked` again from the first epoch's timings
(docs/convergence.md, "What the defaults decide").
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from elephant.optimizers.local import MAX_ASYNC_LAG, lag_window

__all__ = ["COSTS", "MAX_WINDOW", "MIN_SYNCS_PER_PASS", "ROUND_MIN_WINDOW", "ROUND_STEPS", "WARMUP_ROUND_STEPS",
           "WindowChoice", "decide_window", "estimate_commit_ms", "estimate_step_ms", "measured_costs",
           "round_least", "warmup_window", "window_cap"]

#: What the window decision assumes before a fit has timed itself. A commit costs ``commit_fixed_ms`` plus
#: ``commit_ms_per_mb`` per MB of weights: about twice the parameter server's round trip
#: (``benchmarks/ps_roundtrip.py``), since a fit's commit also copies the weights out of and into the model, runs
#: the rule on the server and, on a machine whose cores the server shares with the workers, waits for it
#: (docs/convergence.md, "What the defaults decide", has the round trip's timings). A local step costs
#: ``step_fixed_ms`` of dispatch plus its arithmetic, about 6 floating-point operations per parameter and sample
#: (forward and backward) at ``flops_per_ms_per_core``; convolutions and recurrent layers do more per parameter,
#: so the prior underestimates their steps and the first epoch's timings correct it.
COSTS = {"commit_fixed_ms": 2.0, "commit_ms_per_mb": 4.0, "step_fixed_ms": 1.0, "flops_per_ms_per_core": 2.0e7}
#: Accuracy's bounds on a decided window (docs/convergence.md, "What the defaults decide"): at least this
#: many synchronisations per partition pass, and never windows longer than ``MAX_WINDOW`` steps.
MIN_SYNCS_PER_PASS = 8
MAX_WINDOW = 128
#: Accuracy's bound on a round when ``K`` workers split the global batch: at most this many local steps over
#: all workers (a window of ``ROUND_STEPS // K``, never below the rule's floor or ``ROUND_MIN_WINDOW``, whichever
#: is less). Under the split each worker's
#: step sees ``1/K`` of the batch, so its noise grows with ``K``; the workers' weights drift apart with that
#: noise times the steps of the window, and averaging loses what they drift. The bound shortens the windows
#: the costs alone would decide from 8 workers on, which lose the first epoch; at 2 and 4 workers it is above
#: the decided windows and changes nothing (docs/convergence.md, "Windows at 8 or more workers").
ROUND_STEPS = 128
#: The least window the round bound gives a rule whose floor is above it (the asynchronous default's 32
#: steps, kept at 2 and 4 workers) when its workers train at a scaled rate: there the round's shorter windows
#: train the first epochs better than the floor's. Its workers at the compiled rate (SGD) keep the floor, where
#: windows of 8 steps train worse than 32 (docs/convergence.md, "Beyond 4 workers, asynchronous windows").
ROUND_MIN_WINDOW = 8
#: The round bound while the first epoch ramps the workers' rate up (:data:`~elephant.optimizers.local.RAMP_STEPS`
#: steps at most): at most this many local steps over all ``K`` workers, a window of ``WARMUP_ROUND_STEPS // K``
#: (at least 1), as large-batch training warms up before local steps grow (post-local SGD). Early steps move the
#: weights most, so the workers' drift between two averagings is largest then (docs/convergence.md).
WARMUP_ROUND_STEPS = 32


def estimate_step_ms(params: int, batch_size: int, cores: int = 1) -> float:
    """A local step's prior cost in ms for a model of ``params`` parameters at ``batch_size`` samples."""
    flops = 6.0 * params * batch_size
    return COSTS["step_fixed_ms"] + flops / (COSTS["flops_per_ms_per_core"] * max(cores, 1))


def estimate_commit_ms(model_bytes: int) -> float:
    """A commit's prior cost in ms (round trip, weight copies and the server's rule) for ``model_bytes``."""
    return COSTS["commit_fixed_ms"] + COSTS["commit_ms_per_mb"] * model_bytes / 2**20


def decide_window(floor: int, step_ms: float, commit_ms: float, steps_per_pass: int, budget: float, *,
                  per_pass: bool = False, workers: int = 1, min_syncs: int = MIN_SYNCS_PER_PASS,
                  max_window: int = MAX_WINDOW, least: int = ROUND_MIN_WINDOW, lagged: bool = False) -> int | None:
    """Local steps per commit so that committing costs at most ``budget`` of a worker's time, within accuracy's bounds.

    The window is the fewest steps whose compute time is at least
    ``(1 - budget) / budget`` times ``commit_ms``, bounded by accuracy: at least
    ``floor`` (the rule's ``window_from_costs``) and at most
    ``steps_per_pass / min_syncs``, ``max_window`` and, when ``workers`` split
    the global batch, ``ROUND_STEPS / workers`` and, for ``lagged`` (asynchronous)
    windows, the window whose lag is :data:`~elephant.optimizers.local.MAX_ASYNC_LAG` steps (fewer
    synchronisations lose accuracy; a pass shorter than ``floor * min_syncs`` keeps
    ``floor``; the round and lag bounds may go below the floor down to ``least``). Where the
    budget needs a longer window than that, accuracy wins and the fit spends more
    than ``budget`` on commits.
    With ``per_pass`` (a rule whose default is one commit per pass) the answer is
    None, one commit per pass, on a pass too short for ``min_syncs`` windows of
    ``floor`` steps: there the rule keeps its default (its workers all start the
    pass from one center: nothing lags). Where
    the round bound is below the floor (more workers, at a scaled rate: ``least``
    below ``floor``) the round's windows win on short passes too.
    """
    if per_pass and steps_per_pass < min_syncs * floor and window_cap(
            floor, steps_per_pass, min_syncs, max_window, workers, least) >= floor:
        return None
    cap = window_cap(floor, steps_per_pass, min_syncs, max_window, workers, least, lagged)
    needed = math.ceil(commit_ms * (1.0 - budget) / (budget * max(step_ms, 1e-6)))
    return int(min(max(floor, needed), cap))


def window_cap(floor: int, steps_per_pass: int, min_syncs: int = MIN_SYNCS_PER_PASS,
               max_window: int = MAX_WINDOW, workers: int = 1, least: int = ROUND_MIN_WINDOW,
               lagged: bool = False) -> int:
    """The longest window accuracy allows: ``max_window`` and ``min_syncs`` per pass, never below ``floor``, and
    ``ROUND_STEPS`` over the ``workers`` that split the batch (and, ``lagged``,
    :func:`~elephant.optimizers.local.lag_window`), never below ``floor`` or ``least``, whichever is less
    (``least``: :data:`ROUND_MIN_WINDOW` where the workers' rate is scaled, else the rule's floor)."""
    per_pass = max(floor, min(max_window, steps_per_pass // max(min_syncs, 1)))
    bound = ROUND_STEPS // max(workers, 1)
    if lagged and workers > 1:
        bound = min(bound, lag_window(workers))
    return max(min(floor, least), min(per_pass, bound))


def measured_costs(stats: Iterable[Mapping[str, Any]]) -> tuple[float, float] | None:
    """``(step_ms, commit_ms)`` from an epoch's partition stats (medians over the partitions), or None.

    A partition's compute time is its seconds less set-up and time blocked on the
    parameter server; its commit time, that blocked time per commit (for a
    synchronous round it includes the wait for the round, which is part of what a
    commit costs the worker).
    """
    steps, commits = [], []
    for row in stats:
        n, k = row.get("steps") or 0, row.get("commits") or 0
        if n <= 0 or k <= 0 or "seconds" not in row:
            continue
        comm = float(row.get("comm_seconds", 0.0))
        compute = float(row["seconds"]) - float(row.get("setup_seconds", 0.0)) - comm
        steps.append(1000.0 * max(compute, 0.0) / n)
        commits.append(1000.0 * comm / k)
    if not steps:
        return None
    return statistics.median_high(steps), statistics.median_high(commits)


@dataclasses.dataclass(frozen=True)
class WindowChoice:
    """How a fit's window was decided, with its inputs (logged, and in ``SparkModel.fit_plan``).

    Attributes:
        window: the local steps per commit chosen (None: one commit per pass).
        floor: the least window the decision gives (the rule's ``window_from_costs``).
        per_pass: whether the rule's default is one commit per pass, kept on short passes.
        model_bytes: the bytes of the model's weights (what each commit moves each way).
        step_ms, commit_ms: a local step's and a commit's cost in ms, estimated
            from the model's size (``measured`` False) or timed in an epoch.
        steps_per_pass: local steps in a worker's pass over its partition.
        budget: the share of a worker's time commits may take (``SparkModel(comm_budget=)``).
        measured: whether the costs come from a finished epoch's timings.
        workers: the workers that split the global batch (1 without the batch split),
            which bound a round's steps (:data:`ROUND_STEPS`).
        least: the least window the round bound gives a rule whose floor is above it
            (:data:`ROUND_MIN_WINDOW` where the workers train at a scaled rate, else the floor).
        lagged: whether the workers commit without a barrier (asynchronously), so that the windows
            are bounded by their lag too (:data:`~elephant.optimizers.local.MAX_ASYNC_LAG`).
    """

    window: int | None
    floor: int
    per_pass: bool
    model_bytes: int
    step_ms: float
    commit_ms: float
    steps_per_pass: int
    budget: float
    measured: bool
    workers: int = 1
    least: int = ROUND_MIN_WINDOW
    lagged: bool = False

    @classmethod
    def decide(cls, *, floor: int, per_pass: bool, model_bytes: int, step_ms: float, commit_ms: float,
               steps_per_pass: int, budget: float, measured: bool, workers: int = 1,
               least: int = ROUND_MIN_WINDOW, lagged: bool = False) -> WindowChoice:
        window = decide_window(floor, step_ms, commit_ms, steps_per_pass, budget, per_pass=per_pass, workers=workers,
                               least=least, lagged=lagged)
        return cls(window, floor, per_pass, model_bytes, step_ms, commit_ms, steps_per_pass, budget, measured, workers,
                   least, lagged)

    def again(self, step_ms: float, commit_ms: float) -> WindowChoice:
        """The decision from an epoch's timed costs (a fit that commits every ``window`` steps keeps doing so)."""
        return self.decide(floor=self.floor, per_pass=False, model_bytes=self.model_bytes, step_ms=step_ms,
                           commit_ms=commit_ms, steps_per_pass=self.steps_per_pass, budget=self.budget,
                           measured=True, workers=self.workers, least=self.least, lagged=self.lagged)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        how = "measured in the last epoch" if self.measured else "estimated from the model's size"
        steps = self.steps_per_pass if self.window is None else self.window
        share = self.commit_ms / (self.commit_ms + steps * self.step_ms)
        chosen = "one commit per pass" if self.window is None else f"window={self.window} steps"
        cap = window_cap(self.floor, self.steps_per_pass, workers=self.workers, least=self.least, lagged=self.lagged)
        rounds = (f" and a round of {self.workers} workers sharing the batch holds at most {ROUND_STEPS} steps"
                  if self.workers > 1 else "")
        if self.workers > 1 and self.lagged and self.least < self.floor:
            rounds += f", each worker's start lagging the center by at most {MAX_ASYNC_LAG:g} steps"
        return (f"{chosen}, decided from {self.model_bytes / 2**20:.2f} MB of weights, "
                f"{self.step_ms:.2f} ms per local step and {self.commit_ms:.2f} ms per commit ({how}) and "
                f"{self.steps_per_pass} steps per pass: commits take ~{100 * share:.0f}% of a worker's time "
                f"(comm_budget={self.budget:g}; windows of {min(self.floor, cap)} to {cap} steps, so that a pass keeps "
                f"{MIN_SYNCS_PER_PASS} synchronisations where it can{rounds}; frequency= fixes the window)")


def round_least(optimizer: Any, local: Any, num_workers: int, batch_split: bool) -> int:
    """The least window the round bound may give ``optimizer`` (a rule that adapts its window) in this fit:
    :data:`ROUND_MIN_WINDOW` where its workers train at a scaled rate with windows, else its floor."""
    floor = optimizer.window_from_costs
    windowed = optimizer.for_fit(local, num_workers, batch_split, floor)
    return ROUND_MIN_WINDOW if windowed.local_rate_scale(local, num_workers, batch_split) > 1.0 else floor



def warmup_window(window: int | None, num_workers: int) -> int | None:
    """The window while the first epoch ramps the workers' rate: ``window`` under the warm-up's round bound
    (:data:`WARMUP_ROUND_STEPS` over the workers, at least 1), or None where that bound leaves it unchanged."""
    if window is None:
        return None
    bounded = max(1, min(window, WARMUP_ROUND_STEPS // max(num_workers, 1)))
    return bounded if bounded < window else None
