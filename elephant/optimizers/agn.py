"""AGN, Accumulated Gradient Normalization (Hermans et al., ACML 2017).

dist-keras shipped this algorithm under the class name ``ADAG``; elephant keeps
``ADAG`` for the distance-scaling rule of Hermans' thesis (:mod:`.adag`) and
offers ``ADAG_DISTKERAS = AGN`` as a compatibility alias.
"""

from __future__ import annotations

from elephant.optimizers.base import DistributedOptimizer, register, tree_map


@register
class AGN(DistributedOptimizer):
    """Asynchronous delta exchange with the delta normalised by the window length.

    Worker: after ``m = num_steps`` local steps from ``θ_pull`` to ``θ``, send
    ``Δ = (θ − θ_pull) / m`` — the *average* local step; adopt the center of the
    reply. A flushed partial window is divided by its true ``m``.

    Server (one commit): ``θ̃ ← θ̃ + Δ`` (no staleness correction).

    Because every commit is one average step, the window can be made much
    larger than DOWNPOUR's without the center jumping. With ``window=1`` AGN is
    DOWNPOUR; with one worker and ``window > 1`` it is deliberately slower than
    sequential training. dist-keras called this algorithm "ADAG".

    Modes: ``"asynchronous"`` and ``"hogwild"``.

    Args:
        window: local steps per commit (``λ``). Default 12 (dist-keras' trainer
            default; Hermans recommends 10–15 on MNIST).
        staleness_bound: optional SSP bound; default None (unbounded).

    Reference: J. Hermans, G. Spanakis, R. Möckel, "Accumulated Gradient
    Normalization", ACML 2017 (PMLR 77), arXiv:1710.02368.
    """

    name = "agn"
    aliases = ("adag_distkeras",)
    modes = ("asynchronous", "hogwild")
    default_window = 12

    def make_commit(self, state, weights, pulled, num_steps):
        steps = max(int(num_steps), 1)
        return tree_map(lambda w, p: (w - p) / steps, weights, pulled), state

    def apply(self, state, center, clock, worker, commit):
        return tree_map(lambda c, d: c + d, center, commit.tensors), None, state


#: dist-keras' name for :class:`AGN` (its ``ADAG`` trainer). Not the thesis' ADAG.
ADAG_DISTKERAS = AGN
