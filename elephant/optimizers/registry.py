"""The registry of distributed optimizers: ``register``, ``get()`` by name, config or instance, and (de)serialization.

A rule class registers itself with :func:`register` (a class decorator) under its
``name`` and ``aliases``; :func:`get` resolves a name, a ``{"name", "config"}`` dict
(as :func:`serialize` makes it) or an instance. The base class is in
:mod:`~elephant.optimizers.base`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from elephant.errors import ConfigError
from elephant.optimizers.base import DistributedOptimizer
from elephant.protocol import MODES

__all__ = [
    "deserialize",
    "get",
    "register",
    "registered_names",
    "serialize",
]

_REGISTRY: dict[str, type[DistributedOptimizer]] = {}
_ALIASES: dict[str, str] = {}


def _same_class(a: type, b: type) -> bool:
    # A class re-created by re-running its module (a notebook cell, importlib.reload)
    # may take its old name back; a different class may not.
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def register(cls: type[DistributedOptimizer]) -> type[DistributedOptimizer]:
    """Class decorator: make ``cls`` resolvable by ``get(cls.name)`` and its ``aliases``.

    Raises:
        ConfigError: ``cls`` has no name, declares an unknown mode, or one of its
            names is already taken by a different class.
    """
    if not cls.name:
        raise ConfigError(f"{cls.__name__} must set a non-empty `name` to be registered")
    if not cls.modes:
        raise ConfigError(f"{cls.__name__}.modes is empty; expected some of {MODES}")
    for mode in cls.modes:
        if mode not in MODES:
            raise ConfigError(f"{cls.__name__}.modes holds unknown mode {mode!r}; expected some of {MODES}")
    name = cls.name.lower()
    aliases = [a.lower() for a in cls.aliases]
    for key in [name, *aliases]:
        owner = _REGISTRY.get(key) or _REGISTRY.get(_ALIASES.get(key, ""))
        if owner is not None and not _same_class(owner, cls):
            raise ConfigError(
                f"cannot register {cls.__module__}.{cls.__qualname__} as {key!r}: the name is taken by "
                f"{owner.__module__}.{owner.__qualname__}"
            )
    _REGISTRY[name] = cls
    for alias in aliases:
        _ALIASES[alias] = name
    return cls


def registered_names(aliases: bool = False) -> list[str]:
    """Sorted canonical names of the registered optimizers (plus aliases if asked)."""
    return sorted([*_REGISTRY, *_ALIASES]) if aliases else sorted(_REGISTRY)


def serialize(optimizer: DistributedOptimizer) -> dict[str, Any]:
    """``{"name": ..., "config": {...}}``, accepted back by :func:`get`.

    The window of a rule that decides it from the fit's costs (it was not
    given one: :attr:`DistributedOptimizer.adapts_window`) is left out, so that
    the rule read back still decides it.
    """
    config = optimizer.get_config()
    if optimizer.adapts_window:
        config.pop("window", None)
    return {"name": optimizer.name, "config": config}


def deserialize(config: Mapping[str, Any]) -> DistributedOptimizer:
    return get(config)


def get(identifier: Any, **kwargs: Any) -> DistributedOptimizer:
    """Resolve a distributed optimizer from a name, a config dict or an instance.

    Args:
        identifier: a registered name (``"downpour"``), a dict
            ``{"name": ..., "config": {...}}`` (as made by :func:`serialize`), or
            a :class:`DistributedOptimizer` instance (returned as is).
        **kwargs: constructor arguments, allowed with a name or dict.

    Raises:
        ConfigError: the identifier cannot be interpreted.
    """
    if isinstance(identifier, DistributedOptimizer):
        if kwargs:
            raise ConfigError(
                f"keyword arguments {sorted(kwargs)} cannot be combined with an optimizer instance {identifier!r}"
            )
        return identifier
    if isinstance(identifier, str):
        name, config = identifier, {}
    elif isinstance(identifier, Mapping) and isinstance(identifier.get("name"), str):
        name = identifier["name"]
        config = dict(identifier.get("config") or {})
        extra = set(identifier) - {"name", "config"}
        if extra:
            raise ConfigError(
                f"Could not interpret optimizer identifier: {identifier!r} (unexpected keys {sorted(extra)})"
            )
    else:
        raise ConfigError(f"Could not interpret optimizer identifier: {identifier!r}")
    key = name.lower()
    cls = _REGISTRY.get(_ALIASES.get(key, key))
    if cls is None:
        raise ConfigError(
            f"Could not interpret optimizer identifier: {identifier!r}; known names: {registered_names(aliases=True)}"
        )
    config.update(kwargs)
    try:
        return cls.from_config(config)
    except TypeError as exc:
        raise ConfigError(f"invalid arguments for optimizer {name!r}: {exc}") from None
