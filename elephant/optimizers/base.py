"""The distributed-optimizer interface, the registry and ``get()``.

One algorithm is one subclass of :class:`DistributedOptimizer` holding two pure
rules over lists of numpy arrays and explicit, picklable state:

* the **worker rule** says what a worker sends after a window of local steps
  (:meth:`~DistributedOptimizer.make_commit`) and how it merges the server's
  reply (:meth:`~DistributedOptimizer.on_reply`);
* the **server rule** says how the parameter server applies one commit
  (:meth:`~DistributedOptimizer.apply`, asynchronous modes) or one synchronous
  round of commits (:meth:`~DistributedOptimizer.apply_round`).

Everything else -- locks, clocks, barriers, staleness admission (SSP), I/O,
idempotency and the partial-window flush -- belongs to the runtime (the PS
store, the worker loop and :class:`elephant.SparkModel`), so a rule is plain
math that can be tested with exact numbers.

Sign convention: a delta is ``after - before`` and the server *adds* it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from elephant import weights as W
from elephant.errors import ConfigError

Weights = list[np.ndarray]

MODES = ("synchronous", "asynchronous", "hogwild")

__all__ = [
    "MODES",
    "Commit",
    "Reply",
    "DistributedOptimizer",
    "register",
    "get",
    "serialize",
    "deserialize",
    "registered_names",
]


@dataclasses.dataclass(frozen=True)
class Commit:
    """What a worker sends after a window.

    Attributes:
        tensors: the rule's payload (a delta, a normalised delta, or weights).
        num_steps: local steps covered by this window (a flushed partial window
            has fewer than ``window``).
        num_samples: samples trained in this window; synchronous rules weight by it.
        base_clock: server clock of the center this window started from.
    """

    tensors: Weights
    num_steps: int
    num_samples: int
    base_clock: int


@dataclasses.dataclass(frozen=True)
class Reply:
    """What the server answers to a pull or a commit.

    Attributes:
        clock: number of commits (asynchronous) or rounds (synchronous) applied.
        center: the center weights after this commit.
        tensors: an optional rule-specific payload (e.g. the EASGD elastic term).
    """

    clock: int
    center: Weights
    tensors: Weights | None = None


def _check_window(window: Any) -> int:
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ConfigError(f"`window` must be a positive int; received window={window!r}")
    return int(window)


def _check_staleness_bound(bound: Any) -> int | None:
    if bound is None:
        return None
    if isinstance(bound, bool) or not isinstance(bound, (int, np.integer)) or bound < 0:
        raise ConfigError(f"`staleness_bound` must be None or an int >= 0; received staleness_bound={bound!r}")
    return int(bound)


class DistributedOptimizer:
    """Base class of every distributed optimizer.

    Subclasses set ``name``, ``modes`` and ``default_window`` and override the
    rules they change. The defaults implement a DOWNPOUR-style delta exchange:
    the worker sends ``weights - pulled`` and adopts the center it gets back.

    Args:
        window: local steps per commit. Defaults to the class's ``default_window``.
            ``SparkModel(frequency=...)`` overrides it.
        staleness_bound: Stale Synchronous Parallel bound ``s`` for asynchronous
            modes: a worker may start a window only when it is at most ``s``
            commits ahead of the slowest active worker. ``None`` (default) means
            unbounded (plain asynchronous).
    """

    name: ClassVar[str] = ""
    modes: ClassVar[tuple[str, ...]] = ("asynchronous", "hogwild")
    default_window: ClassVar[int] = 1

    def __init__(self, window: int | None = None, staleness_bound: int | None = None):
        self.window = _check_window(self.default_window if window is None else window)
        self.staleness_bound = _check_staleness_bound(staleness_bound)

    # ----------------------------------------------------------------- worker
    def worker_init(self, center: Weights) -> Any:
        """Worker-rule state at the start of a partition (default: none)."""
        return None

    def make_commit(self, state: Any, weights: Weights, pulled: Weights, num_steps: int) -> tuple[Weights, Any]:
        """Payload sent after ``num_steps`` local steps from ``pulled`` to ``weights``."""
        return W.sub(weights, pulled), state

    def on_reply(self, state: Any, weights: Weights, reply: Reply) -> tuple[Weights, Any]:
        """Local weights after the server's reply (default: adopt the center)."""
        return reply.center, state

    # ----------------------------------------------------------------- server
    def server_init(self, center: Weights, num_workers: int) -> Any:
        """Server-rule state at the start of a fit (default: none)."""
        return None

    def on_pull(self, state: Any, center: Weights, clock: int, worker: int) -> Any:
        """Server-rule state after ``worker`` pulled ``center`` (default: unchanged)."""
        return state

    def apply(
        self, state: Any, center: Weights, clock: int, worker: int, commit: Commit
    ) -> tuple[Weights, Weights | None, Any]:
        """Apply one asynchronous commit: ``(new_center, reply_tensors, new_state)``."""
        raise NotImplementedError(f"{type(self).__name__} has no asynchronous server rule")

    def apply_round(
        self, state: Any, center: Weights, clock: int, commits: Mapping[int, Commit]
    ) -> tuple[Weights, Mapping[int, Weights | None], Any]:
        """Apply one synchronous round (worker index -> commit).

        Returns ``(new_center, reply_tensors_by_worker, new_state)``.
        """
        raise NotImplementedError(f"{type(self).__name__} has no synchronous server rule")

    # ------------------------------------------------------------ config
    def get_config(self) -> dict[str, Any]:
        """Constructor arguments that rebuild this optimizer (see :meth:`from_config`)."""
        return {"window": self.window, "staleness_bound": self.staleness_bound}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> DistributedOptimizer:
        return cls(**dict(config))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(self.get_config().items()))))


_REGISTRY: dict[str, type[DistributedOptimizer]] = {}


def register(cls: type[DistributedOptimizer]) -> type[DistributedOptimizer]:
    """Class decorator: make ``cls`` resolvable by ``get(cls.name)``."""
    if not cls.name:
        raise ConfigError(f"{cls.__name__} must set a non-empty `name` to be registered")
    for mode in cls.modes:
        if mode not in MODES:
            raise ConfigError(f"{cls.__name__}.modes holds unknown mode {mode!r}; expected some of {MODES}")
    _REGISTRY[cls.name.lower()] = cls
    return cls


def registered_names() -> list[str]:
    return sorted(_REGISTRY)


def serialize(optimizer: DistributedOptimizer) -> dict[str, Any]:
    """``{"name": ..., "config": {...}}``, accepted back by :func:`get`."""
    return {"name": optimizer.name, "config": optimizer.get_config()}


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
    cls = _REGISTRY.get(name.lower())
    if cls is None:
        raise ConfigError(
            f"Could not interpret optimizer identifier: {identifier!r}; known names: {registered_names()}"
        )
    config.update(kwargs)
    try:
        return cls.from_config(config)
    except TypeError as exc:
        raise ConfigError(f"invalid arguments for optimizer {name!r}: {exc}") from None
