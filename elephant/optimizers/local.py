"""What a rule may read of the user's compiled Keras optimizer: duck-typed, so nothing imports Keras.

A rule's ``for_fit`` adapts itself to the local optimizer the workers train
with (AGN scales by the square root of the workers for an adaptive one; DC-ASGD
and the EASGD family read its learning rate). These helpers read what they
need from the object's class names and attributes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ADAPTIVE_OPTIMIZERS", "adapts_step_size", "local_setting"]


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
