"""Synchronous model averaging / Local SGD (Stich 2019)."""

from __future__ import annotations

from elephant import weights as W
from elephant.errors import ConfigError
from elephant.optimizers.base import DistributedOptimizer
from elephant.optimizers.registry import register
from elephant.optimizers.local import ScaledLocalRate, check_sqrt_scaling
from elephant.optimizers.outer import OuterMomentum


#: The default block momentum's steady gain at most: ``β = 1 − 1/min(K, MAX_GAIN)``.
MAX_GAIN = 4


@register
class ModelAveraging(ScaledLocalRate, DistributedOptimizer):
    """Synchronous rounds: the center moves by the sample-weighted mean delta, through an outer step.

    Worker: after ``window`` local steps (the period ``H``) send
    ``Δᵏ = θᵏ − θ̃``; wait for the round; adopt the new center.

    Server, one round over the workers that trained (``num_samples > 0``)::

        d = Σₖ wₖ Δᵏ        with wₖ = samplesₖ / Σⱼ samplesⱼ
        u ← β·u + d;   θ̃ ← θ̃ + α·(d + β·u)      (outer Nesterov step)

    With ``outer_lr=1, outer_momentum=0`` this is plain model averaging (Local
    SGD): ``θ̃ ← θ̃ + d``. A worker that trained nothing contributes nothing (it
    does not dilute the mean). Since every worker of a round started from the
    same center, ``d`` moves the center to the sample-weighted mean of the
    workers' weights; with equal shards and ``window=1`` plain averaging is
    synchronous mini-batch SGD. Deltas are summed in worker order, so the result
    does not depend on the order commits arrived in. Note the difference from
    DOWNPOUR under a barrier, which would *sum* them.

    The default outer step is block momentum ``β = 1 − 1/min(K, 4)`` for ``K``
    workers (BMUF's ``1 − 1/K``, capped), Nesterov form: a mean only moves the
    center by one worker's progress, and in steady state the momentum makes
    that ``α/(1 − β) = min(K, 4)`` workers' worth, smoothed over rounds. The cap
    (:data:`MAX_GAIN`) is there because at 8 to 32 workers ``1 − 1/K``
    overshot (a Conv2D trained with RMSprop diverged at 8 workers, a Conv1D
    oscillated at 16 and 32), where a gain of 4 held or gained in most
    comparisons (docs/convergence.md, "The outer step at 8 to 32 workers").
    Together with the batch split (``splits_batch``: each worker trains
    ``batch_size / K``), this is what brings averaging to plain Keras' accuracy
    at equal epochs (docs/convergence.md, "The defaults"); with one worker
    ``β = 0`` and the rule is exactly sequential training.

    Under an adaptive local optimizer (Adam, RMSprop...) with the batch split
    among 2 to 4 workers, the workers instead train at ``√K`` times the compiled learning rate
    (``sqrt_scaling``, :class:`~elephant.optimizers.local.ScaledLocalRate`) and the
    default outer step is plain averaging: the scaled rate already makes the
    mean delta about one step of the full batch, and block momentum on top of
    it overshoots in the first epochs (docs/convergence.md, "The workers' rate
    under an adaptive optimizer").
    From 5 to 64 workers the same holds when the compiled rate is a number, with
    the factor ramped up from 1 over the first epoch (``ramps_scaling``): from
    the first step it collapsed at high rates.

    Mode: ``"synchronous"``.

    Args:
        window: local steps per round (``H``). Default 8 (no canonical value;
            ``window=1`` is mini-batch SGD, larger saves communication).
        outer_lr: α > 0. Default 1.
        outer_momentum: β in [0, 1), or None (default) for ``1 − 1/min(K, 4)``
            (0 when the workers' rate is scaled).
            ``outer_momentum=0`` (with ``outer_lr=1``) is the paper's averaging.
        nesterov: Nesterov (default) or heavy-ball outer momentum.
        sqrt_scaling: the workers train at ``√K`` times the compiled rate;
            None (default) decides it at fit start (on for an adaptive
            optimizer on a batch split among 2 to 4 workers, and 5 to 64 with a
            numeric rate, ramped), True or False forces it.
        decay_scaling: the workers' adaptive optimizer averages its running
            magnitude of the gradient over ``K`` times the steps (RMSprop's
            ``rho``, Adam's ``beta_2``: ``1 − (1 − d)/K``; RMSprop's start
            from zero then corrected by the rate, as Adam's is), as many
            samples as plain training's
            (:class:`~elephant.optimizers.local.LocalMoment`); None (default)
            wherever the workers' rate is scaled, True or False forces it.

    Reference: S. U. Stich, "Local SGD Converges Fast and Communicates Little",
    ICLR 2019; T. Lin et al., "Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020;
    K. Chen, Q. Huo, BMUF, ICASSP 2016; J. Wang et al., "SlowMo", ICLR 2020;
    A. Douillard et al., "DiLoCo", arXiv:2311.08105, 2023.
    """

    name = "modelaveraging"
    ramps_scaling = True
    aliases = ("averaging", "model_averaging", "localsgd")
    modes = ("synchronous",)
    default_window = 8
    elementwise = True
    window_from_costs = 8
    splits_batch = True
    streams_rounds = True

    def __init__(self, window=None, outer_lr=1.0, outer_momentum=None, nesterov=True, staleness_bound=None,
                 sqrt_scaling=None, decay_scaling=None):
        super().__init__(window=window, staleness_bound=staleness_bound)
        self.outer = OuterMomentum(outer_lr, outer_momentum, nesterov, max_gain=MAX_GAIN)
        self.sqrt_scaling = check_sqrt_scaling(sqrt_scaling)
        self.decay_scaling = check_sqrt_scaling(decay_scaling, "decay_scaling")

    def for_fit(self, local, num_workers, batch_split, window):
        return self.resolved_for_fit(local, num_workers, batch_split, None)  # unscaled: block momentum

    def describe(self, num_workers):
        return f"{self!r}; {self.outer.describe(num_workers)}{self.describe_scaling(num_workers)}"

    def on_learning_rate_change(self, state, ratio):
        return self.outer.rescale(state, ratio)

    def server_init(self, center, num_workers):
        return self.outer.init(center, num_workers)

    def round_begin(self, num_workers):
        return W.WeightedSum()

    def round_add(self, acc, worker, commit):
        acc.add(commit.tensors, commit.num_samples)  # an empty window (0 samples) adds nothing
        return acc

    def round_end(self, state, center, clock, acc, workers):
        replies = {k: None for k in workers}
        if acc.total == 0:
            return center, replies, state
        center, state = self.outer.step(state, center, acc.mean())
        return center, replies, state

    def apply_round(self, state, center, clock, commits):
        acc = self.round_begin(len(commits))
        for worker, commit in sorted(commits.items()):
            acc = self.round_add(acc, worker, commit)
        return self.round_end(state, center, clock, acc, list(commits))

    def get_config(self):
        return {"window": self.window, "outer_lr": self.outer.learning_rate,
                "outer_momentum": self.outer.momentum, "nesterov": self.outer.nesterov,
                "sqrt_scaling": self.sqrt_scaling, "decay_scaling": self.decay_scaling}


def post_local_sgd_step(step: int, warmup: int, period: int) -> bool:
    """Whether PyTorch's post-local SGD averages after optimizer step ``step`` (from 0).

    During the first ``warmup`` steps every step is synchronised (mini-batch SGD);
    afterwards the models are averaged when ``(step − warmup) % period == 0``.
    Use it to script a post-local SGD schedule for :func:`~elephant.optimizers.simulate`.

    Raises:
        ConfigError: ``warmup`` is negative or ``period`` is not positive.
    """
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"`warmup` must be an int >= 0; received warmup={warmup!r}")
    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
        raise ConfigError(f"`period` must be a positive int; received period={period!r}")
    if step < warmup:
        return True
    return (step - warmup) % period == 0
