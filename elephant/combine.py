"""How an ensemble combines its members' predictions: pure numpy, no Keras or Spark.

``"mean"`` averages member outputs (weighted by ``weights``); ``"vote"`` takes the
weighted majority of class labels (row argmax, or ``p > 0.5`` for one sigmoid
unit), ties to the lowest class. Both work row by row, so a block combined on an
executor equals the same rows combined on the driver. :class:`elephant.ensemble.Ensemble`
validates its settings and combines (and scores) predictions with these functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from elephant.errors import ConfigError

__all__ = ["COMBINES", "check_combine", "check_weights", "combine_predictions", "scored", "vote_shares"]

COMBINES = ("mean", "vote")


def check_weights(weights: Any, n: int) -> tuple[float, ...] | None:
    """``weights`` as a tuple of floats, or None; ConfigError unless ``n`` positive finite numbers."""
    if weights is None:
        return None
    try:
        w = None if isinstance(weights, (str, bytes)) else np.asarray(weights, dtype=float)
    except (TypeError, ValueError):
        w = None
    if w is None or w.shape != (n,) or not np.all(np.isfinite(w)) or not np.all(w > 0):
        raise ConfigError(f"`weights` must be None or {n} positive finite numbers (one per member); received weights={weights!r}")
    return tuple(float(v) for v in w)


def check_combine(combine: Any) -> str:
    if combine not in COMBINES:
        raise ConfigError(f"`combine` must be 'mean' or 'vote'; received combine={combine!r}")
    return combine


def _labels(pred: Any) -> tuple[np.ndarray, int]:
    p = np.asarray(pred)
    if p.ndim == 2 and p.shape[1] > 1:
        return np.argmax(p, axis=1), p.shape[1]
    if p.ndim == 1 or (p.ndim == 2 and p.shape[1] == 1):
        return (p.reshape(len(p)) > 0.5).astype(np.int64), 2
    raise ConfigError(f"combine='vote' needs outputs of shape (n, classes) or (n, 1); received shape {p.shape}")


def vote_shares(preds: Sequence[Any], weights: Sequence[float] | None = None) -> np.ndarray:
    """Share of the members' (weighted) votes per row and class, shape ``(n, classes)``."""
    w = np.ones(len(preds)) if weights is None else np.asarray(weights, dtype=float)
    labels = [_labels(p) for p in preds]
    shares = np.zeros((len(labels[0][0]), max(c for _, c in labels)))
    for (lab, _), wi in zip(labels, w):
        shares[np.arange(len(shares)), lab] += wi
    return shares / w.sum()


def combine_predictions(preds: Sequence[Any], combine: str = "mean", weights: Sequence[float] | None = None):
    """Combine member predictions (one array, or list/dict of arrays, per member).

    ``"mean"``: ``np.mean`` over members (``np.average`` with ``weights``), kept in
    the members' float dtype. ``"vote"``: int64 labels, ties to the lowest class.
    """
    first = preds[0]
    if isinstance(first, (Mapping, list, tuple)):
        if combine == "vote":
            raise ConfigError("combine='vote' needs single-output models; received multi-output predictions")
        keys = list(first) if isinstance(first, Mapping) else range(len(first))
        out = {k: combine_predictions([p[k] for p in preds], combine, weights) for k in keys}
        return out if isinstance(first, Mapping) else [out[k] for k in keys]
    if combine == "vote":
        return np.argmax(vote_shares(preds, weights), axis=1)
    stack = np.stack([np.asarray(p) for p in preds])
    if weights is None:
        return np.mean(stack, axis=0)
    dtype = stack.dtype if np.issubdtype(stack.dtype, np.floating) else np.float64
    return np.average(stack, axis=0, weights=np.asarray(weights, dtype=float)).astype(dtype, copy=False)


def scored(preds: Sequence[Any], combine: str, weights) -> Any:
    """What evaluate scores: the mean output, or the vote shares (class-1 share for one sigmoid unit)."""
    if combine == "mean":
        return combine_predictions(preds, "mean", weights)
    shares = vote_shares(preds, weights).astype(np.float32)
    return shares[:, 1:2] if np.asarray(preds[0]).ndim == 1 or np.asarray(preds[0]).shape[-1] == 1 else shares
