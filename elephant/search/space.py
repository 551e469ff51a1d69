"""Routing and validation of search-space keys: which key goes to ``build_fn``, ``fit`` or the SparkModel.

A point of the space (merged over :func:`elephant.search.minimize`'s fixed
keyword arguments) is split by key name with :func:`route`: ``epochs``,
``batch_size``, ``shuffle`` (fixed-only: ``callbacks``, ``features_col``,
``label_col``) go to ``fit``; every SparkModel setting (the fields of
:class:`~elephant.config.Settings` but ``seed``, :data:`ELEPHANT_KEYS`) and
``optimizer.<param>`` (fixed-only: ``custom_objects``, ``read_timeout``) to the
SparkModel; any other key to ``build_fn``.
:func:`check_space` samples the space before any trial runs, so bad keys or
settings raise :class:`~elephant.errors.ConfigError` up front.
"""

from __future__ import annotations

import collections
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from elephant import optimizers as O
from elephant.config import Settings, check_mode, default_optimizer
from elephant.errors import ConfigError

__all__ = ["ELEPHANT_KEYS", "FIT_KEYS", "FIXED_SETTINGS", "NOT_ROUTED", "Routed", "build_params", "check_keys",
           "check_space", "elephant_settings", "route"]

FIT_KEYS = ("epochs", "batch_size", "shuffle")
_FIT_ONLY = ("callbacks", "features_col", "label_col")  # fixed fit arguments (not searchable)
#: Settings fields the search does not route to the SparkModel, and why.
NOT_ROUTED = {"seed": "minimize's own `seed` seeds the sampler, and a space key 'seed' goes to build_fn"}
#: Settings fields given to the SparkModel as fixed keyword arguments only, and why.
FIXED_SETTINGS = {"read_timeout": "a timeout, not a hyperparameter"}
#: The searchable SparkModel settings: every Settings field but those above.
ELEPHANT_KEYS = tuple(n for n in Settings.names() if n not in NOT_ROUTED and n not in FIXED_SETTINGS)
_SM_ONLY = ("custom_objects", *FIXED_SETTINGS)  # fixed SparkModel arguments (not searchable)
_OPT = "optimizer."


Routed = collections.namedtuple("Routed", "build fit settings")  # a point's keys split by destination


def build_params(build_fn: Callable) -> tuple[frozenset | None, frozenset]:
    """``(accepted, required)`` keyword names of ``build_fn``; accepted is None with ``**kwargs``."""
    params = list(inspect.signature(build_fn).parameters.values())
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = frozenset(p.name for p in named if p.default is p.empty)
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None, required
    return frozenset(p.name for p in named), required


def route(params: Mapping[str, Any], accepted: frozenset | None) -> Routed:
    """Split ``params`` by key name (see :func:`elephant.search.minimize`); an unknown key raises ConfigError."""
    build, fit, settings = {}, {}, {}
    for key, value in params.items():
        if key in FIT_KEYS or key in _FIT_ONLY:
            fit[key] = value
        elif key in ELEPHANT_KEYS or key in _SM_ONLY or key.startswith(_OPT):
            settings[key] = value
        elif accepted is None or key in accepted:
            build[key] = value
        else:
            raise ConfigError(
                f"unknown key {key!r}: not a parameter of build_fn {sorted(accepted)}, a fit argument "
                f"{list(FIT_KEYS + _FIT_ONLY)} or an elephant setting {list(ELEPHANT_KEYS + _SM_ONLY)} or 'optimizer.<param>'"
            )
    return Routed(build, fit, settings)


def elephant_settings(settings: Mapping[str, Any]) -> dict:
    """SparkModel keyword arguments, validated; ``optimizer.<param>`` keys are passed to ``optimizers.get``."""
    out = {k: v for k, v in settings.items() if not k.startswith(_OPT)}
    mode = check_mode(out.get("mode", Settings.defaults()["mode"]))
    ident = out.get("optimizer") or default_optimizer(mode)
    out["optimizer"] = O.get(ident, **{k[len(_OPT):]: v for k, v in settings.items() if k.startswith(_OPT)})
    Settings(**{k: v for k, v in out.items() if k in Settings.names()})  # validates them together
    return out


def check_keys(keys, fixed: Mapping[str, Any], accepted: frozenset | None) -> None:
    """Reject space keys that are unknown, not searchable, or also given as keyword arguments."""
    keys = set(keys)
    for key in sorted(keys, key=str):
        if not isinstance(key, str):
            raise ConfigError(f"keys of the space must be strings; received {key!r}")
        if key in fixed:
            raise ConfigError(f"key {key!r} is both in the space and a keyword argument of minimize; give it once")
        if key in _FIT_ONLY + _SM_ONLY:
            raise ConfigError(f"{key!r} cannot be searched; pass {key}=... to minimize instead")
    known = {p for n in O.registered_names() for p in inspect.signature(type(O.get(n)).__init__).parameters} - {"self"}
    for key in sorted(keys | set(fixed)):
        if key.startswith(_OPT) and key[len(_OPT):] not in known:
            raise ConfigError(f"unknown key {key!r}: no distributed optimizer takes {key[len(_OPT):]!r}; "
                              f"known parameters: {sorted(known)}")
        route({key: None}, accepted)


def check_space(space: Any, fixed: Mapping[str, Any], params: tuple, seed: int | None, draws: int = 20) -> int | None:
    """Validate ``draws`` sampled points of ``space`` as trials would see them; the largest ``num_workers``."""
    accepted, required = params
    largest = None
    for point in _draw(space, seed, draws):
        if not isinstance(point, Mapping):
            raise ConfigError("`space` must be a dict of names to hyperopt expressions (or sample to one) or a "
                              "callable space(trial) returning a dict; "
                              f"received a space that samples to {type(point).__name__}")
        check_keys(point, fixed, accepted)
        routed = route({**fixed, **point}, accepted)
        missing = sorted(required - set(routed.build))
        if missing:
            raise ConfigError(f"build_fn requires {missing} but neither the space nor the keyword arguments give it")
        try:
            settings = elephant_settings(routed.settings)
        except ConfigError as exc:
            raise ConfigError(f"the space yields invalid elephant settings {routed.settings}: {exc}") from None
        largest = max(largest or 0, settings.get("num_workers") or 0) or None
    return largest


def _draw(space: Any, seed: int | None, draws: int):
    """``draws`` points of ``space``: hyperopt's sampler, or a callable space on random Optuna trials."""
    from hyperopt import pyll
    from hyperopt.pyll import stochastic

    if callable(space) and not isinstance(space, pyll.Apply):
        import optuna

        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
        for _ in range(draws):
            yield space(study.ask())
        return
    rng = np.random.default_rng(seed)
    for _ in range(draws):
        yield stochastic.sample(space, rng=rng)
