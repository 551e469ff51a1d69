"""The settings of a fit, validated once: :class:`Settings` (a SparkModel's) and :class:`FitArgs` (a ``fit`` call's).

Each setting is defined here once, with its default and its check; the
façades (:class:`elephant.SparkModel`, :mod:`elephant.ml`, the search) and the
simulator build these objects and read the defaults from them, so they cannot
drift apart. Both are frozen: a fit plans from values that nothing changes
under it. ``Settings.to_config()`` / ``Settings.from_config()`` are what
``SparkModel.save`` and ``elephant.load`` write and read.

The checks raise :class:`~elephant.errors.ConfigError` (or
:class:`~elephant.errors.DataError` for data) with the argument's name, what
it must be and what was received.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from elephant import optimizers as O
from elephant.errors import ConfigError, DataError
from elephant.optimizers.base import check_overlap
from elephant.optimizers.compress import check_reply_mode

__all__ = ["DEFAULT_OPTIMIZERS", "FitArgs", "Settings", "check_frequency", "check_mode", "check_positive_int",
           "check_ps_shards", "default_optimizer", "refuse_unsupported", "resolve_window"]

#: The distributed optimizer of each mode when ``SparkModel(optimizer=None)``; chosen by
#: ``benchmarks/convergence.py`` (docs/convergence.md): both defaults average the workers'
#: progress, split the batch among the workers and either take an outer Nesterov step (SGD)
#: or, at 2 to 4 workers, train them at ``√K`` times an adaptive optimizer's rate (Adam, RMSprop...);
#: at 5 to 64 the same, ramped up over the first epoch (asynchronous: with windows).
DEFAULT_OPTIMIZERS = {"synchronous": "modelaveraging", "asynchronous": "delayednesterov", "hogwild": "downpour"}


def default_optimizer(mode: str) -> str:
    """The distributed optimizer used in ``mode`` when ``SparkModel(optimizer=None)``."""
    return DEFAULT_OPTIMIZERS[mode]


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_mode(mode: Any) -> str:
    if mode not in O.MODES:
        raise ConfigError(f"`mode` must be 'synchronous', 'asynchronous' or 'hogwild'; received mode={mode!r}")
    return mode


def check_frequency(frequency: Any) -> str | int | None:
    """``"epoch"``, ``"batch"``, a positive int (local steps per commit) or None (the rule's own window)."""
    if frequency is None or frequency in ("epoch", "batch"):
        return frequency
    if _is_int(frequency) and frequency > 0:
        return int(frequency)
    raise ConfigError(f"`frequency` must be 'epoch', 'batch', a positive int or None; received frequency={frequency!r}")


def check_positive_int(name: str, value: Any, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if not _is_int(value) or value < 1:
        raise ConfigError(f"`{name}` must be a positive int; received {name}={value!r}")
    return int(value)


def _check_count(name: str, value: Any) -> int:
    if not _is_int(value) or value < 0:
        raise ConfigError(f"`{name}` must be an int >= 0; received {name}={value!r}")
    return int(value)


#: Where a fit's parameter server runs: None decides (the driver in a classic session, the epoch's tasks
#: under Spark Connect), "driver" or "executors" (the first tasks of each epoch's barrier stage).
PS_PLACEMENTS = (None, "driver", "executors")


def check_ps_shards(ps_shards: Any) -> int | None:
    """``ps_shards``: None (decided at fit start) or a positive int.

    Whether the rule and ``norm_guard`` allow more than one shard is checked where
    the parameter server is known (:func:`elephant.fit.plan.check_requested_shards`).
    """
    if ps_shards is None:
        return None
    if not _is_int(ps_shards) or ps_shards < 1:
        raise ConfigError(f"`ps_shards` must be a positive int or None (decided at fit start); "
                          f"received ps_shards={ps_shards!r}")
    return int(ps_shards)


class _Fields:
    """Class methods over a settings dataclass's fields, the one place each is defined."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The field names, in order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each field's default."""
        return {f.name: f.default for f in dataclasses.fields(cls)}

    @classmethod
    def of(cls, values: Mapping[str, Any]):
        """An instance from the entries of ``values`` named as fields (a caller's ``locals()``); others are left."""
        return cls(**{name: values[name] for name in cls.names() if name in values})


def resolve_window(frequency: str | int | None, optimizer: O.DistributedOptimizer) -> int | None:
    """Local steps per commit: None means one commit per partition pass."""
    if frequency == "epoch":
        return None
    if frequency == "batch":
        return 1
    if frequency is None:
        return optimizer.window
    return frequency


@dataclasses.dataclass(frozen=True)
class Settings(_Fields):
    """How a :class:`~elephant.SparkModel` trains; the arguments are documented there.

    ``optimizer`` may be given as a name, config dict or instance; it is held
    as the resolved :class:`~elephant.optimizers.DistributedOptimizer` (None:
    the mode's default, :data:`DEFAULT_OPTIMIZERS`).

    Raises:
        ConfigError: a setting out of range, or an optimizer that does not
            support ``mode`` or ``overlap``.
    """

    mode: str = "asynchronous"
    frequency: str | int | None = None
    optimizer: Any = None
    num_workers: int | None = None
    read_timeout: float = 600.0
    seed: int | None = 0
    batch_split: bool | None = None
    overlap: bool = False
    epoch_retries: int = 2
    on_failure: str = "rollback"
    norm_guard: float | None = None
    comm_budget: float = 0.1
    ps_shards: int | None = None
    ps_placement: str | None = None

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen: validated once)
        mode = check_mode(self.mode)
        set_("frequency", check_frequency(self.frequency))
        optimizer = O.get(default_optimizer(mode) if self.optimizer is None else self.optimizer)
        if mode not in optimizer.modes:
            raise ConfigError(f"optimizer {optimizer.name!r} supports mode(s) {list(optimizer.modes)}; "
                              f"received mode={mode!r}")
        check_reply_mode(optimizer, mode)
        set_("optimizer", optimizer)
        set_("num_workers", check_positive_int("num_workers", self.num_workers, allow_none=True))
        if isinstance(self.read_timeout, bool) or not (isinstance(self.read_timeout, (int, float))
                                                        and self.read_timeout > 0):
            raise ConfigError("`read_timeout` must be a positive number of seconds; "
                              f"received read_timeout={self.read_timeout!r}")
        set_("read_timeout", float(self.read_timeout))
        if self.seed is not None and not _is_int(self.seed):
            raise ConfigError(f"`seed` must be an int or None; received seed={self.seed!r}")
        if self.batch_split is not None and not isinstance(self.batch_split, bool):
            raise ConfigError(f"`batch_split` must be True, False or None; received batch_split={self.batch_split!r}")
        set_("overlap", check_overlap(self.overlap, optimizer, mode))
        set_("epoch_retries", _check_count("epoch_retries", self.epoch_retries))
        if self.on_failure not in ("rollback", "keep"):
            raise ConfigError(f"`on_failure` must be 'rollback' or 'keep'; received on_failure={self.on_failure!r}")
        guard = self.norm_guard
        if guard is not None and (isinstance(guard, bool) or not isinstance(guard, (int, float))
                                  or not guard > 1 or guard == float("inf")):
            raise ConfigError(f"`norm_guard` must be a number > 1 or None; received norm_guard={guard!r}")
        budget = self.comm_budget
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget < 1:
            raise ConfigError(f"`comm_budget` must be a number in (0, 1); received comm_budget={budget!r}")
        set_("comm_budget", float(budget))
        set_("ps_shards", check_ps_shards(self.ps_shards))
        if self.ps_placement not in PS_PLACEMENTS:
            raise ConfigError(f"`ps_placement` must be one of {list(PS_PLACEMENTS)}; "
                              f"received ps_placement={self.ps_placement!r}")

    @property
    def window(self) -> int | None:
        """Local steps per commit (None: one commit per partition pass)."""
        return resolve_window(self.frequency, self.optimizer)

    @property
    def splits_batch(self) -> bool:
        """Whether ``fit``'s ``batch_size`` is divided among the workers (see ``SparkModel(batch_split=)``)."""
        return self.optimizer.splits_batch if self.batch_split is None else self.batch_split

    def to_config(self) -> dict[str, Any]:
        """Plain values (the optimizer serialized), as ``SparkModel.save`` stores them."""
        config = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        config["optimizer"] = O.serialize(self.optimizer)
        return config

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Settings:
        """The settings a :meth:`to_config` dict holds; keys of other versions are ignored."""
        return cls.of(config)



#: Arguments of ``keras.Model.fit``, ``evaluate`` and ``predict`` that elephant refuses for now,
#: and what to do instead.
UNSUPPORTED_ARGUMENTS = {
    "fit": {
        "steps_per_epoch": "every epoch is one pass over each worker's partition; pass fewer samples, or more epochs",
        "validation_steps": "validation runs on the whole validation set; pass a smaller one",
    },
    "evaluate": {
        "steps": "every sample is evaluated; pass fewer samples",
    },
    "predict": {
        "steps": "every sample is predicted; pass fewer samples",
    },
}


def refuse_unsupported(method: str, **given: Any) -> None:
    """Refuse an argument of :data:`UNSUPPORTED_ARGUMENTS` that was given (not None)."""
    for name, value in given.items():
        if value is not None:
            raise ConfigError(f"`{name}` is not supported by SparkModel.{method}: {UNSUPPORTED_ARGUMENTS[method][name]}; "
                              f"received {name} of type {type(value).__name__}")


def check_verbose(verbose: Any) -> Any:
    if verbose not in ("auto", 0, 1, 2, True, False):
        raise ConfigError(f"`verbose` must be 'auto', 0, 1 or 2; received verbose={verbose!r}")
    return verbose


def check_validation_freq(freq: Any) -> int | tuple[int, ...]:
    """Keras' ``validation_freq``: a positive int, or a list of 1-based epoch numbers."""
    if _is_int(freq) and freq > 0:
        return int(freq)
    if isinstance(freq, (list, tuple, set)) and all(_is_int(e) and e > 0 for e in freq):
        return tuple(sorted(int(e) for e in freq))
    raise ConfigError("`validation_freq` must be a positive int or a list of epoch numbers (from 1); "
                      f"received validation_freq={freq!r}")


@dataclasses.dataclass(frozen=True, eq=False)
class FitArgs(_Fields):
    """The arguments of one ``SparkModel.fit`` call besides the data: Keras' own, and the column names.

    ``batch_size`` None is Keras' 32, and ``validation_batch_size`` None is
    ``batch_size``. Sample and class weights are checked against the data
    where the data are (:mod:`elephant.fit.loop`).

    Raises:
        ConfigError: an argument out of range; DataError: ``validation_data``
            that is not a tuple.
    """

    batch_size: int | None = None
    epochs: int = 1
    verbose: str | int = "auto"
    callbacks: Sequence[Any] | None = None
    validation_split: float = 0.0
    validation_data: Any = None
    shuffle: bool = True
    class_weight: Any = None
    sample_weight: Any = None
    initial_epoch: int = 0
    validation_batch_size: int | None = None
    validation_freq: int | Sequence[int] = 1
    features_col: str | Sequence[str] = "features"
    label_col: str = "label"
    weight_col: str | None = None
    shuffle_buffer: int | None = None
    cache: Any = None

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen: validated once)
        set_("epochs", check_positive_int("epochs", self.epochs))
        set_("shuffle_buffer", check_positive_int("shuffle_buffer", self.shuffle_buffer, allow_none=True))
        if not (self.cache is None or self.cache is False or type(self.cache).__name__ == "StorageLevel"):
            raise ConfigError("`cache` must be a pyspark StorageLevel, None (the default, "
                              "StorageLevel.MEMORY_AND_DISK) or False (read the data from their source every epoch); "
                              f"received cache={self.cache!r}")
        set_("batch_size", 32 if self.batch_size is None else check_positive_int("batch_size", self.batch_size))
        set_("validation_batch_size", self.batch_size if self.validation_batch_size is None else
             check_positive_int("validation_batch_size", self.validation_batch_size))
        set_("initial_epoch", _check_count("initial_epoch", self.initial_epoch))
        set_("validation_freq", check_validation_freq(self.validation_freq))
        split = self.validation_split
        if isinstance(split, bool) or not isinstance(split, (int, float)) or not 0.0 <= split < 1.0:
            raise ConfigError(f"`validation_split` must be a float in [0, 1); received validation_split={split!r}")
        set_("validation_split", float(split))
        check_verbose(self.verbose)
        if not isinstance(self.shuffle, bool):
            raise ConfigError(f"`shuffle` must be True or False; received shuffle={self.shuffle!r}")
        val = self.validation_data
        if val is not None and not (isinstance(val, (tuple, list)) and len(val) in (2, 3)) \
                and type(val).__name__ not in ("RDD", "PipelinedRDD", "DataFrame"):
            raise DataError("`validation_data` must be a tuple (x_val, y_val[, sample_weight]), an RDD or a DataFrame; "
                            f"received {type(val).__name__}")
        if self.callbacks is not None and not isinstance(self.callbacks, (list, tuple)):
            raise ConfigError("`callbacks` must be a list of keras.callbacks.Callback; "
                              f"received {type(self.callbacks).__name__}")

