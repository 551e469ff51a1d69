"""Schedule builders for :func:`elephant.optimizers.simulate`.

A schedule is a plain list of events (``("pull", k)``, ``("step", k)``,
``("commit", k)``, ``("finish", k)``); these helpers write common ones.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from elephant.errors import ConfigError
from elephant.optimizers.helpers import check_number

__all__ = ["round_robin", "timed"]


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"`{name}` must be a positive int; received {name}={value!r}")
    return value


def round_robin(num_workers: int, window: int, rounds: int) -> list[tuple]:
    """Every worker pulls; then, ``rounds`` times, each worker in turn trains ``window``
    steps and commits; then every worker finishes.

    In asynchronous mode every commit after the first round is ``num_workers − 1``
    commits stale; in synchronous mode each turn of the loop is one round.
    """
    n, window, rounds = (_positive_int(a, v) for a, v in (("num_workers", num_workers), ("window", window), ("rounds", rounds)))
    events: list[tuple] = [("pull", k) for k in range(n)]
    for _ in range(rounds):
        for k in range(n):
            events += [("step", k, window), ("commit", k)]
    return events + [("finish", k) for k in range(n)]


def timed(step_times: Sequence[float], window: int, num_steps: int | Sequence[int],
          warmup: tuple[int, int] | None = None) -> list[tuple]:
    """Events of workers that train at different speeds, in time order.

    Worker ``k`` pulls at time 0, finishes local step ``i`` at ``i · step_times[k]``,
    commits right after every ``window``-th step and after its last step (a
    flushed partial window), then finishes. Ties go to the lower worker index.

    Args:
        step_times: time per local step, one positive number per worker.
        window: local steps per commit.
        num_steps: local steps per worker (one int for all, or one per worker).
        warmup: ``(window, steps)``: windows of that many steps through a pass's first
            ``steps`` steps (as a task commits while its rate ramps up: ``TaskSpec.warmup_window``),
            counted on from there.

    Use ``on_blocked="defer"`` when simulating synchronous mode or SSP with it:
    fast workers then wait as they would on a cluster.
    """
    times = [check_number(f"step_times[{k}]", t, low=0.0, low_open=True) for k, t in enumerate(step_times)]
    window = _positive_int("window", window)
    first, first_steps = window, 0
    if warmup is not None:
        if not isinstance(warmup, tuple) or len(warmup) != 2:
            raise ConfigError(f"`warmup` must be a (window, steps) pair of positive ints; received warmup={warmup!r}")
        first, first_steps = _positive_int("warmup[0]", warmup[0]), _positive_int("warmup[1]", warmup[1])
    steps = [num_steps] * len(times) if isinstance(num_steps, int) else list(num_steps)
    if len(steps) != len(times):
        raise ConfigError(f"`num_steps` must be an int or one per worker ({len(times)}); received num_steps={num_steps!r}")
    steps = [_positive_int(f"num_steps[{k}]", s) for k, s in enumerate(steps)]
    heap: list[tuple[float, int, int, tuple]] = []
    for k, (dt, m) in enumerate(zip(times, steps, strict=True)):
        heap.append((0.0, k, 0, ("pull", k)))
        since = 0
        for i in range(1, m + 1):
            heap.append((i * dt, k, 2 * i - 1, ("step", k)))
            since += 1
            if since >= (first if i <= first_steps else window) or i == m:
                heap.append((i * dt, k, 2 * i, ("commit", k)))
                since = 0
        heap.append((m * dt, k, 2 * m + 1, ("finish", k)))
    heapq.heapify(heap)
    return [heapq.heappop(heap)[3] for _ in range(len(heap))]
