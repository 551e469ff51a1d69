"""Distributed optimizers: pure worker and server rules, a registry and ``get()``.

Importing this package pulls in numpy only (no Spark, Flask or TensorFlow).

=================  ====================  ====================================  ======
class              ``get()`` name        modes                                 window
=================  ====================  ====================================  ======
Downpour           ``"downpour"``        asynchronous, hogwild                 1
AGN                ``"agn"``             asynchronous, hogwild                 12
ADAG               ``"adag"``            asynchronous                          12
DynSGD             ``"dynsgd"``          asynchronous, hogwild                 5
EASGD              ``"easgd"``           synchronous                           32
AEASGD             ``"aeasgd"``          asynchronous, hogwild                 32
EAMSGD             ``"eamsgd"``          asynchronous, hogwild                 32
ModelAveraging     ``"modelaveraging"``  synchronous                           8
DCASGD             ``"dcasgd"``          asynchronous                          1
DelayedNesterov    ``"delayednesterov"`` asynchronous                          pass
Compressed         ``"compressed"``      asynchronous                          pass
=================  ====================  ====================================  ======

"pass" is one commit per partition pass (``frequency="epoch"``).
:class:`Compressed` is a rule transform: it wraps another rule (default
``"delayednesterov"``, whose modes and window the row gives) and sends its
commits encoded in ``int8`` or ``bf16`` with error feedback
(:mod:`elephant.optimizers.codecs`); the modes and window are the inner rule's.
"""

from elephant.optimizers.base import Commit, DistributedOptimizer, Reply, worker_batch_size
from elephant.optimizers.helpers import check_number, staleness, tree_map
from elephant.optimizers.registry import deserialize, get, register, registered_names, serialize
from elephant.protocol import MODES
from elephant.optimizers.downpour import Downpour
from elephant.optimizers.agn import ADAG_DISTKERAS, AGN
from elephant.optimizers.adag import ADAG
from elephant.optimizers.dynsgd import DynSGD
from elephant.optimizers.easgd import AEASGD, EAMSGD, EASGD
from elephant.optimizers.averaging import ModelAveraging
from elephant.optimizers.dcasgd import DCASGD
from elephant.optimizers.delayed_nesterov import DelayedNesterov
from elephant.optimizers.compress import Compressed
from elephant.optimizers.simulate import ScheduleError, simulate
from elephant.optimizers.trace import Trace

__all__ = [
    "MODES",
    "Commit",
    "DistributedOptimizer",
    "Reply",
    "check_number",
    "deserialize",
    "get",
    "register",
    "registered_names",
    "serialize",
    "staleness",
    "tree_map",
    "Downpour",
    "AGN",
    "ADAG_DISTKERAS",
    "ADAG",
    "DynSGD",
    "EASGD",
    "AEASGD",
    "EAMSGD",
    "ModelAveraging",
    "DCASGD",
    "DelayedNesterov",
    "Compressed",
    "worker_batch_size",
    "simulate",
    "simulate_fit",
    "FitTrace",
    "Trace",
    "ScheduleError",
]


def _import_rule_modules() -> None:
    """Import every other module of this package, so a rule in a new file registers itself.

    Adding an algorithm is one file here (its ``@register`` runs on import) plus
    one row in the conformance table; no edit to this file is needed.
    """
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


_import_rule_modules()


def __getattr__(name: str):
    """``simulate_fit`` and ``FitTrace`` live in :mod:`elephant.fit.simulated` (they need Keras); imported on first use."""
    if name in ("simulate_fit", "FitTrace"):
        from elephant.fit import simulated

        return getattr(simulated, name)
    raise AttributeError(f"module 'elephant.optimizers' has no attribute {name!r}")
