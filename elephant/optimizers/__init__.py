"""Distributed optimizers: pure worker and server rules, a registry and ``get()``.

Importing this package pulls in numpy only (no Spark, Flask or TensorFlow).
"""

from elephant.optimizers.base import (
    MODES,
    Commit,
    DistributedOptimizer,
    Reply,
    deserialize,
    get,
    register,
    registered_names,
    serialize,
)
from elephant.optimizers.downpour import Downpour
from elephant.optimizers.averaging import ModelAveraging

__all__ = [
    "MODES",
    "Commit",
    "DistributedOptimizer",
    "Reply",
    "deserialize",
    "get",
    "register",
    "registered_names",
    "serialize",
    "Downpour",
    "ModelAveraging",
]
