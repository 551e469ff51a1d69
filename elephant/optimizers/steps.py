"""Local optimizer steps and toy problems for :func:`elephant.optimizers.simulate`.

A local step is ``f(weights, grad_fn, slots) -> (weights, slots)``: it may call
``grad_fn`` wherever it needs a gradient, and ``slots`` is that worker's
local-optimizer state (None at first). Import these from
``elephant.optimizers.simulate`` or from here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from elephant.errors import ConfigError
from elephant.optimizers.helpers import check_number, tree_map

__all__ = ["sgd", "nesterov", "quadratic", "GradFn", "LocalStep"]

Weights = list[np.ndarray]
GradFn = Callable[[Weights], Sequence[Any]]
LocalStep = Callable[[Weights, GradFn, Any], tuple[Weights, Any]]


def _sgd_step(learning_rate, weights, grad_fn, slots):
    grads = grad_fn(weights)
    return tree_map(lambda w, g: w - learning_rate * np.asarray(g), weights, grads), slots


def _nesterov_step(learning_rate, momentum, form, weights, grad_fn, slots):
    velocity = [np.zeros_like(w) for w in weights] if slots is None else slots
    if form == "paper":  # v ← δv − η·g(x + δv);  x ← x + v
        grads = grad_fn(tree_map(lambda w, v: w + momentum * v, weights, velocity))
        velocity = tree_map(lambda v, g: momentum * v - learning_rate * np.asarray(g), velocity, grads)
        return tree_map(lambda w, v: w + v, weights, velocity), velocity
    grads = grad_fn(weights)  # keras: m ← δm − η·g(x);  x ← x + δm − η·g(x)
    velocity = tree_map(lambda v, g: momentum * v - learning_rate * np.asarray(g), velocity, grads)
    return tree_map(lambda w, v, g: w + momentum * v - learning_rate * np.asarray(g), weights, velocity, grads), velocity


def sgd(learning_rate: float) -> LocalStep:
    """Plain SGD local step ``θ ← θ − η·∇f(θ)`` (``keras.optimizers.SGD(η)``)."""
    return functools.partial(_sgd_step, check_number("learning_rate", learning_rate, low=0.0))


def nesterov(learning_rate: float, momentum: float = 0.9, form: str = "keras") -> LocalStep:
    """Nesterov momentum local step; its velocity is the worker's local-optimizer state.

    Args:
        learning_rate: η.
        momentum: δ in [0, 1). Default 0.9.
        form: ``"keras"`` (default) is ``keras.optimizers.SGD(η, δ, nesterov=True)``,
            which stores the look-ahead iterate; ``"paper"`` is the EAMSGD paper's
            ``v ← δv − η·g(x + δv); x ← x + v``.
    """
    if form not in ("keras", "paper"):
        raise ConfigError(f"`form` must be 'keras' or 'paper'; received form={form!r}")
    return functools.partial(
        _nesterov_step,
        check_number("learning_rate", learning_rate, low=0.0),
        check_number("momentum", momentum, low=0.0, high=1.0, high_open=True),
        form,
    )


def _quadratic_grad(target, curvature, weights):
    targets = target if isinstance(target, (list, tuple)) else [target] * len(weights)
    return [curvature * (w - np.asarray(t)) for w, t in zip(weights, targets, strict=True)]


def quadratic(target: Any, curvature: float = 1.0) -> GradFn:
    """Gradient of ``f(θ) = curvature/2 · ‖θ − target‖²`` over a weight list.

    Args:
        target: one array (or number) per weight array, or a single number for all.
        curvature: the Hessian's (constant) diagonal. Default 1.0.
    """
    return functools.partial(_quadratic_grad, target, check_number("curvature", curvature))
