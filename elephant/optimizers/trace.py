"""What :func:`~elephant.optimizers.simulate` returns: the trace of a run and the records it holds.

:class:`Trace` holds the centers and clocks after every commit or round, every
commit as applied (:class:`Applied`), the events that waited (:class:`Blocked`)
and each worker as it stands at the end (:class:`WorkerView`). The simulator
itself is in :mod:`~elephant.optimizers.simulation`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from elephant.optimizers.helpers import Weights

__all__ = ["Applied", "Blocked", "Trace", "WorkerView"]


@dataclasses.dataclass
class WorkerView:
    """One simulated worker, as it stands (in :attr:`Trace.workers` at the end).

    Attributes:
        weights: its local weights (None before its first pull).
        state: its worker-rule state.
        slots: its local optimizer's state (e.g. a Nesterov velocity); kept across pulls.
        pulled: the center it last received.
        base_clock: the server clock of ``pulled``.
        commits: commits it made (its SSP clock).
        steps: local steps not committed yet; ``samples`` likewise.
        active: pulled and not finished.
        held_reply: ``(reply_tensors,)`` while SSP holds back the reply to its last
            commit, else None.
        inflight: with ``overlap``, ``(reply, weights at send)`` of the commit whose
            reply has not been merged yet, else None.
    """

    weights: Weights | None = None
    state: Any = None
    slots: Any = None
    pulled: Weights | None = None
    base_clock: int = 0
    commits: int = 0
    steps: int = 0
    samples: int = 0
    active: bool = False
    held_reply: tuple | None = None
    inflight: tuple | None = None


@dataclasses.dataclass(frozen=True)
class Applied:
    """One commit as the server applied it: ``staleness = clock − base_clock``."""

    worker: int
    clock: int
    base_clock: int
    staleness: int
    num_steps: int
    num_samples: int


@dataclasses.dataclass(frozen=True)
class Blocked:
    """An event that had to wait (``on_blocked="defer"``): its index in the schedule and why."""

    index: int
    event: tuple
    reason: str


@dataclasses.dataclass
class Trace:
    """What :func:`simulate` returns.

    Attributes:
        centers: the center after every commit (asynchronous) or round (synchronous);
            None in the places ``keep_centers`` left out.
        clocks: the server clock after each of them.
        applied: every commit in the order applied (one per worker in a round).
        center: the final center; ``clock`` the final server clock.
        server_state: the server rule's final state.
        workers: worker index -> :class:`WorkerView`.
        blocked: the events that waited (SSP admission or a synchronous barrier).
    """

    centers: list[Weights]
    clocks: list[int]
    applied: list[Applied]
    center: Weights
    clock: int
    server_state: Any
    workers: dict[int, WorkerView]
    blocked: list[Blocked]

    @property
    def staleness(self) -> list[int]:
        """The staleness τ of every applied commit, in order."""
        return [a.staleness for a in self.applied]
