"""A store's norm guard: refuse a commit whose norm is far beyond the run's recent ones (no HTTP).

With ``norm_guard=k`` a :class:`~elephant.ps.store.Store` refuses, with
:class:`~elephant.errors.NormGuardError`, a commit whose L2 norm exceeds ``k``
times the median of the last :data:`NORM_WINDOW` accepted ones, once
:data:`NORM_WARMUP` were accepted; nothing of a refused commit is applied. The
store computes the norm before it takes its lock (:meth:`NormGuard.norm`) and
judges it with the lock held (:meth:`NormGuard.check`).
"""

from __future__ import annotations

import collections
import logging
import math
from typing import Any

import numpy as np

from elephant.errors import ConfigError, NormGuardError
from elephant.protocol import Commit
from elephant.ps.metrics import Metrics

logger = logging.getLogger("elephant.ps.store")  # the store's logger, as before the guard had a module of its own

__all__ = ["NORM_WARMUP", "NORM_WINDOW", "NormGuard"]

#: Commits whose norms the guard remembers, and how many it needs before it judges.
NORM_WINDOW, NORM_WARMUP = 64, 16


def _squared_norm(t: Any) -> float:
    """``‖t‖²``; integer tensors (an encoded commit's codes) in float64, where their own dtype would overflow."""
    t = np.asarray(t)
    if t.dtype.kind in "iub":
        t = t.astype(np.float64)
    return float(np.vdot(t, t).real)


class NormGuard:
    """The norm guard of one store; :meth:`check` runs with the store's lock held.

    Args:
        factor: ``norm_guard``: a number > 1, or None (off: every commit passes).
        metrics: the store's counters (a refusal counts ``commits_norm_refused``).

    Raises:
        ConfigError: ``factor`` is neither None nor a finite number > 1.
    """

    def __init__(self, factor: float | None, metrics: Metrics):
        if factor is not None and not (isinstance(factor, (int, float)) and not isinstance(factor, bool)
                                       and math.isfinite(factor) and factor > 1):
            raise ConfigError(f"`norm_guard` must be a number > 1 or None; received norm_guard={factor!r}")
        self._factor = None if factor is None else float(factor)
        self._norms: collections.deque[float] = collections.deque(maxlen=NORM_WINDOW)
        self._metrics = metrics

    def norm(self, commit: Commit) -> float | None:
        """The commit's L2 norm when the guard is on (computed before the lock is taken)."""
        if self._factor is None:
            return None
        return math.sqrt(sum(_squared_norm(t) for t in commit.tensors))

    def check(self, norm: float | None, what: str) -> None:
        """Refuse a norm far beyond the recent ones (lock held); remember an accepted one."""
        if norm is None:
            return
        if len(self._norms) >= NORM_WARMUP:
            typical = float(np.median(self._norms))
            if norm > self._factor * typical:
                self._metrics.count("commits_norm_refused")
                logger.warning("%s refused: norm %.3g is over %g x the recent median %.3g", what, norm,
                               self._factor, typical)
                raise NormGuardError(f"{what}: its norm {norm:.3g} is over norm_guard={self._factor:g} times "
                                     f"the median {typical:.3g} of the last {len(self._norms)} commits; not applied")
        self._norms.append(norm)
