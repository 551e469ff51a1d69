"""Asynchronous averaging with a delayed outer Nesterov step (Liu et al., 2024)."""

from __future__ import annotations

import numpy as np

from elephant.optimizers.base import DistributedOptimizer, check_number, register, tree_map
from elephant.optimizers.outer import OuterMomentum


@register
class DelayedNesterov(DistributedOptimizer):
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

    Args:
        window: local steps per commit. Default 8.
        outer_lr: α. Default 1.0.
        outer_momentum: β in [0, 1); None (default) means ``1 − 1/K`` (BMUF's
            block momentum), 0 gives asynchronous model averaging.
        staleness_bound: optional SSP bound; default None (unbounded).

    Reference: B. Liu et al., "Asynchronous Local-SGD Training for Language
    Modeling", arXiv:2401.09135, 2024 (Delayed Nesterov); K. Chen, Q. Huo,
    "Scalable training of deep learning machines by incremental block training
    with intra-block parallel optimization and blockwise model-update
    filtering", ICASSP 2016 (block momentum 1 − 1/K).
    """

    name = "delayednesterov"
    aliases = ("delayed_nesterov",)
    modes = ("asynchronous",)
    default_window = 8
    splits_batch = True

    def __init__(self, window=None, outer_lr=1.0, outer_momentum=None, staleness_bound=None):
        super().__init__(window=window, staleness_bound=staleness_bound)
        self.outer = OuterMomentum(outer_lr, outer_momentum, nesterov=True)

    def describe(self, num_workers):
        return f"{self!r}; {self.outer.describe(num_workers)}"

    def server_init(self, center, num_workers):
        workers = max(int(num_workers), 1)
        return {"workers": workers, "momentum": self.outer.resolve_momentum(workers), "count": 0,
                "buffer": [np.zeros_like(c) for c in center], "pending": [np.zeros_like(c) for c in center]}

    def apply(self, state, center, clock, worker, commit):
        alpha, beta, workers = self.outer.learning_rate, state["momentum"], state["workers"]
        scaled = tree_map(lambda d: d / workers, commit.tensors)
        center = tree_map(lambda c, d: c + alpha * d, center, scaled)
        pending = tree_map(lambda a, d: a + d, state["pending"], scaled)
        count, buffer = state["count"] + 1, state["buffer"]
        if count == workers:
            buffer = tree_map(lambda u, a: beta * u + a, buffer, pending)
            center = tree_map(lambda c, u: c + alpha * beta * u, center, buffer)
            pending, count = tree_map(np.zeros_like, pending), 0
        return center, None, {**state, "count": count, "buffer": buffer, "pending": pending}

    def get_config(self):
        return {"window": self.window, "outer_lr": self.outer.learning_rate,
                "outer_momentum": self.outer.momentum, "staleness_bound": self.staleness_bound}
