"""AGN, Accumulated Gradient Normalization (Hermans et al., ACML 2017).

dist-keras shipped this algorithm under the class name ``ADAG``; elephant keeps
``ADAG`` for the distance-scaling rule of Hermans' thesis (:mod:`.adag`) and
offers ``ADAG_DISTKERAS = AGN`` as a compatibility alias.
"""

from __future__ import annotations

from elephant.optimizers.base import DistributedOptimizer, check_number, register, tree_map


def check_step_scale(step_scale):
    return None if step_scale is None else check_number("step_scale", step_scale, low=0.0, low_open=True)


def scaled_step(step_scale, commit, num_workers: int) -> float:
    """Factor on a normalised (average-step) commit: ``step_scale``, or ``num_steps / K`` when None."""
    return step_scale if step_scale is not None else max(int(commit.num_steps), 1) / max(int(num_workers), 1)


@register
class AGN(DistributedOptimizer):
    """Asynchronous delta exchange with the delta normalised by the window length.

    Worker: after ``m = num_steps`` local steps from ``θ_pull`` to ``θ``, send
    ``Δ = (θ − θ_pull) / m`` — the *average* local step; adopt the center of the
    reply. A flushed partial window is divided by its true ``m``.

    Server (one commit): ``θ̃ ← θ̃ + s·Δ`` (no staleness correction).

    The paper's step is ``s = 1`` (``step_scale=1``): every commit is one
    average step, so the window can be made much larger than DOWNPOUR's without
    the center jumping, but the center advances only ``1/window`` of what the
    workers did, and at equal epochs it falls far behind plain training
    (chance-level accuracy with ``frequency="epoch"``). The default step,
    ``s = m / K`` for a commit of ``m`` steps and ``K`` workers, moves the
    center by the mean of the workers' progress, as averaging does; the rule
    then splits the batch among the workers (``splits_batch``) so that they
    take plain training's number of steps. With ``window=1`` and ``s = 1`` AGN
    is DOWNPOUR. dist-keras called this algorithm "ADAG".

    Modes: ``"asynchronous"`` and ``"hogwild"``.

    Args:
        window: local steps per commit (``λ``). Default 12 (dist-keras' trainer
            default; Hermans recommends 10–15 on MNIST).
        step_scale: ``s`` > 0, or None (default) for ``m / K``. ``step_scale=1``
            (with ``SparkModel(batch_split=False)``) is the paper's rule.
        staleness_bound: optional SSP bound; default None (unbounded).

    Reference: J. Hermans, G. Spanakis, R. Möckel, "Accumulated Gradient
    Normalization", ACML 2017 (PMLR 77), arXiv:1710.02368.
    """

    name = "agn"
    aliases = ("adag_distkeras",)
    modes = ("asynchronous", "hogwild")
    default_window = 12
    averaging_shortfall = "up to 10 points behind, 12 % higher loss on a regression"

    def __init__(self, window=None, step_scale=None, staleness_bound=None):
        super().__init__(window=window, staleness_bound=staleness_bound)
        self.step_scale = check_step_scale(step_scale)

    @property
    def splits_batch(self) -> bool:  # type: ignore[override]
        return self.step_scale is None

    def make_commit(self, state, weights, pulled, num_steps):
        steps = max(int(num_steps), 1)
        return tree_map(lambda w, p: (w - p) / steps, weights, pulled), state

    def server_init(self, center, num_workers):
        return max(int(num_workers), 1)

    def apply(self, state, center, clock, worker, commit):
        scale = scaled_step(self.step_scale, commit, state or 1)
        return tree_map(lambda c, d: c + scale * d, center, commit.tensors), None, state

    def get_config(self):
        return {**super().get_config(), "step_scale": self.step_scale}


#: dist-keras' name for :class:`AGN` (its ``ADAG`` trainer). Not the thesis' ADAG.
ADAG_DISTKERAS = AGN
