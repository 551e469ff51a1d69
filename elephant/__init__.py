"""elephant: data-parallel training of Keras 3 models on Apache Spark.

Public names are loaded lazily, so ``import elephant.optimizers`` pulls in
neither Spark nor TensorFlow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from elephant.errors import ConfigError, DataError, ElephantError, FitError, PSError, ProtocolError

__version__ = "0.1.0"

__all__ = [
    "SparkModel",
    "load",
    "optimizers",
    "search",
    "ensemble",
    "ElephantError",
    "ConfigError",
    "DataError",
    "PSError",
    "ProtocolError",
    "FitError",
    "__version__",
]

_LAZY = {
    "SparkModel": ("elephant.spark_model", "SparkModel"),
    "load": ("elephant.spark_model", "load"),
    "optimizers": ("elephant.optimizers", None),
    "search": ("elephant.search", None),
    "ensemble": ("elephant.ensemble", None),
}

if TYPE_CHECKING:  # pragma: no cover
    from elephant import ensemble, optimizers, search
    from elephant.spark_model import SparkModel, load


def __getattr__(name: str):
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'elephant' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
