"""The partition training loop, run inside a Spark task.

The loop runs Keras' own compiled train step over the partition's stream of
numpy blocks, shuffled through a bounded buffer anew every pass
(:func:`pass_blocks`, :mod:`elephant.stream`) and never merged into one block
beyond the buffer, committing after every ``window`` steps through the
distributed optimizer's worker rule and merging the reply. The last partial
window is flushed, not dropped.

The worker talks to anything with ``pull``/``commit``/``finish`` methods (the
HTTP :class:`~elephant.ps.client.PSClient` or an in-process client), so it never
knows where its parameter server lives.

Training replicas and their weight access are cached per Python worker process
(:mod:`elephant.replicas`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from elephant import data as D
from elephant.backends import stepper
from elephant.errors import DataError
from elephant.faults import inject_fault
from elephant.framework import enter_task
from elephant.optimizers.base import DistributedOptimizer
from elephant.optimizers.local import RAMP_STEPS, LocalMoment, LocalMomentum, inner_optimizer, step_rates
from elephant.protocol import Commit, CommitKey, merge_reply
from elephant.replicas import keep_optimizer_state, limit_threads, training_replica, weighted_metric_keys
from elephant.stream import batches, pass_blocks, skip_rows

log = logging.getLogger(__name__)


__all__ = ["TaskSpec", "run_partition", "train_at_rate"]


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """Everything one training task needs, built from plain values on the driver."""

    run: str
    epoch: int
    model_bytes: Any  # a Spark Broadcast of the .keras archive bytes (or the bytes)
    fingerprint: str
    optimizer: DistributedOptimizer
    window: int | None  # local steps per commit; None = one commit per partition pass
    batch_size: int
    mode: str
    ps_url: str
    token: str
    read_timeout: float
    custom_objects: Mapping[str, Any] | None = None
    shuffle: bool = True
    fault: str | None = None  # test-only fault injection, from ELEPHANT_FAULT on the driver
    structure: str = ""  # fit.loop.replica_structure; "" = a replica of this fit's own
    overlap: bool = False  # keep training while a commit is in flight
    learning_rate: float | None = None  # the driver's compiled rate this epoch (None: a schedule, left alone)
    ps_run: str = ""  # the run id the PS accepts for this epoch's try ("": ``run``); new after a rollback
    backend: str = ""  # the driver's Keras backend, which the task's Keras must run ("": the process's own, unchecked)
    ps_urls: tuple[str, ...] = ()  # every shard's url, in the plan's order (empty: one server, at ``ps_url``)
    shard_plan: dict[str, list] | None = None  # the ShardPlan's as_data() when ``ps_urls`` holds several
    last_epoch: bool = False  # the fit's last: no next epoch to leave the optimizer state for
    shuffle_key: str = ""  # what seeds the partitions' shuffles with the epoch ("": ``run``, new every fit)
    learning_rate_scale: float = 1.0  # the plan's factor on the compiled rate (FitPlan.learning_rate_scale)
    learning_rate_warmup: bool = False  # this pass ramps that factor up from 1 (the fit's first epoch)
    local_moment: LocalMoment | None = None  # the replicas' second-moment decay (FitPlan.local_moment; None: compiled)
    local_momentum: LocalMomentum | None = None  # the replicas' first-moment decay (FitPlan.local_momentum)
    warmup_window: int | None = None  # commit every this many steps in the pass's first RAMP_STEPS (FitPlan's)
    skip_steps: int = 0  # the pass's first batches, which the driver's head trained (elephant.fit.head)
    shuffle_buffer: int | None = None  # samples of each task's shuffle buffer (None: its whole partition)
    partition_samples: tuple[int, ...] = ()  # each partition's rows, counted on the driver (empty: counted here)
    resume_steps: tuple[int, ...] = ()  # each partition's steps of this pass a resumed fit trained before (after the head)

    @property
    def shard_urls(self) -> tuple[str, ...]:
        """The url of every shard of the parameter server (one for an unsharded server)."""
        return self.ps_urls or (self.ps_url,)

    @property
    def commit_run(self) -> str:
        """The run id of this task's commit keys and finish."""
        return self.ps_run or self.run


class _ScaledRate:
    """A learning rate schedule (or a rate callable) times a factor, as a callable Keras calls for the rate."""

    def __init__(self, base, scale: float, iterations):
        self.base, self.scale, self.iterations = base, scale, iterations

    def __call__(self):
        import keras

        if isinstance(self.base, keras.optimizers.schedules.LearningRateSchedule):
            return self.base(self.iterations) * self.scale
        return self.base() * self.scale


def train_at_rate(optimizer, rate: float | None, scale: float = 1.0) -> None:
    """Make a replica's Keras optimizer train at the driver's ``rate`` times ``scale``.

    ``rate`` is what callbacks set on the driver's model this epoch (None: a
    schedule or a callable, which is kept and, with ``scale`` other than 1,
    wrapped once so that it yields ``scale`` times its value; the fit keys such
    replicas by the scale, so a wrapped one never serves another scale).
    """
    if rate is not None:
        optimizer.learning_rate = rate * scale
        return
    inner = inner_optimizer(optimizer)  # a LossScaleOptimizer's rate is its inner one's
    current = getattr(inner, "_learning_rate", None)
    if scale == 1.0 or current is None or isinstance(current, _ScaledRate):
        return
    inner.learning_rate = _ScaledRate(current, scale, inner.iterations)


def committed_steps(window: int | None, warmup_window: int | None, commits: int, pass_steps: int) -> int:
    """The local steps of a pass of ``pass_steps`` steps its first ``commits`` commits carried, as :class:`_Window`
    sends them: every ``warmup_window`` steps through the first :data:`~elephant.optimizers.local.RAMP_STEPS`, then
    every ``window`` (None: one commit at the pass's end), the last commit with what is left."""
    steps = since = 0
    done = 0
    while done < commits and steps < pass_steps:
        steps += 1
        since += 1
        now = warmup_window if warmup_window is not None and steps <= RAMP_STEPS else window
        if now is not None and since >= now:
            done, since = done + 1, 0
    return pass_steps if done < commits else steps


def _current_rate(optimizer) -> float:
    import keras

    return float(np.asarray(keras.ops.convert_to_numpy(optimizer.learning_rate)))


def _batch_sizes(n: int, batch_size: int) -> np.ndarray:
    steps = -(-n // batch_size)
    sizes = np.full(steps, batch_size)
    sizes[-1] = n - batch_size * (steps - 1)
    return sizes


class _Window:
    """Commit bookkeeping for one partition pass (runtime side of the worker rule).

    Blocking (``spec.overlap`` False): a commit sends the window's payload, waits
    for the reply and adopts what the rule makes of it before the next step.

    Overlapped: the commit is sent from a background thread and training goes on.
    When the reply is in (checked after every step; waited for at the next commit
    point, so at most one commit is in flight, and at the end of the pass), the
    rule's ``on_reply`` is applied to the weights *as they were sent*, and the
    local progress made meanwhile is added on top::

        new local = on_reply(weights at send) + (local now − weights at send)

    which for a rule that adopts the center is ``center + (local now − local at
    send)``. The next window's payload is measured from that reply's center, so
    the steps taken during the flight are committed with the next window. Commit
    keys are assigned at send, in order, so idempotency and fencing hold as in
    blocking mode.
    """

    def __init__(self, model, client, spec: TaskSpec, partition: int, attempt: int, n: int):
        self.model, self.client, self.spec = model, client, spec
        self.stepper = stepper(model)
        self.partition, self.attempt = partition, attempt
        self.sizes = _batch_sizes(n, spec.batch_size)
        self.step = 0  # local steps done this pass
        self.commits = 0
        self.steps_in_window = 0
        self.samples_in_window = 0
        self.comm_seconds = 0.0  # time the training loop was blocked on the parameter server
        self.diverged_at: int | None = None  # local step whose loss or weights went non-finite
        self._executor = None
        self._inflight: tuple[Any, list[np.ndarray]] | None = None  # (future, weights at send)
        t0 = time.perf_counter()
        reply = client.pull(partition, epoch=spec.epoch)
        self.pull_seconds = time.perf_counter() - t0
        self.pulled = reply.center
        self.base_clock = reply.clock
        self.stepper.set_weights(reply.center)
        self.state = spec.optimizer.worker_init(reply.center)

    def after_step(self) -> None:
        if self.spec.fault:
            inject_fault(self.spec.fault, self.partition, self.step, self.spec.epoch)
        self.samples_in_window += int(self.sizes[self.step])
        self.step += 1
        self.steps_in_window += 1
        if self._inflight is not None and self._inflight[0].done():
            self.settle()
        if self.spec.window is not None and self.steps_in_window >= self.window_now():
            self.commit()

    def window_now(self) -> int:
        """The window the steps since the last commit fill: ``spec.warmup_window`` through the pass's first
        :data:`~elephant.optimizers.local.RAMP_STEPS` steps, then ``spec.window`` (as ``schedules.timed``)."""
        warmup = self.spec.warmup_window
        return warmup if warmup is not None and self.step <= RAMP_STEPS else self.spec.window

    def diverge(self) -> None:
        """Drop the window: a non-finite update is never sent (the server would refuse it)."""
        self.diverged_at = self.step
        self.steps_in_window = self.samples_in_window = 0

    def commit(self) -> None:
        """Send the window (the last, partial one too); in overlapped mode first merge the one in flight."""
        self.settle()
        if self.steps_in_window == 0:
            return
        from elephant.ps.layout import all_finite

        t0 = time.perf_counter()
        opt = self.spec.optimizer
        weights = self.stepper.get_weights()
        if not all(all_finite(w) for w in weights):
            self.diverge()
            return
        tensors, self.state = opt.make_commit(self.state, weights, self.pulled, self.steps_in_window)
        commit = Commit(tensors, self.steps_in_window, self.samples_in_window, self.base_clock)
        key = CommitKey(self.spec.commit_run, self.spec.epoch, self.partition, self.commits)
        self.commits += 1
        self.steps_in_window = self.samples_in_window = 0
        if self.spec.overlap:
            if self._executor is None:
                from concurrent.futures import ThreadPoolExecutor

                self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"elephant-commit-{self.partition}")
            self._inflight = (self._executor.submit(self.client.commit, key, self.attempt, commit), weights)
        else:
            reply = self.client.commit(key, self.attempt, commit)
            self._adopt(reply, weights, weights)
        self.comm_seconds += time.perf_counter() - t0

    def settle(self) -> None:
        """Wait for the commit in flight, if any, and merge its reply into the local weights."""
        if self._inflight is None:
            return
        t0 = time.perf_counter()
        future, sent = self._inflight
        self._inflight = None
        reply = future.result()  # a failed commit raises here, in the training thread
        self._adopt(reply, sent, self.stepper.get_weights())
        self.comm_seconds += time.perf_counter() - t0

    def _adopt(self, reply, sent: list[np.ndarray], now: list[np.ndarray]) -> None:
        new_weights, self.state = merge_reply(self.spec.optimizer, self.state, reply, sent, now)
        self.stepper.set_weights(new_weights)
        self.pulled, self.base_clock = reply.center, reply.clock

    def close(self) -> None:
        """Let a commit still in flight complete (its outcome no longer matters) and stop the thread."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._inflight = None


def pass_rates(spec: TaskSpec, n: int) -> list[float] | None:
    """The learning rate of each step of a pass over ``n`` samples whose rate changes within it (the fit's first
    pass, where it ramps the plan's factor up: ``spec.learning_rate_warmup``), or None when the pass trains at
    one rate (:func:`~elephant.optimizers.local.step_rates`). A schedule (``learning_rate`` None) is left alone."""
    if spec.learning_rate is None:
        return None
    return step_rates(spec.learning_rate, spec.learning_rate_scale, spec.learning_rate_warmup,
                      -(-n // spec.batch_size))


def task_blocks(spec: TaskSpec, partition: int, blocks: Iterable[tuple], n: int) -> Iterator[tuple]:
    """The rows a partition of ``n`` rows trains this epoch, in order: the epoch's :func:`pass_blocks` without the
    ``spec.skip_steps`` batches the driver's head trained and those a resumed fit trained before it stopped.

    Raises (while it is read):
        DataError: the partition holds other than ``n`` rows (its source gave other rows than when it was counted).
    """
    key = (spec.shuffle_key or spec.run) if spec.shuffle else None
    rows = pass_blocks(_exactly(blocks, n, partition, spec.epoch), key, spec.epoch, partition, spec.shuffle_buffer)
    return skip_rows(rows, (spec.skip_steps + resumed_steps(spec, partition)) * spec.batch_size)


def resumed_steps(spec: TaskSpec, partition: int) -> int:
    """The steps of this pass a resumed fit trained before it stopped (``spec.resume_steps``; 0 for a new pass)."""
    return spec.resume_steps[partition] if partition < len(spec.resume_steps) else 0


def _exactly(blocks: Iterable[tuple], n: int, partition: int, epoch: int) -> Iterator[tuple]:
    seen = 0
    for block in blocks:
        seen += D.num_samples(block[0])
        if seen > n:
            break
        yield block
    if seen != n:
        raise DataError(f"partition {partition} holds {f'more than {n}' if seen > n else seen} rows in epoch "
                        f"{epoch + 1}, but held {n} when the fit counted them: its source is not deterministic (a "
                        "recomputed partition must give the same rows); cache or checkpoint the data before the fit")


def _train_pass(batches: Iterable[tuple], spec: TaskSpec, window: _Window,
                rates: list[float] | None = None) -> tuple[dict[str, float], float]:
    """One pass over ``batches`` with Keras' compiled train step; commits via ``window``. Returns the last step's
    logs and the sum of the weights of the rows trained (their count where they carry none).

    ``model.fit`` costs ~0.1-0.2 s of set-up per call, which dominates short
    partitions, so the pass drives Keras' compiled train function directly
    through the window's :class:`~elephant.backends.Stepper`: one step per
    batch, metrics accumulated as in ``fit`` (reset once per pass), each at
    its entry of ``rates`` when given (:func:`pass_rates`). The caller syncs
    the stepper's state back into the model after the pass's last commit.
    """
    window.stepper.begin_pass()
    logs: dict[str, Any] = {}
    weight_sum = 0.0
    for i, batch in enumerate(batches):
        x, y, w = D.unpack(batch)
        weight_sum += D.num_samples(x) if w is None else float(np.sum(w))
        if rates is not None:
            window.stepper.set_learning_rate(rates[i])
        logs = window.stepper.step((x, y, w))
        if "loss" in logs and not math.isfinite(float(logs["loss"])):
            window.diverge()  # as Keras' TerminateOnNaN, but the center never sees the NaN
        else:
            window.after_step()
        if window.diverged_at is not None:
            break
    return {k: float(v) for k, v in logs.items()}, weight_sum


def peak_rss() -> int:
    """The peak resident memory of this process so far, in bytes (a Python worker's, reused from task to task)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def run_partition(
    spec: TaskSpec,
    partition: int,
    attempt: int,
    blocks: Iterable[tuple[Any, Any]],
    client,
    cores: int = 1,
    report: bool = False,
) -> list[dict[str, Any]]:
    """Train one partition for one epoch; returns ``[stats]`` for the driver (and, with ``report``, sends them
    with the partition's finish, for a fit whose epochs run as one job: :mod:`elephant.fit.resident`).

    ``stats`` holds the partition's local training loss and metrics (means over
    its steps), ``samples``, ``steps``, ``commits``, timing figures, the
    task's ``device`` (``"gpu:<ids>"`` or ``"cpu"``, :mod:`elephant.gpu`) and
    where its Keras optimizer state came from (``optimizer_state``, see
    :func:`elephant.replicas.training_replica`).
    ``started_at`` and ``ended_at`` are the wall-clock (``time.time()``) bounds of
    the call, which the driver may compare with its own clock on one machine
    (``benchmarks/epoch_cost.py`` splits an epoch's job with them).
    """
    started_at = time.time()
    t_start = time.perf_counter()
    device = enter_task(spec.backend, f"partition {partition} of run {spec.run}")
    limit_threads(cores)
    if spec.partition_samples:
        n = spec.partition_samples[partition]
    else:  # not counted on the driver: read the partition once to count it (it is then held in memory)
        blocks = list(D.checked_blocks(blocks))
        n = sum(D.num_samples(b[0]) for b in blocks)
    base = {"partition": partition, "attempt": attempt, "samples": n, "steps": 0, "commits": 0, "device": device}
    done = resumed_steps(spec, partition)
    trained = max(0, n - (spec.skip_steps + done) * spec.batch_size)  # the rows after the head and a resumed fit
    if trained == 0:
        client.finish(spec.commit_run, spec.epoch, partition, attempt, *([base] if report else []))
        return [base]
    rows = task_blocks(spec, partition, blocks, n)  # seeded: a retried task replays its attempt's rows, in order
    model, optimizer_state = training_replica(spec, partition)
    train_at_rate(model.optimizer, spec.learning_rate, spec.learning_rate_scale)
    rates = pass_rates(spec, n - spec.skip_steps * spec.batch_size)
    rates = rates[done:] if rates is not None else None  # a resumed pass goes on at its steps' rates
    rate = _current_rate(model.optimizer) if rates is None else rates[0]  # at the pass's first step
    t_ready = time.perf_counter()
    window = _Window(model, client, spec, partition, attempt, trained)
    try:
        logs, weight_sum = _train_pass(batches(rows, spec.batch_size), spec, window, rates)
        window.commit()  # flush the partial last window
        window.settle()
    finally:
        window.close()
        window.stepper.sync_to_model()  # the replica's optimizer state and metrics, for the next task and the stats
    # for the partition's next epoch, anywhere; in a fit run as one job, written while this task trains it
    keep_optimizer_state(spec, partition, share=not spec.last_epoch, background=report)
    stats = dict(
        base,
        steps=window.step,
        commits=window.commits,
        diverged_at=window.diverged_at,
        optimizer_state=optimizer_state,
        learning_rate=rate,
        logs=logs,
        weight_sum=weight_sum,
        weighted_keys=weighted_metric_keys(model),
        seconds=time.perf_counter() - t_start,
        setup_seconds=t_ready - t_start,
        comm_seconds=window.comm_seconds,
        pull_seconds=window.pull_seconds,
        started_at=started_at,
        ended_at=time.time(),
        peak_rss=peak_rss(),
    )
    client.finish(spec.commit_run, spec.epoch, partition, attempt, *([stats] if report else []))
    return [stats]
