"""The plan of a fit, decided once from numbers: workers, window, batch split, shards, the rule made for the fit.

Both Spark runners (:mod:`elephant.fit.classic`, :mod:`elephant.fit.connect`)
and the simulator (:mod:`elephant.fit.simulated`) plan through these
functions, so a fit on Spark and its simulation train the same plan. What
the defaults add to the user's optimizer (the batch split, the window, the
rule made for the fit, the workers' rate and moments, the driver's head) is
decided step by step in :mod:`elephant.fit.recipe`, the window's arithmetic in
:mod:`elephant.fit.window`, the shards in :mod:`elephant.fit.shard_choice`;
the plan's warnings are :mod:`elephant.fit.start_warnings`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from elephant.config import Settings
from elephant.fit.recipe import Fit, Outcome, describe_outcomes, follow
from elephant.fit.shard_choice import ShardChoice, check_requested_shards, decide_shards, shard_blocker
from elephant.fit.start_warnings import async_window_warning, block_momentum_warning, overlap_warning
from elephant.fit.window import WindowChoice, measured_costs
from elephant.optimizers.base import DistributedOptimizer
from elephant.optimizers.local import RAMP_STEPS, LocalMoment, LocalMomentum, adapts_step_size

__all__ = ["FitPlan", "decide_workers", "model_size", "plan_fit"]


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
            throughout): a decided window under the warm-up's round bound
            (:data:`~elephant.fit.window.WARMUP_ROUND_STEPS`).
        head_steps: the workers' first steps of the fit's first epoch whose rows the driver
            trains with the compiled optimizer on the global batch (:mod:`elephant.fit.head`;
            in the user's batches, more steps where a worker's batch is rounded up), the workers
            then at the full factor from their first step; 0: none. Planned wherever the workers
            train at a scaled factor (``learning_rate_scale`` above 1), for a fit whose server the
            driver hosts; beyond 4 workers it replaces the factor's ramp.
        recipe: what each step of the defaults' recipe (:data:`~elephant.fit.recipe.RECIPE`) did in
            this fit, and why.
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
    recipe: tuple[Outcome, ...] = ()

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
                "shard_choice": None if self.shard_choice is None else self.shard_choice.as_dict(),
                "recipe": [outcome.as_dict() for outcome in self.recipe]}

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
        """One log line: the workers, the rule, the window, the batches, the overlap and the recipe's steps."""
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
                f"window={self.window}{warmup}{head}; {batches}; {flights}; {describe_outcomes(self.recipe)}")


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


def plan_fit(settings: Settings, model: Any, num_workers: int, batch_size: int, samples: int | None = None,
             cores: int = 1, *, hosted: bool = False) -> FitPlan:
    """The plan of a fit of ``num_workers`` workers with ``settings`` for the compiled Keras ``model``: the
    defaults' recipe (:data:`~elephant.fit.recipe.RECIPE`) followed in order, then the parameter server's shards.

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
    params, nbytes = model_size(model)
    fit = Fit(settings, model.optimizer, num_workers, batch_size, samples, cores, hosted, params, nbytes)
    planned, outcomes = follow(fit)
    per_worker = planned["worker_batch_size"]
    steps, step_ms = planned["window"] or fit.pass_steps(per_worker), fit.step_ms(per_worker)
    interval = UNKNOWN_COMMIT_INTERVAL_S if steps is None else (steps * step_ms + fit.commit_ms) / 1000.0
    blocked = shard_blocker(settings)
    shard_choice = ShardChoice(decide_shards(settings.ps_shards, nbytes, num_workers, interval, blocked, hosted),
                               settings.ps_shards, nbytes, num_workers, interval, blocked)
    return FitPlan(num_workers=num_workers, batch_size=batch_size, overlap=settings.overlap,
                   adaptive=adapts_step_size(model.optimizer), shard_choice=shard_choice, hosted=hosted,
                   recipe=outcomes, **planned)

