"""Synchronous model averaging / Local SGD (Stich 2019)."""

from __future__ import annotations

from elephant import weights as W
from elephant.optimizers.base import DistributedOptimizer, register


@register
class ModelAveraging(DistributedOptimizer):
    """Synchronous rounds: the center moves by the sample-weighted mean delta.

    Worker: after ``window`` local steps (the period ``H``), send
    ``Δᵏ = θᵏ - θ̃``; wait for the round; adopt the new center.
    Server, one round over the workers that trained: ``θ̃ ← θ̃ + Σₖ wₖ Δᵏ`` with
    ``wₖ = samplesₖ / Σ samples``. A worker that trained nothing contributes
    nothing (it does not dilute the mean). Since every worker of a round
    started from the same center this equals the weighted mean of the weights.

    Args:
        window: local steps per round (``H``). Default 8.

    Reference: S. U. Stich, "Local SGD Converges Fast and Communicates Little", ICLR 2019.
    """

    name = "modelaveraging"
    modes = ("synchronous",)
    default_window = 8

    def apply_round(self, state, center, clock, commits):
        trained = {k: c for k, c in commits.items() if c.num_samples > 0}
        if not trained:
            return center, {k: None for k in commits}, state
        mean_delta = W.weighted_mean(
            [c.tensors for c in trained.values()], [c.num_samples for c in trained.values()]
        )
        return W.add(center, mean_delta), {k: None for k in commits}, state
