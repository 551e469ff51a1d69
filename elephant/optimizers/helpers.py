"""What the rules share besides their base class: checks of hyper-parameters, array helpers, docs pointers.

:func:`check_number` validates a real hyper-parameter; :func:`tree_map` applies a
function array by array over weight lists; :func:`staleness` is a commit's
``τ = clock − base_clock``; :func:`see_docs` writes the pointer a fit-start warning
ends with, to the sections named here. The base class is in
:mod:`~elephant.optimizers.base`, the registry and ``get()`` in
:mod:`~elephant.optimizers.registry`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from elephant.errors import ConfigError, DataError
from elephant.protocol import Commit

#: A model's weights, or anything shaped like them: a list of numpy arrays.
Weights = list[np.ndarray]

__all__ = [
    "AVERAGING_SECTION",
    "CONVERGENCE_DOCS",
    "NAMED_RULES_SECTION",
    "Weights",
    "check_number",
    "see_docs",
    "staleness",
    "tree_map",
]

#: The page that holds the figures behind the rules' fit-start warnings, and the sections they point to.
CONVERGENCE_DOCS = "docs/convergence.md"
AVERAGING_SECTION = "Why averaging falls behind, and the two fixes in the defaults"
NAMED_RULES_SECTION = "Named rules at their default window"


def see_docs(section: str, page: str = CONVERGENCE_DOCS) -> str:
    """The pointer a fit-start warning ends with: the docs section that holds its figures."""
    return f'(see {page}, "{section}")'


def check_number(name: str, value: Any, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False) -> float:
    """Validate a real hyper-parameter and return it as a float.

    Args:
        name: the argument's name, used in the message.
        value: the received value.
        low, high: optional bounds; ``low_open``/``high_open`` make them strict.

    Raises:
        ConfigError: ``value`` is not a finite real number inside the bounds. The
            message names the argument, the expected range and the received value.
    """
    lo = "" if low is None else ("(" if low_open else "[") + f"{low:g}"
    hi = "" if high is None else f"{high:g}" + (")" if high_open else "]")
    expected = f"a real number in {lo or '(-inf'}, {hi or 'inf)'}" if (lo or hi) else "a finite real number"
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    number = float(value) if ok else float("nan")
    ok = ok and bool(np.isfinite(number))
    if ok and low is not None:
        ok = number > low if low_open else number >= low
    if ok and high is not None:
        ok = number < high if high_open else number <= high
    if not ok:
        raise ConfigError(f"`{name}` must be {expected}; received {name}={value!r}")
    return number


def tree_map(fn: Any, first: Weights, *rest: Weights) -> Weights:
    """Apply ``fn`` array by array over weight lists, keeping the dtypes of ``first``.

    ``fn`` receives one array from each list (in the order given) and its result is
    cast back to the dtype of the array from ``first``, so a rule written with
    Python floats (``lambda c, d: c + 0.5 * d``) keeps float32 models float32.
    """
    return [np.asarray(fn(x, *ys)).astype(x.dtype, copy=False) for x, *ys in zip(first, *rest, strict=True)]


def staleness(clock: int, commit: Commit) -> int:
    """Commits applied since the window of ``commit`` started: ``τ = clock − base_clock``.

    Raises:
        DataError: ``commit.base_clock`` is ahead of the server clock (a commit
            cannot start from a center the server has not produced yet).
    """
    tau = int(clock) - int(commit.base_clock)
    if tau < 0:
        raise DataError(
            f"commit base_clock={commit.base_clock} is ahead of the server clock {clock}; "
            "the worker must start from a center this server produced"
        )
    return tau
