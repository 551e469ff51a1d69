"""DOWNPOUR (Dean et al., NIPS 2012) in delta mode."""

from __future__ import annotations

from elephant import weights as W
from elephant.optimizers.base import DistributedOptimizer, register


@register
class Downpour(DistributedOptimizer):
    """Asynchronous SGD that adds each worker's accumulated delta to the center.

    Worker: after ``window`` local steps from the pulled center ``θ_pull`` to
    ``θ``, send ``Δ = θ - θ_pull``; adopt the returned center.
    Server: ``θ̃ ← θ̃ + Δ`` (no staleness correction).

    Args:
        window: local steps per commit. Default 5 (dist-keras' trainer default).
        staleness_bound: optional SSP bound; default None (unbounded).

    Reference: J. Dean et al., "Large Scale Distributed Deep Networks", NIPS 2012.
    """

    name = "downpour"
    modes = ("asynchronous", "hogwild")
    default_window = 5

    def apply(self, state, center, clock, worker, commit):
        return W.add(center, commit.tensors), None, state
