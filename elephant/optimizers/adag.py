"""ADAG, Asynchronous Distributed Adaptive Gradients (Hermans' thesis, ch. 4).

Not dist-keras' ``ADAG`` class, which is :class:`~elephant.optimizers.AGN`;
this is dist-keras' ``Experimental`` trainer.
"""

from __future__ import annotations

import numpy as np

from elephant.optimizers.agn import NormalizedDeltas, check_sqrt_scaling, check_step_scale, scaled_step
from elephant.optimizers.base import DistributedOptimizer
from elephant.optimizers.helpers import check_number, tree_map
from elephant.optimizers.registry import register


def distance_factor(distance, gamma: float):
    """Element-wise ADAG scaling ``1 / (d² / γ + 1)`` of a center that moved by ``d``.

    ``d = 0`` gives 1 (a fresh delta is applied whole); the factor falls towards 0
    as the center moves away from where the worker started.
    """
    distance = np.asarray(distance)
    return 1 / (distance * distance / gamma + 1)


@register
class ADAG(NormalizedDeltas, DistributedOptimizer):
    """AGN whose deltas are scaled down, per weight, by how far the center moved.

    Worker (as :class:`~elephant.optimizers.AGN`): send ``Δ = (θ − θ_pull) / m``
    after ``m = num_steps`` local steps; adopt the center of the reply.

    Server: remembers ``θ̃_pull[k]``, the center worker ``k`` last received (on
    its pull and on every commit reply), and applies one commit as

        θ̃ ← θ̃ + s · Δᵏ ⊙ 1 / ((θ̃ − θ̃_pull[k])² / γ + 1)

    with AGN's step ``s`` (default ``m / K``; ``step_scale=1`` is the thesis' rule).

    (square, division and product element-wise). A weight the other workers did
    not move since worker ``k`` pulled gets its delta unscaled, so with one
    worker ADAG is exactly AGN. The factor is computed from the same center the
    delta is added to, inside the server's critical section. A worker with no
    recorded pull (e.g. after a server restart) is treated as fresh.

    Server state: one model copy per worker (``{worker: θ̃_pull[k]}``), hence
    asynchronous mode only (hogwild would race on that state).

    Args:
        window: local steps per commit. Default 12 (as AGN; the thesis ran 20).
        gamma: distance scale ``γ > 0``. Default 1e-4, the thesis' practical
            value; lower it if training still diverges, raise it (towards AGN)
            if progress stalls. dist-keras' ``Experimental(learning_rate=...)``
            is this γ (its default there, 1.0, barely scales anything).
        staleness_bound: optional SSP bound; default None (unbounded).
        step_scale: as :class:`~elephant.optimizers.AGN`'s; None (default) is
            ``m / K`` with a batch split, 1 the thesis' rule.
        sqrt_scaling: as :class:`~elephant.optimizers.AGN`'s (``√K`` on the
            step for an adaptive local optimizer with the batch split).

    Raises:
        ConfigError: ``gamma`` or ``step_scale`` is not a positive finite number.

    Reference: J. Hermans, "On Scalable Deep Learning and Parallelizing Gradient
    Descent", MSc thesis, Maastricht University, 2017, chapter 4 (ADAG).
    """

    name = "adag"
    modes = ("asynchronous",)
    default_window = 12
    elementwise = True
    averaging_shortfall = "most on an MLP trained with Adam"

    def __init__(self, window: int | None = None, gamma: float = 1e-4, staleness_bound: int | None = None,
                 step_scale: float | None = None, sqrt_scaling: bool | None = None):
        super().__init__(window=window, staleness_bound=staleness_bound)
        self.gamma = check_number("gamma", gamma, low=0.0, low_open=True)
        self.step_scale = check_step_scale(step_scale)
        self.sqrt_scaling = check_sqrt_scaling(sqrt_scaling)

    def on_pull(self, state, center, clock, worker):
        return {**state, worker: tree_map(np.copy, center)}

    def apply(self, state, center, clock, worker, commit):
        stale = state.get(worker, center)
        scale = state.get("gain", 1.0) * scaled_step(self.step_scale, commit, state.get("workers", 1))
        new_center = tree_map(
            lambda c, d, s: c + scale * d * distance_factor(c - s, self.gamma), center, commit.tensors, stale
        )
        return new_center, None, {**state, worker: tree_map(np.copy, new_center)}

    def get_config(self):
        return {**super().get_config(), "gamma": self.gamma, "step_scale": self.step_scale,
                "sqrt_scaling": self.sqrt_scaling}
