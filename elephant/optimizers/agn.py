"""AGN, Accumulated Gradient Normalization (Hermans et al., ACML 2017).

dist-keras shipped this algorithm under the class name ``ADAG``; elephant keeps
``ADAG`` for the distance-scaling rule of Hermans' thesis (:mod:`.adag`) and
offers ``ADAG_DISTKERAS = AGN`` as a compatibility alias.
"""

from __future__ import annotations

import math

from elephant.optimizers.base import DistributedOptimizer
from elephant.optimizers.helpers import check_number, tree_map
from elephant.optimizers.registry import register
from elephant.optimizers.local import adapts_step_size, check_sqrt_scaling


def check_step_scale(step_scale):
    return None if step_scale is None else check_number("step_scale", step_scale, low=0.0, low_open=True)


def scaled_step(step_scale, commit, num_workers: int) -> float:
    """Factor on a normalised (average-step) commit: ``step_scale``, or ``num_steps / K`` when None."""
    return step_scale if step_scale is not None else max(int(commit.num_steps), 1) / max(int(num_workers), 1)


class SqrtScaling:
    """The square-root step scaling shared by the asynchronous averaging rules (AGN, ADAG, DynSGD).

    With the batch split ``K`` ways, each worker's adaptive optimizer (Adam,
    RMSprop...) takes steps as large as plain training's but ``√K`` times
    noisier, so the mean of the workers' steps, which cancels the noise, moves
    the center only about ``1/√K`` as far as one step of the full batch (the
    square-root scaling rule for adaptive methods, Malladi et al., NeurIPS
    2022). The rule then multiplies each delta by ``√K`` on the server. SGD's
    steps average to the full batch's exactly and get no factor.

    The argument is about steps: a window's delta is a few of them. With one
    commit per partition pass the delta is a whole pass, a displacement towards
    a minimum rather than a step, and scaling it overshoots: DynSGD with
    ``frequency="epoch"`` trained worse with the factor than without, while AGN
    with windows of steps trained better with it (docs/convergence.md, "Named
    rules at their default window").

    ``sqrt_scaling=None`` (the default) is decided by :meth:`for_fit`: on when
    the batch is split among more than one worker, the model's optimizer adapts
    its step size and the fit commits every ``window`` steps (not once per
    pass); outside a fit (``simulate``) it counts as off.
    """

    sqrt_scaling: bool | None = None

    def for_fit(self, local, num_workers, batch_split, window):
        if self.sqrt_scaling is not None:
            return self
        on = bool(batch_split) and int(num_workers) > 1 and window is not None and adapts_step_size(local)
        return type(self).from_config({**self.get_config(), "sqrt_scaling": on})

    def gain(self, num_workers: int) -> float:
        """``√K`` when square-root scaling is on, else 1."""
        return math.sqrt(max(int(num_workers), 1)) if self.sqrt_scaling else 1.0

    def describe(self, num_workers):
        workers = max(int(num_workers), 1)
        if self.sqrt_scaling and workers > 1:
            return (f"{self!r}; each delta scaled by sqrt({workers}) = {self.gain(workers):.3g} for the adaptive "
                    "optimizer's steps on the split batch (sqrt_scaling=False turns it off)")
        return repr(self)


class NormalizedDeltas(SqrtScaling):
    """The side AGN and ADAG share: the worker sends its window's delta per local step, ``(θ − θ_pull) / m``,
    and the server keeps ``K`` and the square-root gain; ``step_scale=None`` (``m / K``) splits the batch."""

    step_scale: float | None = None

    @property
    def splits_batch(self) -> bool:  # type: ignore[override]
        return self.step_scale is None

    def make_commit(self, state, weights, pulled, num_steps):
        steps = max(int(num_steps), 1)
        return tree_map(lambda w, p: (w - p) / steps, weights, pulled), state

    def server_init(self, center, num_workers):
        workers = max(int(num_workers), 1)
        return {"workers": workers, "gain": self.gain(workers)}


@register
class AGN(NormalizedDeltas, DistributedOptimizer):
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
    take plain training's number of steps. When the model's optimizer is
    adaptive (Adam, RMSprop...), the default also multiplies the step by
    ``√K`` (``sqrt_scaling``, see :class:`SqrtScaling`). With ``window=1`` and
    ``s = 1`` AGN is DOWNPOUR. dist-keras called this algorithm "ADAG".

    Modes: ``"asynchronous"`` and ``"hogwild"``.

    Args:
        window: local steps per commit (``λ``). Default 12 (dist-keras' trainer
            default; Hermans recommends 10–15 on MNIST).
        step_scale: ``s`` > 0, or None (default) for ``m / K``. ``step_scale=1``
            (with ``SparkModel(batch_split=False)``) is the paper's rule.
        staleness_bound: optional SSP bound; default None (unbounded).
        sqrt_scaling: multiply the step by ``√K``. None (default): at the start
            of a fit, on when the batch is split and the model's optimizer
            adapts its step size; True or False forces it.

    Reference: J. Hermans, G. Spanakis, R. Möckel, "Accumulated Gradient
    Normalization", ACML 2017 (PMLR 77), arXiv:1710.02368.
    """

    name = "agn"
    aliases = ("adag_distkeras",)
    modes = ("asynchronous", "hogwild")
    default_window = 12
    elementwise = True
    averaging_shortfall = "most on an MLP trained with Adam"

    def __init__(self, window=None, step_scale=None, staleness_bound=None, sqrt_scaling=None):
        super().__init__(window=window, staleness_bound=staleness_bound)
        self.step_scale = check_step_scale(step_scale)
        self.sqrt_scaling = check_sqrt_scaling(sqrt_scaling)

    def apply(self, state, center, clock, worker, commit):
        scale = state["gain"] * scaled_step(self.step_scale, commit, state["workers"])
        return tree_map(lambda c, d: c + scale * d, center, commit.tensors), None, state

    def get_config(self):
        return {**super().get_config(), "step_scale": self.step_scale, "sqrt_scaling": self.sqrt_scaling}


#: dist-keras' name for :class:`AGN` (its ``ADAG`` trainer). Not the thesis' ADAG.
ADAG_DISTKERAS = AGN
