"""Fault injection for the reliability tests: ``ELEPHANT_FAULT`` on the driver, read by each task's pass.

The tests set ``ELEPHANT_FAULT`` before a fit (:mod:`elephant.fit.loop` puts it
into ``TaskSpec.fault``), and the worker calls :func:`inject_fault` after every
local step; a fit without it never reads this module's faults.
"""

from __future__ import annotations

import os
import time

__all__ = ["WAIT_S", "inject_fault"]


#: The longest a ``kind=wait`` fault holds its task.
WAIT_S = 120.0


def inject_fault(fault: str, partition: int, step: int, epoch: int = 0) -> None:
    """Fault injection for reliability tests.

    ``fault`` is ``"partition=P,step=S,kind=raise|exit|wait,marker=PATH"``: the first
    time partition ``P`` reaches local step ``S`` (of epoch ``E`` with ``epoch=E``;
    of any epoch without) the task fails (``wait``: stops
    there until the file ``release=PATH`` exists, or for ``WAIT_S`` at most, as a
    task on a stalled executor would). The marker file makes the fault fire once
    per fit even though Spark's attempt numbers reset.
    """
    fields = dict(item.split("=", 1) for item in fault.split(",") if "=" in item)
    if int(fields.get("partition", -1)) != partition or int(fields.get("step", -1)) != step:
        return
    if int(fields.get("epoch", epoch)) != epoch:
        return
    marker = fields.get("marker")
    if marker:
        try:
            with open(marker, "x"):
                pass
        except FileExistsError:
            return
    kind = fields.get("kind", "raise")
    if kind == "exit":
        os._exit(13)
    if kind == "wait":
        deadline = time.monotonic() + WAIT_S
        while not os.path.exists(fields.get("release", "")) and time.monotonic() < deadline:
            time.sleep(0.05)
        return
    raise RuntimeError(f"injected fault in partition {partition} at step {step}")
