"""The plan of a fit, decided once from numbers: workers, window, batch split, shards, the rule made for the fit.

Both Spark runners (:mod:`elephant.fit.classic`, :mod:`elephant.fit.connect`)
and the simulator (:mod:`elephant.fit.simulated`) plan through these
functions, so a fit on Spark and its simulation train the same plan.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from elephant.config import Settings
from elephant.fit.head import head_steps
from elephant.fit.shard_choice import ShardChoice, check_requested_shards, decide_shards, shard_blocker
from elephant.optimizers.base import DistributedOptimizer, worker_batch_size
from elephant.optimizers.local import (MAX_ASYNC_LAG, MAX_SCALED_WORKERS, RAMP_STEPS, LocalMoment, LocalMomentum,
                                       adapts_step_size, lag_window)

__all__ = ["COSTS", "ROUND_MIN_WINDOW", "ROUND_STEPS", "WARMUP_ROUND_STEPS", "FitPlan", "WindowChoice",
           "block_momentum_warning", "decide_window", "decide_workers", "estimate_commit_ms", "estimate_step_ms",
           "measured_costs", "model_size", "overlap_warning", "plan_fit", "round_least",
           "warmup_window", "window_cap"]

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


def _see(section: str) -> str:
    """The pointer a warning ends with: the section of docs/convergence.md that holds its figures."""
    return f'(see docs/convergence.md, "{section}")'


#: The sections of docs/convergence.md the fit-start warnings point to.
OVERLAP_SECTION = "Commits in flight (SparkModel(overlap=True))"
BLOCK_MOMENTUM_SECTION = "Windows at 8 or more workers"
ASYNC_HEAD_SECTION = "Where the defaults stand"
ASYNC_RAMPED_SECTION = "Measured on Spark, 4 and 8 workers (3 seeds)"
ASYNC_SCALED_SECTION = "The workers' rate under an adaptive optimizer"


def overlap_warning(overlap: bool, mode: str, window: int | None, num_workers: int) -> str | None:
    """The fit-start warning for ``overlap=True`` where it costs accuracy, else None: synchronous rounds at 4 or more
    workers, and windows shorter than 5 steps."""
    if not overlap or num_workers < 2:
        return None
    if mode == "synchronous" and num_workers >= 4:
        return (
            f"overlap=True in synchronous mode with {num_workers} workers: the steps taken while a round closes "
            "start from weights that miss that round's average, which costs accuracy against blocking rounds. "
            f"Use overlap=False or fewer workers {_see(OVERLAP_SECTION)}."
        )
    if window is not None and window < 5:
        return (
            f"overlap=True with a window of {window} steps: each delta then misses the center updates of one more "
            "flight, which doubles the staleness of a short window and lets momentum overshoot. Use a window of 5 "
            f"steps or more, or overlap=False {_see(OVERLAP_SECTION)}."
        )
    return None


def block_momentum_warning(rule: DistributedOptimizer, adaptive: bool, num_workers: int,
                           window: int | None) -> str | None:
    """The fit-start warning for the default block momentum at 8 or more workers under an adaptive optimizer, else None.

    Only fits that commit in windows of steps are warned; ``window`` is the fit's (None: one commit per pass).
    """
    outer = getattr(rule, "outer", None)  # the rules with an outer step (model averaging, DelayedNesterov)
    if outer is None or outer.momentum is not None or not adaptive or num_workers < 8 or window is None:
        return None
    beta = outer.resolve_momentum(num_workers)
    return (
        f"{type(rule).__name__} with block momentum {beta:g} at {num_workers} workers and an adaptive local "
        f"optimizer: its steady step is {1 / (1 - beta):g} times the workers' mean progress, and the first epochs "
        "end behind plain Keras. Check the first epochs against a short plain Keras run, train more epochs or use "
        f"fewer workers {_see(BLOCK_MOMENTUM_SECTION)}."
    )


#: The most workers at which the asynchronous default, its rate scaled and ramped (or started by the driver's
#: head), is known to catch up with plain Keras by the end of a second epoch: up to it, only one-epoch fits are
#: warned about; beyond it, two-epoch fits too (docs/convergence.md, "Measured on Spark, 4 and 8 workers (3 seeds)").
TWO_EPOCHS_HELD_WORKERS = 8


def async_window_warning(rule: DistributedOptimizer, adaptive: bool, num_workers: int,
                         window: int | None, epochs: int | None = None, warmup_window: int | None = None,
                         head: bool = False) -> str | None:
    """The fit-start warning for asynchronous windows at 4 or more workers under an adaptive optimizer, else None.

    Warned: the asynchronous default (DelayedNesterov) committing in windows (``window`` not None; one commit per
    pass is left alone) under an adaptive optimizer at 4 or more workers. Where its workers train at a scaled rate
    the first epoch is the one that trails plain Keras up to :data:`TWO_EPOCHS_HELD_WORKERS` workers when the rate
    ramps up or the driver trains a head (``head``: ``FitPlan.head_steps``), and the first two elsewhere, so a fit
    of more ``epochs`` (None: unknown) is not warned; at the compiled rate every fit is. The warning says which of
    these cases the fit is in (a head, the first epoch's shorter windows while the rate ramps: ``warmup_window``,
    or a window fixed throughout) and points to the section of docs/convergence.md that holds its figures.
    """
    if rule.name != "delayednesterov" or not adaptive or num_workers < 4 or window is None:
        return None
    scaled = bool(getattr(rule, "sqrt_scaling", None))
    ramped = num_workers > MAX_SCALED_WORKERS  # sqrt(K), ramped up over the first epoch
    # the epochs that trail plain Keras: the first one where the rate ramps or a head starts it, up to 8 workers
    behind = 1 if num_workers <= TWO_EPOCHS_HELD_WORKERS and (ramped or head) else 2
    if scaled and epochs is not None and epochs > behind:
        return None
    if not scaled:
        return (
            f"Asynchronous windows at {num_workers} workers with an adaptive local optimizer at its compiled rate: "
            "the first epoch ends far behind plain Keras and the second still behind, where the synchronous default "
            "catches up. For fits of one or two epochs prefer mode='synchronous', or check the first epochs against "
            f"a short plain Keras run {_see(ASYNC_RAMPED_SECTION)}."
        )
    first = "the first epoch" if behind == 1 else "the first two epochs"
    fits = "one-epoch fits" if behind == 1 else "fits of one or two epochs"
    if head:
        how, section = f"after the driver's head, {first} can still end behind plain Keras", ASYNC_HEAD_SECTION
    elif not ramped:  # 4 workers, no head: the first two epochs
        how, section = ("without a head on the driver, the first epoch can end several points behind plain Keras and "
                        "the second just behind, further than the synchronous default's", ASYNC_SCALED_SECTION)
    elif warmup_window is not None:
        how, section = (f"without a head on the driver the rate ramps up over the first epoch, and {first} can end "
                        "several points behind plain Keras, further than the synchronous default's",
                        ASYNC_RAMPED_SECTION)
    else:
        how, section = ("without a head on the driver and with a window fixed for every epoch (no shorter windows "
                        f"while the rate ramps up), {first} can end far behind plain Keras, further than the "
                        "synchronous default's", ASYNC_RAMPED_SECTION)
    return (
        f"Asynchronous windows at {num_workers} workers with an adaptive local optimizer at sqrt({num_workers}) "
        f"times its rate: {how}. For {fits} prefer mode='synchronous', or check {first} against a short plain "
        f"Keras run {_see(section)}."
    )


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
        window_choice: how ``window`` was decided from the model's and the fit's
            costs, or None when ``frequency`` or the rule fixed it.
        adaptive: whether the model's optimizer adapts its step size (Adam, RMSprop...).
        shard_choice: how many parameter-server shards serve the fit, and why (None: one).
        learning_rate_scale: the factor on the compiled learning rate the workers train
            with (``rule.local_rate_scale``: ``√K`` for the averaging defaults under an
            adaptive optimizer on the split batch; 1: as compiled).
        learning_rate_warmup: whether, in the fit's first epoch, each worker ramps that
            factor up from 1 over its pass (``rule.local_rate_warmup``: a factor above 2).
        local_moment: the workers' second-moment decay (``rule.local_moment``: averaged
            over ``K`` times the steps where the rate is scaled), or None: as compiled.
        local_momentum: the workers' running mean of the gradient (``rule.local_momentum``: younger by
            the asynchronous commits' lag), or None: as compiled.
        hosted: whether the epochs' tasks serve the parameter server (``ps_placement``
            "executors", and every Spark Connect fit) rather than the driver.
        warmup_window: the local steps per commit in the workers' first steps of the fit's
            first epoch, where it ramps their rate up or follows a head (None: ``window``
            throughout): a decided window under the warm-up's round bound (:data:`WARMUP_ROUND_STEPS`).
        head_steps: the workers' first steps of the fit's first epoch whose rows the driver
            trains with the compiled optimizer on the global batch (:mod:`elephant.fit.head`;
            in the user's batches, more steps where a worker's batch is rounded up), the workers
            then at the full factor from their first step; 0: none. Planned wherever the workers
            train at a scaled factor (``learning_rate_scale`` above 1), for a fit whose server the
            driver hosts; beyond 4 workers it replaces the factor's ramp.
    """

    num_workers: int
    batch_size: int
    worker_batch_size: int
    window: int | None
    splits_batch: bool
    overlap: bool
    rule: DistributedOptimizer
    window_choice: WindowChoice | None = None
    adaptive: bool = False
    shard_choice: ShardChoice | None = None
    hosted: bool = False
    learning_rate_scale: float = 1.0
    learning_rate_warmup: bool = False
    local_moment: LocalMoment | None = None
    local_momentum: LocalMomentum | None = None
    warmup_window: int | None = None
    head_steps: int = 0

    @property
    def head_batch_size(self) -> int | None:
        """The batch the head's rows are trained in (:func:`~elephant.fit.head.global_batches`): the user's, where
        the workers split it; None (each step every worker's batch joined) where they do not."""
        return self.batch_size if self.splits_batch else None

    @property
    def ps_shards(self) -> int:
        """The parameter server's shards ``S`` (1: one store, the unsharded server)."""
        return 1 if self.shard_choice is None else self.shard_choice.shards

    def as_dict(self) -> dict[str, Any]:
        """The plan as ``SparkModel.fit_plan`` shows it."""
        return {"num_workers": self.num_workers, "batch_size": self.batch_size,
                "worker_batch_size": self.worker_batch_size, "window": self.window,
                "optimizer": self.rule.get_config(), "overlap": self.overlap,
                "window_choice": None if self.window_choice is None else self.window_choice.as_dict(),
                "learning_rate_scale": self.learning_rate_scale, "learning_rate_warmup": self.learning_rate_warmup,
                "local_moment": None if self.local_moment is None else self.local_moment.as_dict(),
                "local_momentum": None if self.local_momentum is None else self.local_momentum.as_dict(),
                "warmup_window": self.warmup_window, "head_steps": self.head_steps,
                "ps_shards": self.ps_shards, "ps_placement": "executors" if self.hosted else "driver",
                "shard_choice": None if self.shard_choice is None else self.shard_choice.as_dict()}

    def rechecked(self, stats: Iterable[Mapping[str, Any]]) -> FitPlan:
        """This plan with its decided window re-decided from an epoch's timed costs (else unchanged)."""
        choice = self.window_choice
        if choice is None or choice.measured or choice.window is None:  # one commit per pass stays so
            return self
        costs = measured_costs(stats)
        if costs is None:
            return self
        choice = choice.again(*costs)
        return dataclasses.replace(self, window=choice.window, window_choice=choice)

    def warnings(self, mode: str, epochs: int | None = None) -> list[str]:
        """The fit-start warnings for settings known to train worse than plain Keras (the rule's and
        ``overlap``'s) in a fit of ``epochs`` epochs (None: unknown)."""
        found = [self.rule.setup_warning(self.window, self.num_workers, self.splits_batch),
                 overlap_warning(self.overlap, mode, self.window, self.num_workers),
                 block_momentum_warning(self.rule, self.adaptive, self.num_workers, self.window)
                 if mode == "synchronous" else async_window_warning(self.rule, self.adaptive, self.num_workers,
                                                                    self.window, epochs, self.warmup_window,
                                                                    self.head_steps > 0)]
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
        moment = ""
        if self.local_moment is not None:
            moment = (f"; the workers' optimizer trains with {self.local_moment.describe()} "
                      "(decay_scaling=False turns it off)")
        if self.local_momentum is not None:
            moment += (f"; the workers' optimizer trains with {self.local_momentum.describe()} "
                       "(momentum_scaling=False turns it off)")
        warmup = ("" if self.warmup_window is None else
                  f" ({self.warmup_window} in the workers' first {RAMP_STEPS} steps of the first epoch)")
        head = ("" if not self.head_steps else
                f"; the driver trains the rows of the workers' first {self.head_steps} steps of the first epoch "
                "with the compiled optimizer on the global batch, the workers the rest of it at the full factor")
        return (f"elephant fit: {self.num_workers} workers, {self.rule.describe(self.num_workers)}{moment}, "
                f"window={self.window}{warmup}{head}; {batches}; {flights}")


def model_size(model) -> tuple[int, int]:
    """``(parameters, bytes)`` of a Keras model's weights."""
    import numpy as np

    params = nbytes = 0
    for variable in model.weights:
        count = int(np.prod(variable.shape))
        params += count
        nbytes += count * np.dtype(variable.dtype).itemsize
    return params, nbytes


#: Seconds between two commits of one worker assumed where the pass's length is unknown (choose_shards' default).
UNKNOWN_COMMIT_INTERVAL_S = 2.0


def round_least(optimizer: Any, local: Any, num_workers: int, batch_split: bool) -> int:
    """The least window the round bound may give ``optimizer`` (a rule that adapts its window) in this fit:
    :data:`ROUND_MIN_WINDOW` where its workers train at a scaled rate with windows, else its floor."""
    floor = optimizer.window_from_costs
    windowed = optimizer.for_fit(local, num_workers, batch_split, floor)
    return ROUND_MIN_WINDOW if windowed.local_rate_scale(local, num_workers, batch_split) > 1.0 else floor


def plan_fit(settings: Settings, model: Any, num_workers: int, batch_size: int, samples: int | None = None,
             cores: int = 1, *, hosted: bool = False) -> FitPlan:
    """The plan of a fit of ``num_workers`` workers with ``settings`` for the compiled Keras ``model``.

    ``samples`` (the training samples, None: unknown) and ``cores`` (per task)
    feed the window decision of a rule that adapts its window
    (``DistributedOptimizer.adapts_window``) when ``frequency`` is not given,
    and the estimate of the seconds between a worker's commits that the
    number of parameter-server shards is decided from. ``hosted``: the server
    lives in the workers' tasks (Spark Connect), one shard in each of the first ``S``.

    Raises:
        ConfigError: ``ps_shards > 1`` where the server cannot be sharded, or more
            shards than workers where they host them.
    """
    check_requested_shards(settings, num_workers if hosted else None)
    window, split = settings.window, settings.splits_batch
    per_worker = worker_batch_size(batch_size, num_workers, split)
    params, nbytes = model_size(model)
    step_ms, commit_ms = estimate_step_ms(params, per_worker, cores), estimate_commit_ms(nbytes)
    steps_per_pass = max(1, math.ceil(math.ceil(samples / num_workers) / per_worker)) if samples else None
    choice = None
    if settings.frequency is None and settings.optimizer.adapts_window and samples:
        choice = WindowChoice.decide(
            floor=settings.optimizer.window_from_costs, per_pass=window is None, model_bytes=nbytes, step_ms=step_ms,
            commit_ms=commit_ms, steps_per_pass=steps_per_pass, budget=settings.comm_budget, measured=False,
            workers=num_workers if split else 1, least=round_least(settings.optimizer, model.optimizer, num_workers,
                                                                     split), lagged=settings.mode != "synchronous")
        window = choice.window
    steps = window or steps_per_pass
    interval = UNKNOWN_COMMIT_INTERVAL_S if steps is None else (steps * step_ms + commit_ms) / 1000.0
    blocked = shard_blocker(settings)
    shard_choice = ShardChoice(decide_shards(settings.ps_shards, nbytes, num_workers, interval, blocked, hosted),
                               settings.ps_shards, nbytes, num_workers, interval, blocked)
    rule = settings.optimizer.for_fit(model.optimizer, num_workers, split, window)
    warmup = rule.local_rate_warmup(model.optimizer, num_workers, split)
    scale = rule.local_rate_scale(model.optimizer, num_workers, split)
    # the head starts the workers at a scaled rate (replacing the ramp beyond 4 workers) where the driver hosts the
    # server and the batch splits into a sample or more a worker
    head = head_steps(steps_per_pass) if scale > 1.0 and not hosted and num_workers <= batch_size else 0
    return FitPlan(
        num_workers=num_workers, batch_size=batch_size, worker_batch_size=per_worker, window=window,
        splits_batch=split, overlap=settings.overlap, rule=rule, window_choice=choice,
        adaptive=adapts_step_size(model.optimizer), shard_choice=shard_choice, hosted=hosted,
        learning_rate_scale=scale, learning_rate_warmup=warmup and not head,
        local_moment=rule.local_moment(model.optimizer, num_workers, split),
        local_momentum=rule.local_momentum(model.optimizer, num_workers, split, window),
        warmup_window=warmup_window(window, num_workers) if choice is not None and warmup and split else None,
        head_steps=head,
    )


def warmup_window(window: int | None, num_workers: int) -> int | None:
    """The window while the first epoch ramps the workers' rate: ``window`` under the warm-up's round bound
    (:data:`WARMUP_ROUND_STEPS` over the workers, at least 1), or None where that bound leaves it unchanged."""
    if window is None:
        return None
    bounded = max(1, min(window, WARMUP_ROUND_STEPS // max(num_workers, 1)))
    return bounded if bounded < window else None
