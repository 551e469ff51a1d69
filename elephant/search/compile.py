"""A hyperopt ``hp`` space compiled to Optuna's define-by-run suggestions.

:func:`compile_space` walks the space's expression graph once and lists its
labels in an order where every ``hp.choice`` comes before the labels of its
branches. Calling the compiled space with an ``optuna.Trial`` suggests the
labels whose branch conditions hold, and :meth:`CompiledSpace.point` evaluates
the space at those values with ``hyperopt.space_eval``, so ``scope.int`` and
arithmetic in the space stay exact.

The mapping (a label's Optuna value is the value hyperopt stores for it, so
both ledgers read the same numbers):

=====================================  ==========================================================
``hp.uniform(l, lo, hi)``              ``suggest_float(l, lo, hi)``
``hp.loguniform(l, a, b)``             ``suggest_float(l, e**a, e**b, log=True)``
``hp.quniform(l, lo, hi, q)``          ``suggest_float(l, ceil(lo/q)*q, floor(hi/q)*q, step=q)``
                                       (hyperopt's grid of multiples of q; ``hp.uniformint`` too)
``hp.randint(l, hi)`` / ``(l, lo, hi)``  ``suggest_int(l, 0, hi-1)`` / ``suggest_int(l, lo, hi-1)``
``hp.choice(l, options)``              ``suggest_categorical(l, [0, .., n-1])``, then the chosen branch
``hp.pchoice(l, [(p, option), ...])``  the same; the probabilities are not used (logged)
=====================================  ==========================================================

``hp.normal``, ``hp.lognormal``, their ``q`` forms (unbounded) and
``hp.qloguniform`` (Optuna has no stepped log scale) are refused with a
:class:`~elephant.errors.ConfigError` naming the label and the expression.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from elephant.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["CallableSpace", "CompiledSpace", "Param", "compile_space"]

_REFUSED = {
    "normal": "its range is unbounded; use hp.uniform over the range you mean",
    "lognormal": "its range is unbounded; use hp.loguniform over the range you mean",
    "qnormal": "its range is unbounded; use hp.quniform over the range you mean",
    "qlognormal": "its range is unbounded; use hp.loguniform over the range you mean",
    "qloguniform": "Optuna has no stepped log scale; use hp.loguniform, or scope.int(hp.loguniform(...)) for integers",
}


@dataclasses.dataclass(frozen=True)
class Param:
    """One label: its kind, constant arguments and when it is active.

    ``when`` lists alternatives, each a tuple of ``(choice label, index)`` that
    must all hold; ``((),)`` means always.
    """

    label: str
    kind: str
    args: tuple
    when: tuple

    def describe(self) -> str:
        text = f"{self.label}: {self.kind}({', '.join(map(repr, self.args))})"
        if () in self.when:
            return text
        return text + " if " + " or ".join(" and ".join(f"{c}={i}" for c, i in alt) for alt in self.when)

    def active(self, values: Mapping[str, Any]) -> bool:
        return any(all(values.get(c) == i for c, i in alt) for alt in self.when)

    def distribution(self):
        """The Optuna distribution of this label."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "uniform":
            return FloatDistribution(*self.args)
        if self.kind == "loguniform":
            return FloatDistribution(math.exp(self.args[0]), math.exp(self.args[1]), log=True)
        if self.kind == "quniform":
            low, high, q = self.args
            return FloatDistribution(math.ceil(low / q - 1e-9) * q, math.floor(high / q + 1e-9) * q, step=q)
        if self.kind == "randint":
            low, high = (0, self.args[0]) if len(self.args) == 1 else self.args
            return IntDistribution(int(low), int(high) - 1)
        return CategoricalDistribution(list(range(self.args[0])))  # choice, pchoice: the branch's index

    def suggest(self, trial) -> Any:
        dist = self.distribution()
        if self.kind in ("choice", "pchoice"):
            return trial.suggest_categorical(self.label, dist.choices)
        if self.kind == "randint":
            return trial.suggest_int(self.label, dist.low, dist.high)
        return trial.suggest_float(self.label, dist.low, dist.high, log=dist.log, step=dist.step)

    def snap(self, value: Any) -> Any:
        """``value`` (as hyperopt drew it) as the nearest value of this label's Optuna distribution."""
        dist = self.distribution()
        if self.kind in ("choice", "pchoice", "randint"):
            return min(max(int(value), int(dist.low if self.kind == "randint" else 0)),
                       int(dist.high if self.kind == "randint" else self.args[0] - 1))
        value = min(max(float(value), dist.low), dist.high)
        if dist.step is not None:
            value = dist.low + round((value - dist.low) / dist.step) * dist.step
            value = min(value, dist.high)
        return value


class CompiledSpace:
    """An ``hp`` space as define-by-run suggestions; call it with an ``optuna.Trial``."""

    def __init__(self, space: Any, params: list[Param]):
        self.space, self.params = space, params
        self.labels = [p.label for p in params]
        self.conditional = any(() not in p.when for p in params)

    def __call__(self, trial) -> dict:
        """Suggest the active labels on ``trial``; their values, by label (hyperopt's ``vals``)."""
        values: dict[str, Any] = {}
        for p in self.params:
            if p.active(values):
                values[p.label] = p.suggest(trial)
        return values

    def point(self, values: Mapping[str, Any]) -> Any:
        """The space evaluated at ``values``: what a trial's fit gets."""
        import hyperopt

        return hyperopt.space_eval(self.space, dict(values))

    def describe(self) -> list[str]:
        return [p.describe() for p in self.params]

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.describe()).encode()).hexdigest()[:16]

    def snap(self, vals: Mapping[str, list]) -> dict:
        """hyperopt's ``misc["vals"]`` of one point as Optuna parameters (each value inside its distribution)."""
        by_label = {p.label: p for p in self.params}
        return {label: by_label[label].snap(v[0]) for label, v in vals.items() if v and label in by_label}

    def hyperopt_vals(self, values: Mapping[str, Any]) -> dict:
        """Optuna parameters as hyperopt's ``misc["vals"]`` (an inactive label has ``[]``)."""
        return {label: [values[label]] if label in values else [] for label in self.labels}


class CallableSpace:
    """A user's ``space(trial) -> dict``: native Optuna define-by-run."""

    conditional = True
    space = None

    def __init__(self, fn: Callable):
        self.fn = fn
        self.labels: list[str] = []

    def __call__(self, trial) -> dict:
        point = self.fn(trial)
        if not isinstance(point, Mapping):
            raise ConfigError(f"a callable `space` must return a dict of parameters; {self.name()} returned "
                              f"{type(point).__name__}")
        return dict(point)

    def point(self, values: Mapping[str, Any]) -> dict:
        return dict(values)

    def name(self) -> str:
        return f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', repr(self.fn))}"

    def describe(self) -> list[str]:
        return [f"callable {self.name()}"]

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.describe()).encode()).hexdigest()[:16]


def compile_space(space: Any) -> CompiledSpace | CallableSpace:
    """Compile an ``hp`` space (or accept a callable ``space(trial)``).

    Raises:
        ConfigError: a label has no exact Optuna equivalent, takes bounds from
            another label, or is used with two different definitions.
    """
    from hyperopt import pyll

    if callable(space) and not isinstance(space, pyll.Apply):
        return CallableSpace(space)
    found: dict[str, Param] = {}
    _walk(pyll.as_apply(space), (), found, set())
    return CompiledSpace(space, list(found.values()))


def _constant(node, label: str, kind: str) -> Any:
    from hyperopt import pyll

    if any(n.name == "hyperopt_param" for n in pyll.dfs(node)):
        raise ConfigError(f"hp.{kind} for label {label!r} takes an argument from another label; Optuna needs "
                          "constant bounds: use an hp.choice over whole sub-spaces instead")
    return pyll.rec_eval(node)


def _param(label: str, dist, index_of_switch: bool, when: tuple) -> Param:
    kind = dist.name
    args = tuple(_constant(a, label, kind) for a in dist.pos_args)
    named = {name: _constant(a, label, kind) for name, a in dist.named_args}
    expression = f"hp.{kind}({', '.join([repr(label), *map(repr, args), *(f'{k}={v!r}' for k, v in named.items())])})"
    if kind in _REFUSED:
        raise ConfigError(f"label {label!r}: {expression} has no Optuna equivalent: {_REFUSED[kind]}")
    if kind == "quniform":
        args = (*args, named["q"]) if "q" in named else args
        low, high, q = (float(a) for a in args)
        if not q > 0 or math.ceil(low / q - 1e-9) * q > math.floor(high / q + 1e-9) * q:
            raise ConfigError(f"label {label!r}: {expression} holds no multiple of q={q} between {low} and {high}")
        args = (low, high, q)
    elif kind in ("uniform", "loguniform"):
        args = tuple(float(a) for a in args)
        if not args[0] < args[1]:
            raise ConfigError(f"label {label!r}: {expression} needs low < high")
    elif kind == "randint" and index_of_switch:
        kind, args = "choice", (int(args[0]),)
    elif kind == "randint":
        args = tuple(int(a) for a in args)
        if (args[0] if len(args) == 1 else args[1] - args[0]) < 1:
            raise ConfigError(f"label {label!r}: {expression} holds no integer")
    elif kind == "categorical" and index_of_switch:
        n = named.get("upper") or len(args[0])
        log.info("label %r: hp.pchoice's probabilities %s are not used; Optuna's sampler draws the options", label,
                 args[0])
        kind, args = "pchoice", (int(n),)
    else:
        raise ConfigError(f"label {label!r}: {expression} is not an hp expression elephant can compile to Optuna; "
                          "use hp.uniform, hp.loguniform, hp.quniform, hp.uniformint, hp.randint, hp.choice or "
                          "hp.pchoice, or pass a callable space(trial)")
    return Param(label, kind, args, when)


def _walk(node, cond: tuple, found: dict[str, Param], seen: set) -> None:
    """Record every label under ``node`` with the branch condition ``cond`` that leads to it."""
    key = (id(node), cond)
    if key in seen:
        return
    seen.add(key)
    if node.name == "hyperopt_param":
        _record(node, cond, found, index_of_switch=False)
        return
    if node.name == "switch" and node.pos_args and node.pos_args[0].name == "hyperopt_param":
        index, options = node.pos_args[0], node.pos_args[1:]
        label = _record(index, cond, found, index_of_switch=True)
        for i, option in enumerate(options):
            _walk(option, (*cond, (label, i)), found, seen)
        return
    for child in node.inputs():
        _walk(child, cond, found, seen)


def _record(node, cond: tuple, found: dict[str, Param], index_of_switch: bool) -> str:
    label = node.arg["label"].obj
    new = _param(label, node.arg["obj"], index_of_switch, (cond,))
    old = found.get(label)
    if old is None:
        found[label] = new
    elif (old.kind, old.args) != (new.kind, new.args):
        raise ConfigError(f"label {label!r} is used twice with different definitions: {old.describe()} and "
                          f"{new.describe()}")
    elif cond not in old.when:
        found[label] = dataclasses.replace(old, when=((),) if () in (*old.when, cond) else (*old.when, cond))
    return label
