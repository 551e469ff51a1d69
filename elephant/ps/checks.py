"""A store's checks of what crosses it: request integers, a commit's structure, a server rule's result (no HTTP).

Pure functions for :class:`~elephant.ps.store.Store`: none takes a lock or
counts. A commit is checked against the structure of the store's commits (the
rule's ``commit_template``) before the store's lock is taken; a server rule's
new center against the center's structure, which never changes. The center
arrays the store hands out are read-only (:func:`freeze`), so replies share
them without copying.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from elephant.errors import ElephantError, PSError, ProtocolError
from elephant.optimizers.base import DistributedOptimizer
from elephant.protocol import Commit, CommitKey
from elephant.ps.layout import all_finite

__all__ = ["check_commit", "check_partition", "commit_what", "freeze", "int_arg", "run_rule"]


def freeze(arrays: Sequence[Any]) -> list[np.ndarray]:
    """``arrays`` as read-only numpy arrays (not copied)."""
    out = [np.asarray(a) for a in arrays]
    for a in out:
        a.setflags(write=False)
    return out


def int_arg(name: str, value: Any) -> int:
    """``value`` as an int; raises :class:`ProtocolError` unless it is an int >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ProtocolError(f"`{name}` must be an int >= 0; received {name}={value!r}")
    return int(value)


def check_partition(partition: int, num_workers: int) -> None:
    """Raise :class:`ProtocolError` unless ``0 <= partition < num_workers``."""
    if not 0 <= partition < num_workers:
        raise ProtocolError(f"partition {partition} is out of range for num_workers={num_workers}")


def commit_what(key: CommitKey, attempt: int) -> str:
    """How the store's errors name a commit; raises :class:`ProtocolError` unless its key's ints are ints >= 0."""
    ints = [int_arg(n, v) for n, v in zip(("epoch", "partition", "step", "attempt"), (*key[1:], attempt))]
    return f"commit (run {key.run}, epoch {ints[0]}, partition {ints[1]}, step {ints[2]}, attempt {attempt})"


def check_commit(partition: int, commit: Commit, num_workers: int, template: Sequence[np.ndarray],
                 check_finite: bool) -> None:
    """Raise :class:`ProtocolError` if the partition, the counts or the tensors of ``commit`` are wrong.

    Args:
        partition: the commit's partition.
        commit: the commit.
        num_workers: the store's number of partitions.
        template: arrays with the shapes and dtypes of a commit's tensors.
        check_finite: whether NaN and inf are refused too.
    """
    check_partition(partition, num_workers)
    for name in ("num_steps", "num_samples", "base_clock"):
        int_arg(name, getattr(commit, name))
    if len(commit.tensors) != len(template):
        raise ProtocolError(f"expected {len(template)} tensors, received {len(commit.tensors)}")
    for i, (c, t) in enumerate(zip(template, commit.tensors)):
        if getattr(t, "shape", None) != c.shape or getattr(t, "dtype", None) != c.dtype:
            got = f"{getattr(t, 'dtype', type(t).__name__)}{list(getattr(t, 'shape', ()))}"
            raise ProtocolError(f"tensor {i}: expected {c.dtype}{list(c.shape)}, received {got}")
        if check_finite and not all_finite(t):
            raise ProtocolError(f"tensor {i} holds non-finite values (NaN or inf)")


def run_rule(what: str, optimizer: DistributedOptimizer, center: Sequence[np.ndarray],
             call: Callable[[], tuple]) -> tuple:
    """Run a server rule; wrap its failure and check the new center against ``center``'s structure.

    Returns:
        ``(new center, replies, state)``, the new center read-only.

    Raises:
        PSError: the rule failed (an :class:`~elephant.errors.ElephantError` it raised goes through as it is),
            or returned tensors unlike the center.
    """
    name = type(optimizer).__name__
    try:
        new_center, replies, state = call()
    except ElephantError:
        raise
    except Exception as exc:
        raise PSError(f"{what}: the server rule of {name} failed: {exc!r}") from exc
    if len(new_center) != len(center):
        raise PSError(f"{what}: {name}'s server rule returned {len(new_center)} tensors, expected {len(center)}")
    for i, (c, t) in enumerate(zip(center, new_center)):
        if np.shape(t) != c.shape or np.asarray(t).dtype != c.dtype:
            raise PSError(f"{what}: {name}'s server rule returned {np.asarray(t).dtype}{list(np.shape(t))} "
                          f"for tensor {i}, expected {c.dtype}{list(c.shape)}")
    return freeze(new_center), replies, state
