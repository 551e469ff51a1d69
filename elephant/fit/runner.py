"""What the epochs of a fit need of the Spark side: :class:`SparkSide`.

Two classes implement it: :class:`~elephant.fit.classic.ClassicRun` (a classic
session, the server on the driver or in the tasks) and
:class:`~elephant.fit.connect.HostedRun` (a Spark Connect client, the server in
the tasks). :func:`~elephant.fit.loop.run_fit` makes one and drives it; nothing
else reaches past this interface.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["SparkSide"]


class SparkSide(Protocol):
    """The Spark side of one fit, made with its data checked (and cached where it stays in Spark).

    Attributes:
        num_workers: the workers (tasks) of each epoch.
        samples: the training samples, counted when the side was made.
        partition_samples: each partition's training samples, in partition order.
        row_bytes: the bytes of one training sample (its features, labels and weights).
        val: validation data split off the input (``validation_split``), or None.
        hosted: whether the epoch's tasks serve the parameter server (else the driver does).
        devices: the devices the tasks ask for, for the fit's first log line.
    """

    num_workers: int
    samples: int
    partition_samples: tuple[int, ...]
    row_bytes: float
    val: Any
    hosted: bool
    devices: str

    def barrier(self, mode: str) -> bool:
        """Whether an epoch in ``mode`` runs as one barrier stage."""

    def check_slots(self) -> None:
        """Refuse a fit whose workers cannot all run when its mode needs them at once."""

    def check_devices(self, backend: str) -> None:
        """Refuse a GPU request that cannot work with ``backend``."""

    def head_rows(self, key: str | None, epoch: int, steps: int, batch_size: int,
                  buffer: int | None = None) -> list[tuple]:
        """Each partition's rows of the driver's head, in partition order (:mod:`elephant.fit.head`), shuffled
        through a buffer of ``buffer`` samples (None: each partition whole)."""

    def open(self, store, token: str, job_group: str, model_bytes: bytes) -> tuple[Any, tuple[str, ...]]:
        """Start serving ``store``: ``(what the tasks get as the model, the servers' urls in shard order)``."""

    def one_job(self, buffer: int | None, spark_validation: bool = False) -> bool:
        """Whether the fit's epochs run as one Spark job (decided after :meth:`open`, logged): tasks whose shuffle
        buffers hold ``buffer`` samples, ``spark_validation`` whether a Spark job validates each epoch."""

    def job(self, store, barrier: bool) -> Callable[[Any, str], list[dict[str, Any]]]:
        """One try of an epoch: ``job(spec, description)`` runs the epoch's Spark job and returns its stats."""

    def guard(self) -> contextlib.AbstractContextManager[Any]:
        """A block inside which Ctrl-C cancels the fit's Spark work."""

    def cancel(self) -> None:
        """Stop the fit's running Spark work."""

    def close(self) -> None:
        """Release what the side holds (servers, broadcasts, cached data), also after a failure."""
