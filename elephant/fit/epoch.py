"""One epoch's Spark job as a transaction, and the text of a failed job.

:func:`run_epoch` runs one try of an epoch through a job function and, when
it fails, returns the store to the epoch's start and trains the epoch again
where that can help. Only text reliably crosses from a Spark task to the
driver, so :func:`spark_failure_cause` reads the task's own error out of the
job failure, and :func:`epoch_failure` turns it into one ``FitError`` that says
which epoch failed, why, and what the model holds now.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from elephant.config import Settings
from elephant.errors import DataError, ElephantError, FitError

log = logging.getLogger(__name__)

__all__ = ["collect_checked", "epoch_failure", "raise_task_data_error", "run_epoch", "spark_failure_cause"]

_CAUSE = re.compile(r"^((?:\w+\.)*(\w+(?:Error|Exception|Interrupt))): (.+)$", re.MULTILINE)


def spark_failure_cause(exc: BaseException) -> str:
    """The innermost ``SomeError: message`` line of a Spark job failure (the task's own error), else its first line.

    The error is named by its class alone (``elephant.errors.DataError`` -> ``DataError``).
    """
    text = str(exc)
    causes = [m for m in _CAUSE.finditer(text) if not m.group(2).startswith(("Py4J", "Spark", "Task", "Python"))]
    if causes:
        return f"{causes[-1].group(2)}: {causes[-1].group(3).strip()[:500]}"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return f"{type(exc).__name__}: {first[:500]}"


def raise_task_data_error(exc: BaseException) -> None:
    """Raise a ``DataError`` that a task of a failed Spark job raised again as itself; else return."""
    cause = spark_failure_cause(exc)
    if cause.startswith("DataError: "):
        raise DataError(cause[len("DataError: "):]) from exc


def collect_checked(collect: Callable[[], list]) -> list:
    """``collect()``, with a ``DataError`` raised in a task raised again on the driver as itself."""
    try:
        return collect()
    except Exception as exc:  # Py4JJavaError / PythonException carry the task's traceback as text
        raise_task_data_error(exc)
        raise


def epoch_failure(exc: BaseException, epoch: int, epochs: int, tries: int = 1, undone: int | None = None,
                  kept: bool = False) -> FitError:
    """One clear error for a failed epoch job: which epoch, the task's error, the tries, what ``sm.model`` holds."""
    after = f" {tries} times" if tries > 1 else ""
    if kept:
        state = ("on_failure='keep': sm.model holds the center with the failed epoch's partial progress; "
                 f"fit again to go on (initial_epoch={epoch + 1} counts the failed epoch as done)")
    else:
        held = f"the weights after epoch {epoch}" if epoch else "the weights it had before the fit"
        rolled = (f"the epoch was rolled back ({undone} commits undone; the center and the rule's state are as at "
                  "its start) and " if undone is not None else "")
        state = (f"The fit stopped: {rolled}sm.model holds {held}; fit again to go on "
                 f"(initial_epoch={epoch} keeps Keras' epoch numbers)")
    return FitError(f"epoch {epoch + 1} of {epochs} failed in Spark{after}: {spark_failure_cause(exc)}. {state}")


#: Task errors that training the epoch again cannot fix.
_NOT_RETRIED = ("DataError", "ConfigError", "FitError", "ProtocolError")


def run_epoch(store, job: Callable[[Any, str], list[dict[str, Any]]], spec, *, epochs: int, barrier: bool,
              settings: Settings, model, interrupted: threading.Event | None = None,
              snapshot: Any = None) -> list[dict[str, Any]]:
    """One epoch's Spark job, ``job(spec, description)``, as a transaction; returns the partitions' stats.

    If the job fails, the store returns to the epoch's start (center, rule
    state, bookkeeping) under a new run id that fences out the failed try's
    tasks, and a barrier epoch is trained again, up to
    ``settings.epoch_retries`` times: Spark retries failed tasks of an ordinary
    stage itself, but never a barrier stage. With ``settings.on_failure ==
    "keep"`` nothing is rolled back or retried: ``model`` takes the partial center. ``snapshot``: the store's
    state at the epoch's start, where the epoch was opened before this call (None: taken here).

    Raises:
        FitError: the epoch failed for good (the last Spark error is its cause).
        KeyboardInterrupt: Ctrl-C cancelled the job (``interrupted`` is set); nothing
            is rolled back, as for an interrupt anywhere else in the fit.
    """
    snapshot = store.snapshot() if snapshot is None else snapshot
    tries = 0
    while True:
        try:
            text = f"elephant fit {spec.run}: epoch {spec.epoch + 1} of {epochs}" + (f", try {tries + 1}" if tries else "")
            return job(spec, text)
        except ElephantError:
            raise
        except Exception as exc:  # a Spark job failure (Py4JJavaError, PythonException, ...)
            if interrupted is not None and interrupted.is_set():  # Ctrl-C cancelled the job
                raise KeyboardInterrupt() from None
            tries += 1
            if settings.on_failure == "keep":
                model.set_weights(store.center())
                raise epoch_failure(exc, spec.epoch, epochs, tries, kept=True) from exc
            cause = spark_failure_cause(exc)
            undone = store.rollback(snapshot, f"{spec.run}.e{spec.epoch}t{tries}")
            if not barrier or tries > settings.epoch_retries or cause.split(":", 1)[0] in _NOT_RETRIED:
                raise epoch_failure(exc, spec.epoch, epochs, tries, undone) from exc
            log.warning("epoch %d: the %s job failed (%s); %d commits rolled back, training the epoch again "
                        "(retry %d of %d)", spec.epoch + 1, "synchronous" if spec.mode == "synchronous" else "barrier",
                        cause, undone, tries, settings.epoch_retries)
            spec = dataclasses.replace(spec, ps_run=store.run)
