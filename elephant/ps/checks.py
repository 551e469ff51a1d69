"""A store's checks of what crosses it: its arguments, request integers, a commit, a server rule's result (no HTTP).

Pure functions for :class:`~elephant.ps.store.Store`: none takes a lock or
counts. A commit is checked against the structure of the store's commits (the
rule's ``commit_template``) before the store's lock is taken; a server rule's
new center against the center's structure, which never changes. The center
arrays the store hands out are read-only (:func:`freeze`), so replies share
them without copying.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from elephant.errors import ConfigError, ElephantError, PSError, ProtocolError
from elephant.optimizers.base import DistributedOptimizer
from elephant.optimizers.compress import check_reply_mode
from elephant.protocol import MODES, Commit, CommitKey
from elephant.ps.layout import all_finite

__all__ = ["check_base_clock", "check_commit", "check_partition", "check_ratio", "check_store_args", "commit_what",
           "freeze", "int_arg", "run_rule"]


def check_store_args(optimizer: DistributedOptimizer, mode: str, num_workers: int, run: str,
                     round_timeout: float) -> None:
    """Raise :class:`ConfigError` unless a :class:`~elephant.ps.store.Store`'s arguments are valid."""
    if mode not in MODES:
        raise ConfigError(f"`mode` must be one of {MODES}; received mode={mode!r}")
    if mode not in optimizer.modes:
        raise ConfigError(f"{type(optimizer).__name__} supports modes {optimizer.modes}; received mode={mode!r}")
    check_reply_mode(optimizer, mode)
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ConfigError(f"`num_workers` must be a positive int; received num_workers={num_workers!r}")
    if not isinstance(run, str) or not run:
        raise ConfigError(f"`run` must be a non-empty str; received run={run!r}")
    if not (isinstance(round_timeout, (int, float)) and round_timeout > 0):
        raise ConfigError(f"`round_timeout` must be > 0 seconds; received round_timeout={round_timeout!r}")


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


def check_ratio(ratio: Any) -> None:
    """Raise :class:`ProtocolError` unless a learning-rate ``ratio`` is a finite number >= 0."""
    if not (isinstance(ratio, (int, float)) and math.isfinite(ratio) and ratio >= 0):
        raise ProtocolError(f"a learning-rate ratio must be a finite number >= 0; received {ratio!r}")


def check_base_clock(commit: Commit, clock: int, what: str) -> None:
    """Raise :class:`ProtocolError` if ``commit`` was trained from a clock ahead of the server's ``clock``."""
    if commit.base_clock > clock:
        raise ProtocolError(f"{what}: base_clock {commit.base_clock} is ahead of the server clock {clock}")


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
