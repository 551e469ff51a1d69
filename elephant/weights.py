"""Pure numpy operations over lists of arrays (Keras ``get_weights()`` order).

Every function returns new arrays and never mutates its arguments, so the
optimizer rules built on top of them stay pure.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from elephant.errors import DataError

Weights = list[np.ndarray]

__all__ = [
    "Weights",
    "add",
    "sub",
    "scale",
    "mul",
    "weighted_mean",
    "WeightedSum",
    "zeros_like",
    "copy",
    "check_same_structure",
    "all_finite",
    "nbytes",
]


def add(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> Weights:
    """Element-wise ``a + b`` for each array pair."""
    return [x + y for x, y in zip(a, b, strict=True)]


def sub(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> Weights:
    """Element-wise ``a - b`` for each array pair."""
    return [x - y for x, y in zip(a, b, strict=True)]


def mul(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> Weights:
    """Element-wise ``a * b`` for each array pair."""
    return [x * y for x, y in zip(a, b, strict=True)]


def scale(a: Sequence[np.ndarray], factor: float) -> Weights:
    """Every array multiplied by ``factor``, dtype preserved."""
    return [(x * factor).astype(x.dtype, copy=False) for x in a]


def zeros_like(a: Sequence[np.ndarray]) -> Weights:
    return [np.zeros_like(x) for x in a]


def copy(a: Sequence[np.ndarray]) -> Weights:
    return [np.array(x, copy=True) for x in a]


def weighted_mean(items: Sequence[Sequence[np.ndarray]], weights: Sequence[float]) -> Weights:
    """Mean of several weight lists, weighted by ``weights`` (e.g. sample counts).

    Entries with zero weight contribute nothing; at least one weight must be positive.
    """
    if len(items) != len(weights):
        raise ValueError(f"got {len(items)} weight lists but {len(weights)} weights")
    acc = WeightedSum()
    for item, w in zip(items, weights):
        acc.add(item, w)
    return acc.mean()


class WeightedSum:
    """A running weighted mean of weight lists: add them one at a time, in any order.

    Sums are kept in float64, so the mean cast back to each array's dtype does
    not depend on the order in practice; memory is one float64 copy of a weight
    list, however many are added. Entries with zero weight contribute nothing.
    """

    def __init__(self) -> None:
        self.total = 0.0
        self._sums: list[np.ndarray] | None = None
        self._dtypes: list[np.dtype] = []

    def add(self, item: Sequence[np.ndarray], weight: float) -> None:
        if weight == 0:
            return
        if self._sums is None:  # the first item is the sum: x·w in float64, as 0 + x·w would be
            arrays = [np.asarray(x) for x in item]
            # (an explicit out: a 0-d input would give a scalar, which += would not update in place)
            self._sums = [np.multiply(x, weight, out=np.empty(x.shape, np.float64), dtype=np.float64) for x in arrays]
            self._dtypes = [x.dtype for x in arrays]
        else:
            for acc, x in zip(self._sums, item, strict=True):
                acc += np.multiply(x, weight, dtype=np.float64)
        self.total += float(weight)

    def mean(self) -> Weights:
        """The weighted mean so far, cast to each array's dtype; needs a positive total weight."""
        if self._sums is None or self.total <= 0:
            raise ValueError(f"weighted_mean needs a positive total weight; received a total of {self.total}")
        # divided in float64 and cast while written, as (s / total).astype(dtype) but with no float64 temporary
        return [np.divide(s, self.total, out=np.empty(s.shape, dtype), casting="same_kind")
                if np.dtype(dtype).kind == "f" else (s / self.total).astype(dtype)
                for s, dtype in zip(self._sums, self._dtypes)]


def check_same_structure(expected: Sequence[np.ndarray], received: Sequence[np.ndarray], what: str = "weights") -> None:
    """Raise ``DataError`` unless both lists have the same count, shapes and dtypes.

    ``received`` may be weights not computed yet that know their ``structure``
    (``(shape, dtype)`` pairs): that is checked instead, without computing them.
    """
    if len(expected) != len(received):
        raise DataError(f"{what}: expected {len(expected)} arrays, received {len(received)}")
    structure = getattr(received, "structure", None)
    if structure is None:
        structure = [(r.shape, r.dtype) for r in received]
    for i, (e, (shape, dtype)) in enumerate(zip(expected, structure)):
        if e.shape != shape:
            raise DataError(f"{what}[{i}]: expected shape {e.shape}, received {shape}")
        if e.dtype != dtype:
            raise DataError(f"{what}[{i}]: expected dtype {e.dtype}, received {dtype}")


def all_finite(a: Sequence[np.ndarray]) -> bool:
    return all(bool(np.isfinite(x).all()) for x in a if x.dtype.kind == "f")


def nbytes(a: Sequence[np.ndarray]) -> int:
    return sum(int(x.nbytes) for x in a)
