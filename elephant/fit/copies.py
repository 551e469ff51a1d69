"""Compiled copies of the user's model on the driver, kept per replica structure from one fit to the next.

The driver trains the first epoch's head (:mod:`elephant.fit.head`) and runs the
validation passes (:mod:`elephant.fit.validation`) with Keras' compiled train and
test steps, which each new model traces (or, under JAX, compiles) again: a sweep's
trials and a notebook's freshly built models pay it in every fit. A fit whose model
may share a replica (:func:`elephant.fit.loop.replica_structure` not ``""``) takes
a copy of the model kept for its structure instead (:func:`take`), with the model's
weights and optimizer state, does both on it, and gives it back at its end
(:func:`give_back`). One fit holds a copy at a time: fits that run at once (a
sweep's threads) each take their own.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from elephant.fit.backup import built_optimizer

__all__ = ["copy_state", "give_back", "take"]

_KEPT: OrderedDict[str, Any] = OrderedDict()  # structure -> a compiled copy no running fit holds
_KEPT_SIZE = 2
_LOCK = threading.Lock()


def take(model, structure: str):
    """A compiled copy of ``model`` for ``structure`` (an idle one kept from an earlier fit, else a new one from the
    model's archive), holding ``model``'s weights and optimizer state."""
    from elephant.model_io import model_from_bytes, model_to_bytes

    with _LOCK:
        copy = _KEPT.pop(structure, None)
    if copy is None:
        copy = model_from_bytes(model_to_bytes(model))
        built_optimizer(copy)
    copy_state(model, copy)
    return copy


def give_back(structure: str, copy) -> None:
    """Keep ``copy`` for the next fit of ``structure`` (the two most recent structures are kept)."""
    with _LOCK:
        _KEPT[structure] = copy
        while len(_KEPT) > _KEPT_SIZE:
            _KEPT.popitem(last=False)


def copy_state(source, target) -> None:
    """``target`` holds ``source``'s weights and optimizer variables (two models of one structure)."""
    target.set_weights(source.get_weights())
    for variable, value in zip(built_optimizer(target).variables, built_optimizer(source).variables, strict=True):
        variable.assign(value)
