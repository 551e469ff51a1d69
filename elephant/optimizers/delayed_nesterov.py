"""Asynchronous averaging with a delayed outer Nesterov step (Liu et al., 2024)."""

from __future__ import annotations

import numpy as np

from elephant.optimizers.base import DistributedOptimizer
from elephant.optimizers.helpers import tree_map
from elephant.optimizers.registry import register
from elephant.optimizers.local import (MAX_SCALED_WORKERS, LocalMomentum, ScaledLocalRate, asynchrony_lag,
                                       check_sqrt_scaling)
from elephant.optimizers.outer import OuterMomentum, axpy, fusable, momentum_buffer


#: The outer momentum of a fit that commits every ``window`` steps when ``outer_momentum`` is not
#: given: none (asynchronous model averaging, the batch split among the workers). Block momentum
#: ``1 − 1/K`` over windows overshoots (docs/convergence.md, "The asynchronous default on long passes").
WINDOWED_MOMENTUM = 0.0


@register
class DelayedNesterov(ScaledLocalRate, DistributedOptimizer):
    """Asynchronous commits averaged over the workers, with outer momentum every ``K`` commits.

    Worker (as DOWNPOUR): after a window send ``Δᵏ = θᵏ − θ_pull``; adopt the center
    of the reply.

    Server, with ``K`` workers, outer rate ``α`` and momentum ``β``; ``a`` sums the
    scaled deltas since the last momentum step and ``u`` is the momentum buffer::

        d ← Δᵏ / K;   θ̃ ← θ̃ + α·d;   a ← a + d
        every K-th commit:   u ← β·u + a;   θ̃ ← θ̃ + α·β·u;   a ← 0

    Over ``K`` commits that started from the same center this is exactly one
    synchronous round of :class:`~elephant.optimizers.ModelAveraging` with the
    same outer Nesterov step, but no worker ever waits for another: the momentum
    term is only applied late. Each commit moves the center by ``1/K`` of a
    worker's progress, so, as with averaging, ``SparkModel`` splits the batch
    among the workers (``splits_batch``). With one worker and the default
    ``β = 1 − 1/K = 0`` it is sequential training.

    Mode: ``"asynchronous"`` (the server state is updated under the lock).

    The default window is one commit per partition pass: every worker then
    starts its pass from the same center, so the deltas of a virtual round share
    their start and the rule is exactly synchronous averaging with outer
    Nesterov, without the barrier. With short windows a worker's next delta
    starts from a center that lacks the other workers' latest deltas and the
    momentum term, and the outer momentum amplifies that staleness: such fits
    end far behind plain Keras at 4 or more workers, where one commit per pass
    holds (docs/convergence.md, "Defaults").

    On long passes (room for 8 windows of 32 steps: big data) ``SparkModel``
    commits every ``window`` steps instead, the window decided from the fit's
    costs (32 to 128 steps, at most 128/K with K workers, below 32 only where
    the workers' rate is scaled and never below 8; there also at most the
    window whose lag behind the center is 6 steps, ``MAX_ASYNC_LAG`` in
    ``elephant.optimizers.local``: 24 at 2 workers, 16 at 4, 13 at 8; 8 commits per
    pass or more; beyond 4 workers short passes take the same windows, which
    train better there than one commit per pass: docs/convergence.md, "Short
    passes beyond 4 workers: the round's windows"), because one outer step
    per pass is too few: a one-epoch fit would get a single one, and with block
    momentum it lands ``1 + β`` times the workers' mean progress away from the
    start. Such windowed fits run without outer momentum
    (:data:`WINDOWED_MOMENTUM`) unless ``outer_momentum`` is given: block
    momentum ``1 − 1/K`` over windows overshoots (docs/convergence.md,
    "The asynchronous default on long passes").

    Under an adaptive local optimizer (Adam, RMSprop...) with the batch split
    among 2 to 4 workers, the workers train at ``√K`` times the compiled learning rate
    (``sqrt_scaling``, :class:`~elephant.optimizers.local.ScaledLocalRate`) and the
    default has no outer momentum, per pass or windowed: asynchronous model
    averaging of workers whose mean step is about one step of the full batch.
    With windows the same holds from 5 to 64 workers when the compiled rate is
    a number, the factor ramped up from 1 over the first epoch as
    :class:`~elephant.optimizers.ModelAveraging` does; with one commit per
    pass (``frequency="epoch"``) it does not (each worker would train a whole
    pass alone at up to four times the rate, which trains worse:
    docs/convergence.md, "Beyond 4 workers: the factor ramped up over the
    first epoch") and the block momentum stays.

    Args:
        window: local steps per commit. Default None: one commit per pass.
        outer_lr: α. Default 1.0.
        outer_momentum: β in [0, 1); None (default) means ``1 − 1/K`` (BMUF's
            block momentum) with one commit per pass and
            :data:`WINDOWED_MOMENTUM` (0) with windows, and 0 when the workers'
            rate is scaled; 0 gives asynchronous model averaging.
        staleness_bound: optional SSP bound; default None (unbounded).
        sqrt_scaling: the workers train at ``√K`` times the compiled rate;
            None (default) decides it at fit start (on for an adaptive
            optimizer on a batch split among 2 to 4 workers, and with windows
            among 5 to 64 with a numeric rate, ramped), True or False forces it.
        decay_scaling: the workers' adaptive optimizer averages its running
            magnitude of the gradient over ``K`` times the steps (RMSprop's
            ``rho``, Adam's ``beta_2``: ``1 − (1 − d)/K``; RMSprop's start
            from zero then corrected by the rate, as Adam's is), as many
            samples as plain training's
            (:class:`~elephant.optimizers.local.LocalMoment`); None (default)
            wherever the workers' rate is scaled, True or False forces it.
        momentum_scaling: with windows, the workers' Adam keeps a running mean
            of the gradient younger by the lag of the asynchronous commits
            (``beta_1`` from the mean age ``b/(1 − b)`` less
            ``(K − 1)/K · window/2`` steps,
            :class:`~elephant.optimizers.local.LocalMomentum`): 0.77 for the
            compiled 0.9 at 8 workers committing every 13 steps. None (default)
            where the workers' rate is scaled beyond 4 workers (at 2 and 4 it
            did not help: docs/convergence.md, "The asynchronous workers'
            running mean of the gradient (momentum_scaling)"), True or False
            forces it.

    Reference: B. Liu et al., "Asynchronous Local-SGD Training for Language
    Modeling", arXiv:2401.09135, 2024 (Delayed Nesterov); K. Chen, Q. Huo,
    "Scalable training of deep learning machines by incremental block training
    with intra-block parallel optimization and blockwise model-update
    filtering", ICASSP 2016 (block momentum 1 − 1/K).
    """

    name = "delayednesterov"
    aliases = ("delayed_nesterov",)
    modes = ("asynchronous",)
    default_window = None
    elementwise = True
    window_from_costs = 32
    splits_batch = True

    def __init__(self, window=None, outer_lr=1.0, outer_momentum=None, staleness_bound=None, sqrt_scaling=None,
                 decay_scaling=None, momentum_scaling=None):
        super().__init__(window=window, staleness_bound=staleness_bound)
        self.outer = OuterMomentum(outer_lr, outer_momentum, nesterov=True)
        self.sqrt_scaling = check_sqrt_scaling(sqrt_scaling)
        self.decay_scaling = check_sqrt_scaling(decay_scaling, "decay_scaling")
        self.momentum_scaling = check_sqrt_scaling(momentum_scaling, "momentum_scaling")

    def setup_warning(self, window, num_workers, batch_split):
        # a fit's windowed rule has no outer momentum unless the user gave one (for_fit): then no warning
        if window is not None and window < self.window_from_costs and num_workers >= 4 and self.outer.momentum != 0:
            return (
                f"DelayedNesterov with a window of {window} steps, {num_workers} workers and outer momentum: a "
                "worker's next delta starts from a center that lacks the others' latest deltas, and the outer "
                "momentum amplifies that staleness until the fit ends far behind plain Keras. Keep the default (one "
                "commit per pass on short passes, windows without outer momentum on long ones) or pass "
                'outer_momentum=0 (see docs/convergence.md, "Defaults").'
            )
        return super().setup_warning(window, num_workers, batch_split)

    def for_fit(self, local, num_workers, batch_split, window):
        # windows (long passes, and short ones beyond 4 workers) scale the rate there too, ramped; one per pass does not
        windowed = window is not None
        return self.resolved_for_fit(local, num_workers, batch_split, WINDOWED_MOMENTUM if windowed else None,
                                     ramps=windowed)

    def local_momentum(self, local, num_workers, batch_split, window):
        # only windows lag: with one commit per pass every worker starts from the same center, as synchronously
        if self.momentum_scaling is False or window is None:  # one worker lags nothing: for_lag gives None
            return None
        ramped = int(num_workers) > MAX_SCALED_WORKERS and self.scaling_for_fit(local, num_workers, batch_split, True)
        if self.momentum_scaling is None and not ramped:  # at 2 to 4 workers it did not help: as compiled
            return None
        return LocalMomentum.for_lag(local, asynchrony_lag(window, num_workers))

    def describe(self, num_workers):
        return f"{self!r}; {self.outer.describe(num_workers)}{self.describe_scaling(num_workers)}"

    def on_learning_rate_change(self, state, ratio):
        return self.outer.rescale(state, ratio)

    def server_init(self, center, num_workers):
        workers = max(int(num_workers), 1)
        return {"workers": workers, "momentum": self.outer.resolve_momentum(workers), "count": 0,
                "buffer": [np.zeros_like(c) for c in center], "pending": [np.zeros_like(c) for c in center]}

    def apply(self, state, center, clock, worker, commit):
        alpha, beta, workers = self.outer.learning_rate, state["momentum"], state["workers"]
        count, buffer = state["count"] + 1, state["buffer"]
        if fusable(alpha, beta, center, commit.tensors, state["pending"], buffer):
            # the same numbers as the expressions below, with fewer temporaries (see outer.fusable)
            scaled = [np.divide(d, workers, out=np.empty_like(d)) for d in commit.tensors]
            center = [axpy(c, alpha, d) for c, d in zip(center, scaled)]
            pending = [np.add(a, d, out=d) for a, d in zip(state["pending"], scaled)]  # scaled is spent
            if count == workers:
                buffer = [momentum_buffer(beta, u, a) for u, a in zip(buffer, pending)]
                center = [axpy(c, alpha * beta, u) for c, u in zip(center, buffer)]
                pending, count = [np.zeros_like(a) for a in pending], 0
            return center, None, {**state, "count": count, "buffer": buffer, "pending": pending}
        scaled = tree_map(lambda d: d / workers, commit.tensors)
        center = tree_map(lambda c, d: c + alpha * d, center, scaled)
        pending = tree_map(lambda a, d: a + d, state["pending"], scaled)
        if count == workers:
            buffer = tree_map(lambda u, a: beta * u + a, buffer, pending)
            center = tree_map(lambda c, u: c + alpha * beta * u, center, buffer)
            pending, count = tree_map(np.zeros_like, pending), 0
        return center, None, {**state, "count": count, "buffer": buffer, "pending": pending}

    def get_config(self):
        return {"window": self.window, "outer_lr": self.outer.learning_rate,
                "outer_momentum": self.outer.momentum, "staleness_bound": self.staleness_bound,
                "sqrt_scaling": self.sqrt_scaling, "decay_scaling": self.decay_scaling,
                "momentum_scaling": self.momentum_scaling}
