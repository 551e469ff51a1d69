"""Outer optimizers: a server-side momentum step on a round's pseudo-gradient.

After a synchronous round (or, asynchronously, after a commit) the rule has a
*mean delta* ``d`` -- the direction the workers moved the center, which is
minus the pseudo-gradient ``Δ`` of DiLoCo and SlowMo. Plain averaging applies
``θ ← θ + d``. An outer momentum step keeps a buffer ``u`` on the server::

    u ← β·u + d
    θ ← θ + α·(d + β·u)      (Nesterov, the default)
    θ ← θ + α·u              (heavy ball, ``nesterov=False``)

With ``α = 1, β = 0`` both are plain averaging. In steady state the center
moves about ``α / (1 − β)`` times ``d`` per round. This is the rule of DiLoCo
(Douillard et al., 2023: Nesterov, α 0.7, β 0.9) and SlowMo (Wang et al., ICLR
2020); BMUF (Chen & Huo, 2016) is the heavy-ball form with β = 1 − 1/K.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from elephant.errors import ConfigError
from elephant.optimizers.helpers import Weights, check_number, tree_map

__all__ = ["OuterMomentum"]


class OuterMomentum:
    """The server's momentum step over mean deltas (see the module docstring).

    Args:
        learning_rate: α > 0.
        momentum: β in [0, 1), or None for ``1 − 1/K`` with ``K`` workers
            (BMUF's block momentum: plain averaging with one worker), or
            ``1 − 1/min(K, max_gain)`` when ``max_gain`` is set.
        nesterov: Nesterov (default) or heavy-ball momentum.
        max_gain: the most workers' worth of progress the default β makes of a
            mean delta in steady state (None, default: ``K``, no cap).
    """

    def __init__(self, learning_rate: float, momentum: float | None, nesterov: bool = True,
                 max_gain: int | None = None):
        self.learning_rate = check_number("outer_lr", learning_rate, low=0.0, low_open=True)
        self.momentum = None if momentum is None else check_number(
            "outer_momentum", momentum, low=0.0, high=1.0, high_open=True)
        if not isinstance(nesterov, bool):
            raise ConfigError(f"`nesterov` must be True or False; received nesterov={nesterov!r}")
        self.nesterov = nesterov
        self.max_gain = max_gain

    def resolve_momentum(self, num_workers: int) -> float:
        """β for a fit with ``num_workers`` workers."""
        if self.momentum is not None:
            return self.momentum
        gain = max(int(num_workers), 1)
        return 1.0 - 1.0 / (gain if self.max_gain is None else min(gain, self.max_gain))

    def describe(self, num_workers: int) -> str:
        beta = self.resolve_momentum(num_workers)
        if self.learning_rate == 1.0 and beta == 0.0:
            return "plain averaging (no outer step)"
        kind = "Nesterov" if self.nesterov else "heavy-ball"
        gain = num_workers if self.max_gain is None else min(num_workers, self.max_gain)
        auto = f" = 1 - 1/{gain}" if self.momentum is None else ""
        return (f"outer {kind} step on the mean delta: outer_lr={self.learning_rate:g}, outer_momentum={beta:g}{auto} "
                "(outer_momentum=0 turns it off)")

    def init(self, center: Weights, num_workers: int) -> Any:
        """Server state: ``None`` for plain averaging, else ``{"momentum": β, "buffer": u}``."""
        beta = self.resolve_momentum(num_workers)
        if self.learning_rate == 1.0 and beta == 0.0:
            return None
        return {"momentum": beta, "buffer": [np.zeros_like(c) for c in center]}

    def rescale(self, state: Any, ratio: float) -> Any:
        """State with the momentum buffer multiplied by ``ratio`` (the user's learning rate changed)."""
        if state is None:
            return None
        return {**state, "buffer": tree_map(lambda u: u * ratio, state["buffer"])}

    def step(self, state: Any, center: Weights, delta: Weights) -> tuple[Weights, Any]:
        """``(new_center, new_state)`` after applying the mean delta ``delta``.

        Every array returned is new (the server's replies may still be sending
        the old center). Where all arrays share one float dtype and ``α``, ``β``
        are Python floats, each result is built in one fresh array by in-place
        operations in the order the formula reads, so the numbers are the same
        as the plain expressions' with two to three fewer temporaries per tensor.
        """
        if state is None:
            return tree_map(lambda c, d: c + d, center, delta), None
        alpha, beta = self.learning_rate, state["momentum"]
        if fusable(alpha, beta, center, delta, state["buffer"]):
            buffer = [momentum_buffer(beta, u, d) for u, d in zip(state["buffer"], delta)]
            if self.nesterov:
                center = [_nesterov(c, alpha, beta, d, u) for c, d, u in zip(center, delta, buffer)]
            else:
                center = [axpy(c, alpha, u) for c, u in zip(center, buffer)]
            return center, {"momentum": beta, "buffer": buffer}
        buffer = tree_map(lambda u, d: beta * u + d, state["buffer"], delta)
        if self.nesterov:
            center = tree_map(lambda c, d, u: c + alpha * (d + beta * u), center, delta, buffer)
        else:
            center = tree_map(lambda c, u: c + alpha * u, center, buffer)
        return center, {"momentum": beta, "buffer": buffer}


def fusable(alpha: Any, beta: Any, *weights: Weights) -> bool:
    """Whether the fused forms below give the plain expressions' numbers: Python-float factors
    (a NumPy scalar would widen the plain expression) and one float dtype for every array."""
    if not (type(alpha) is float and type(beta) is float):  # noqa: E721 (a NumPy float64 is a float subclass)
        return False
    dtypes = {a.dtype for arrays in weights for a in arrays}
    return len(dtypes) == 1 and dtypes.pop().kind == "f" and all(
        isinstance(a, np.ndarray) for arrays in weights for a in arrays)


def momentum_buffer(beta: float, u: np.ndarray, d: np.ndarray) -> np.ndarray:
    """``beta * u + d`` in one new array."""
    out = np.multiply(u, beta, out=np.empty_like(u))  # (an explicit out: a 0-d input gives an array, not a scalar)
    return np.add(out, d, out=out)


def _nesterov(c: np.ndarray, alpha: float, beta: float, d: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``c + alpha * (d + beta * u)`` in one new array."""
    out = np.multiply(u, beta, out=np.empty_like(u))
    np.add(d, out, out=out)
    np.multiply(out, alpha, out=out)
    return np.add(c, out, out=out)


def axpy(c: np.ndarray, alpha: float, u: np.ndarray) -> np.ndarray:
    """``c + alpha * u`` in one new array."""
    out = np.multiply(u, alpha, out=np.empty_like(u))
    return np.add(c, out, out=out)
