"""A store's state taken out of it: a snapshot to roll back to, an outcome another store goes on from (no HTTP).

:meth:`~elephant.ps.store.Store.snapshot` takes a :class:`Snapshot` between
epochs and :meth:`~elephant.ps.store.Store.rollback` returns to it;
:meth:`~elephant.ps.store.Store.outcome` hands over an :class:`Outcome` that
:meth:`~elephant.ps.store.Store.absorb` goes on from. The center arrays in
both are the store's read-only ones, shared, not copied.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Outcome", "Snapshot"]


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What :meth:`Store.rollback <elephant.ps.store.Store.rollback>` returns to: the store between two epochs."""

    center: list
    state: Any
    clock: int
    ledger_size: int
    epochs: frozenset
    latest_epoch: int | None


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a store served since it was made: handed from a store hosted elsewhere to
    :meth:`Store.absorb <elephant.ps.store.Store.absorb>`.

    A fit from a Spark Connect client serves each epoch from a store inside a
    Spark task (:mod:`elephant.fit.connect`); the client's own store takes the
    epoch's result from it.
    """

    center: list
    state: Any
    clock: int
    ledger: list
    counts: dict
    staleness: dict
