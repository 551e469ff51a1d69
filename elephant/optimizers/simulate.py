"""Run a distributed optimizer against a scripted schedule, in one process.

:func:`simulate` plays the parts of the runtime -- the workers' loop and the
parameter server's store -- around the *same* rule methods the real runtime
calls (``worker_init``, ``make_commit``, ``on_reply``, ``server_init``,
``on_pull``, ``apply``, ``apply_round``), with numpy gradient functions instead
of Keras models. It is deterministic: the schedule is the interleaving. Tests
use it to check rules against exact numbers; researchers use it to see how a
rule behaves under a given pattern of delays before touching a cluster.

A schedule is a list of events, each a tuple:

* ``("pull", k)``: worker ``k`` pulls the center and starts a partition
  (``worker_init``); the server runs ``on_pull``. A later pull restarts it.
* ``("step", k)`` or ``("step", k, n)``: ``n`` local steps (default 1) with the
  local optimizer (plain SGD with ``local_lr`` unless ``local_step`` is given).
* ``("commit", k)``: worker ``k`` sends ``make_commit(...)`` for the steps since
  its last pull or reply. Asynchronous modes apply it at once and reply;
  synchronous mode holds it until every active worker has committed, then
  applies the round and replies to all of them.
* ``("finish", k)``: worker ``k`` leaves (end of its partition): it no longer
  holds back a synchronous round or the SSP minimum. Uncommitted steps are an
  error (the runtime flushes a partial window with a commit; script it).

Blocking: a worker that committed in synchronous mode waits for the round, and
with ``optimizer.staleness_bound = s`` (Stale Synchronous Parallel, asynchronous
modes) a worker may start a window only while its commit count is at most ``s``
ahead of the slowest active worker (finished workers do not count). As on the
parameter server, admission is checked at a pull and right after a commit: a
commit is applied at once, but a worker that is too far ahead gets its reply
only when it resumes (its next event), with the center current at that moment,
and the server rule sees that as a pull (``on_pull``). An event of a blocked
worker raises :class:`ScheduleError` (``on_blocked="raise"``, the default, to
test admission) or waits with all of that worker's later events until the
worker is released (``on_blocked="defer"``, like a real blocked worker); every
wait is recorded in ``Trace.blocked``.

Example -- DynSGD with 16 workers, where worker ``k`` needs ``1 + k/4`` time
units per step, on a quadratic pulled towards 3::

    import numpy as np
    from elephant.optimizers import DynSGD, simulate
    from elephant.optimizers.schedules import timed
    from elephant.optimizers.simulate import quadratic

    schedule = timed([1 + k / 4 for k in range(16)], window=5, num_steps=40)
    trace = simulate(DynSGD(window=5), [np.zeros(2)], quadratic(3.0), schedule,
                     num_workers=16, local_lr=0.05)
    trace.center               # [array([2.9776, 2.9776])]: close to 3
    max(trace.staleness)       # 30: the slowest worker's deltas arrive 30 commits late
    [c[0][0] for c in trace.centers]   # the center after each of the 128 commits
    # the same run with Downpour() ends near -6: undamped stale deltas overshoot

This module checks the arguments and the schedule's events and plays them, deferring
blocked ones; the simulator's state and the rules it plays are in
:mod:`~elephant.optimizers.simulation`, the :class:`~elephant.optimizers.trace.Trace`
it returns in :mod:`~elephant.optimizers.trace`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Sequence
from typing import Any

import numpy as np

from elephant.errors import ConfigError, ScheduleError
from elephant.optimizers.base import DistributedOptimizer, check_overlap
from elephant.optimizers.simulation import Simulation
from elephant.optimizers.steps import GradFn, LocalStep, nesterov, quadratic, sgd
from elephant.optimizers.trace import Blocked, Trace
from elephant.protocol import MODES

__all__ = [
    "simulate",
    "ScheduleError",
    "sgd",
    "nesterov",
    "quadratic",
]

KINDS = ("pull", "step", "commit", "finish")


def _parse(index: int, event: Any, num_workers: int) -> tuple[str, int, int]:
    where = f"event {index} {event!r}"
    if not isinstance(event, (tuple, list)) or not event:
        raise ScheduleError(f"{where}: expected a tuple such as ('step', 0)")
    kind = event[0]
    if kind not in KINDS:
        raise ScheduleError(f"{where}: unknown kind {kind!r}; expected one of {KINDS}")
    if len(event) < 2 or len(event) > (3 if kind == "step" else 2):
        raise ScheduleError(f"{where}: expected ({kind!r}, worker)" + (" or ('step', worker, count)" if kind == "step" else ""))
    k = event[1]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < num_workers:
        raise ScheduleError(f"{where}: worker must be an int in [0, {num_workers}); received {k!r}")
    count = event[2] if len(event) == 3 else 1
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise ScheduleError(f"{where}: step count must be a positive int; received {count!r}")
    return kind, int(k), int(count)


def simulate(
    optimizer: DistributedOptimizer,
    init: Sequence[Any],
    grad_fns: GradFn | Sequence[GradFn],
    schedule: Sequence[tuple],
    *,
    mode: str | None = None,
    num_workers: int | None = None,
    local_lr: float = 0.1,
    local_step: LocalStep | None = None,
    num_samples: int | Sequence[int] = 1,
    on_blocked: str = "raise",
    overlap: bool = False,
    keep_centers: Container[int] | None = None,
) -> Trace:
    """Play ``schedule`` through ``optimizer``'s worker and server rules; return the trace.

    Args:
        optimizer: the distributed optimizer (an instance; use ``get()`` for names).
        init: the initial center, a list of arrays (copied; dtypes are kept).
        grad_fns: one gradient function ``f(weights) -> list of arrays`` shared by
            all workers, or one per worker (their number is then ``num_workers``).
        schedule: the events (see the module docstring).
        mode: ``"synchronous"``, ``"asynchronous"`` or ``"hogwild"`` (played as
            asynchronous: a single thread cannot tear updates). Default: the
            optimizer's first supported mode.
        num_workers: workers passed to ``server_init``. Default: ``len(grad_fns)``
            for a list, else one more than the largest worker index in the schedule.
        local_lr: learning rate of the default local step, plain SGD. Default 0.1.
        local_step: replaces plain SGD: ``f(weights, grad_fn, slots) -> (weights, slots)``,
            ``slots`` being that worker's local-optimizer state (None at first); see
            :func:`sgd` and :func:`nesterov`.
        num_samples: samples per local step (the batch size), one int or one per
            worker; commits report ``steps × num_samples``. Default 1.
        on_blocked: ``"raise"`` (default) or ``"defer"``; see the module docstring.
        overlap: play ``SparkModel(overlap=True)``: a commit is applied at once
            (synchronous: when its round closes; the worker takes local steps
            meanwhile, but commits or finishes only after the round closed), and
            its reply is merged into the worker only after the worker's next
            local step (or before its next commit, finish or pull), as the rule's
            answer for the sent weights plus the progress made since. Default False.
        keep_centers: the indices of ``Trace.centers`` whose copy is kept (None,
            the default: all). The others are None, so that a long simulation of
            a large model does not hold a copy of it per commit.

    Returns:
        The :class:`Trace`.

    Raises:
        ConfigError: an argument is invalid or ``mode`` is not supported by ``optimizer``.
        ScheduleError: an event is malformed or impossible, a blocked event came up
            with ``on_blocked="raise"``, or deferred events never got released.
        DataError: the rule changed the structure or a dtype of the weights.
    """
    if not isinstance(optimizer, DistributedOptimizer):
        raise ConfigError(f"`optimizer` must be a DistributedOptimizer instance; received optimizer={optimizer!r}")
    mode = optimizer.modes[0] if mode is None else mode
    if mode not in MODES or mode not in optimizer.modes:
        raise ConfigError(f"`mode` must be one of {optimizer.modes} for {type(optimizer).__name__}; received mode={mode!r}")
    if on_blocked not in ("raise", "defer"):
        raise ConfigError(f"`on_blocked` must be 'raise' or 'defer'; received on_blocked={on_blocked!r}")
    if not isinstance(init, (list, tuple)) or not init:
        raise ConfigError(f"`init` must be a non-empty list of arrays; received init={init!r}")
    init = [np.array(x) for x in init]
    schedule = list(schedule)
    if callable(grad_fns):
        if num_workers is None:
            workers = [e[1] for e in schedule if isinstance(e, (tuple, list)) and len(e) > 1 and isinstance(e[1], int)]
            num_workers = max(workers, default=0) + 1
        grad_fns = [grad_fns] * num_workers
    else:
        grad_fns = list(grad_fns)
        if num_workers is not None and num_workers != len(grad_fns):
            raise ConfigError(f"`num_workers`={num_workers} but {len(grad_fns)} grad_fns were given")
        num_workers = len(grad_fns)
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ConfigError(f"`num_workers` must be a positive int; received num_workers={num_workers!r}")
    samples = [num_samples] * num_workers if isinstance(num_samples, (int, np.integer)) else list(num_samples)
    if len(samples) != num_workers or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0 for s in samples):
        raise ConfigError(
            f"`num_samples` must be an int >= 0 or one per worker ({num_workers}); received num_samples={num_samples!r}"
        )
    check_overlap(overlap, optimizer, mode)
    step = sgd(local_lr) if local_step is None else local_step
    sim = Simulation(optimizer, init, grad_fns, num_workers, mode, step, [int(s) for s in samples], overlap,
                     keep_centers)

    deferred: dict[int, deque] = {k: deque() for k in range(num_workers)}
    blocked: list[Blocked] = []
    reported: set[int] = set()

    def attempt(index, event, kind, k, count) -> bool:
        """Run the event, or report it blocked (once per event) and return False."""
        reason = sim.blocked(kind, k)
        if reason is None:
            sim.run(index, kind, k, count)
            return True
        if on_blocked == "raise":
            raise ScheduleError(f"event {index} {tuple(event)!r} is blocked: {reason}")
        if index not in reported:
            reported.add(index)
            blocked.append(Blocked(index, tuple(event), reason))
        return False

    for index, event in enumerate(schedule):
        kind, k, count = _parse(index, event, num_workers)
        if deferred[k] or not attempt(index, event, kind, k, count):
            deferred[k].append((index, event, kind, k, count))  # waits behind the worker's blocked event
            continue
        progress = True
        while progress:  # release waiting workers, oldest events first, in worker order
            progress = False
            for queue in deferred.values():
                while queue and attempt(*queue[0]):
                    queue.popleft()
                    progress = True
    stuck = {k: q[0] for k, q in deferred.items() if q}
    if stuck:
        reasons = "; ".join(f"event {e[0]} {tuple(e[1])!r}: {sim.blocked(e[2], e[3])}" for e in stuck.values())
        raise ScheduleError(f"the schedule ended with blocked workers {sorted(stuck)}: {reasons}")
    if sim.round:
        missing = sorted(k for k, v in sim.workers.items() if v.active and k not in sim.round)
        raise ScheduleError(
            f"the schedule ended inside synchronous round {sim.clock + 1}: workers {sorted(sim.round)} committed, "
            f"workers {missing} neither committed nor finished"
        )
    return Trace(
        centers=sim.centers,
        clocks=sim.clocks,
        applied=sim.applied,
        center=sim.center,
        clock=sim.clock,
        server_state=sim.server_state,
        workers=sim.workers,
        blocked=blocked,
    )
