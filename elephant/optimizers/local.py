"""What a rule may read of the user's compiled Keras optimizer: duck-typed, so nothing imports Keras.

A rule's ``for_fit`` adapts itself to the local optimizer the workers train
with (AGN scales by the square root of the workers for an adaptive one; DC-ASGD
and the EASGD family read its learning rate). These helpers read what they
need from the object's class names and attributes.
"""

from __future__ import annotations

import math
from typing import Any

from elephant.errors import ConfigError

__all__ = ["ADAPTIVE_OPTIMIZERS", "ScaledLocalRate", "adapts_step_size", "check_sqrt_scaling", "local_setting"]


#: Keras optimizers that divide each step by a running magnitude of the gradient (or
#: take its sign), so that a smaller batch gives noisier steps but not smaller ones.
ADAPTIVE_OPTIMIZERS = frozenset(
    {"Adam", "AdamW", "Adamax", "Nadam", "RMSprop", "Adagrad", "Adadelta", "Adafactor", "Ftrl", "Lion", "Lamb"}
)


def adapts_step_size(local: Any) -> bool:
    """Whether a Keras optimizer normalises its steps (Adam, RMSprop, Adagrad, ...; not SGD).

    Duck-typed on the class names of ``type(local).__mro__`` (a subclass of
    ``Adam`` counts), looking through a ``LossScaleOptimizer``; an unknown
    optimizer counts as not adaptive.
    """
    local = getattr(local, "inner_optimizer", None) or local
    return any(cls.__name__ in ADAPTIVE_OPTIMIZERS for cls in type(local).__mro__)


def local_setting(local: Any, name: str) -> Any:
    """A Keras optimizer's hyperparameter as a Python value (float32 variables read as 6-digit floats)."""
    value = getattr(local, name, None)
    try:
        return float(f"{float(value):.6g}")
    except (TypeError, ValueError):
        return value


def check_sqrt_scaling(sqrt_scaling):
    if sqrt_scaling is not None and not isinstance(sqrt_scaling, bool):
        raise ConfigError(f"`sqrt_scaling` must be True, False or None; received sqrt_scaling={sqrt_scaling!r}")
    return sqrt_scaling


#: The most workers at which ``sqrt_scaling=None`` scales the workers' rate (``√K`` at most 2):
#: beyond, a compiled rate ten times Keras' default trained at ``√K`` times it was measured far
#: behind plain Keras (docs/convergence.md), and the defaults keep their outer step instead.
MAX_SCALED_WORKERS = 4


class ScaledLocalRate:
    """The square-root learning-rate scaling of the averaging defaults (ModelAveraging, DelayedNesterov).

    With the batch split ``K`` ways, each worker's adaptive optimizer (Adam,
    RMSprop...) divides its steps by a running magnitude of gradients that are
    ``√K`` times noisier than plain training's, so the signal in each step is
    about ``1/√K`` of plain training's, and the mean of the workers' progress,
    which cancels their noise, keeps that shortfall. The workers therefore
    train at ``√K`` times the compiled learning rate: the mean of their steps is
    then about one step of the full batch, signal and noise. SGD's steps average
    to the full batch's exactly and are left alone. Scaling the rate on the
    workers, rather than the mean delta on the server (AGN's ``sqrt_scaling``),
    lets each worker's own optimizer state follow its larger steps; it replaces
    the outer momentum, which the default then turns off. The user's model keeps
    its compiled rate (only the replicas train at the scaled one).

    ``sqrt_scaling=None`` (the default) is decided by ``for_fit``: on when the
    batch is split among 2 to :data:`MAX_SCALED_WORKERS` workers and the model's
    optimizer adapts its step size. True scales whenever there are several
    workers; False never.
    """

    sqrt_scaling: bool | None = None

    def scaling_for_fit(self, local: Any, num_workers: int, batch_split: bool) -> bool:
        """Whether this rule's workers train at a scaled rate in a fit with these settings."""
        if self.sqrt_scaling is not None:
            return self.sqrt_scaling
        return bool(batch_split) and 1 < int(num_workers) <= MAX_SCALED_WORKERS and adapts_step_size(local)

    def local_rate_scale(self, local: Any, num_workers: int, batch_split: bool) -> float:
        """``√K`` when the workers train at a scaled rate, else 1."""
        workers = max(int(num_workers), 1)
        return math.sqrt(workers) if self.scaling_for_fit(local, workers, batch_split) and workers > 1 else 1.0

    def resolved_for_fit(self, local: Any, num_workers: int, batch_split: bool, unscaled_momentum: float | None):
        """This rule with ``sqrt_scaling`` decided and, when the user gave none, the outer momentum: 0 when
        the workers' rate is scaled (no gain on top of it), else ``unscaled_momentum``; ``self`` if nothing changes."""
        scaled = self.scaling_for_fit(local, num_workers, batch_split)
        momentum = self.outer.momentum
        if momentum is None and int(num_workers) >= 2:
            momentum = 0.0 if scaled else unscaled_momentum
        if momentum == self.outer.momentum and scaled == bool(self.sqrt_scaling):
            return self
        return type(self).from_config({**self.get_config(), "sqrt_scaling": scaled, "outer_momentum": momentum})

    def describe_scaling(self, num_workers: int) -> str:
        """The fit-start log's words for the scaling ("" when off)."""
        workers = max(int(num_workers), 1)
        if not self.sqrt_scaling or workers < 2:
            return ""
        return (f"; the workers train at sqrt({workers}) = {math.sqrt(workers):.3g} times the compiled learning rate "
                "for the adaptive optimizer's steps on the split batch (sqrt_scaling=False turns it off)")
