"""Simulate a whole distributed fit of a Keras model in one process.

:func:`simulate_fit` takes the arguments of ``SparkModel(...).fit(...)`` and
plays the fit through :func:`~elephant.optimizers.simulate` with one Keras
replica per worker: its own variables (weights, optimizer state across windows
and epochs, as a cached worker model keeps them), trained on one model rebuilt
from the model's ``.keras`` archive exactly as a Spark task rebuilds it and
shared by the workers in turn (or one model each, ``share_model=False``). The
data are split into the same shards as :meth:`elephant.SparkModel.fit` splits numpy
input, each worker reshuffles its shard every epoch (in the orders a Spark fit
with the same seed trains) and commits after every
``window`` steps plus a flushed partial window, and the workers are interleaved
as equally fast machines would be (``schedules.timed``; give ``step_times`` for
heterogeneous ones). Nothing but the model and numpy is needed: no Spark, no
HTTP. A researcher can try a rule, a window or a worker count here before
booking a cluster; ``benchmarks/convergence.py`` compares the two.

It plans through :func:`elephant.fit.plan.plan_fit` with the same
:class:`~elephant.config.Settings` a SparkModel holds, so the simulated fit
trains the plan a Spark fit would: where the plan has a head
(:mod:`elephant.fit.head`), the model trains it first on each shard's first
batches, as a Spark fit's driver does, and the replicas start from it and skip
them. ``elephant.optimizers.simulate_fit`` names this function too (imported on
first use: the optimizers stay numpy-only).
"""

from __future__ import annotations

import dataclasses
import itertools
import secrets
from collections.abc import Sequence
from typing import Any

import numpy as np

from elephant import data as D
from elephant.backends import stepper, variable_access
from elephant.config import Settings, check_positive_int
from elephant.errors import ConfigError
from elephant.fit.head import head_rows, train_head
from elephant.fit.plan import plan_fit
from elephant.optimizers.base import DistributedOptimizer
from elephant.optimizers.local import RAMP_STEPS, LocalMoment, LocalMomentum, step_rates
from elephant.optimizers.schedules import timed
from elephant.optimizers.simulate import simulate
from elephant.optimizers.trace import Trace
from elephant.stream import buffer_samples, pass_order, shuffle_key
from elephant.worker import train_at_rate

__all__ = ["simulate_fit", "FitTrace"]

_SETTINGS = Settings.defaults()  # simulate_fit takes SparkModel's settings with their defaults


@dataclasses.dataclass
class FitTrace:
    """What :func:`simulate_fit` returns.

    Attributes:
        history: per-epoch values, as ``keras.callbacks.History.history``: the
            center's ``val_*`` metrics when ``validation_data`` was given, and
            ``updates`` (commits or rounds applied in the epoch).
        centers: the center weights at the end of every epoch.
        trace: the simulator's :class:`~elephant.optimizers.Trace` of the whole fit (its
            ``centers`` kept at the epochs' ends only, None elsewhere).
        optimizer: the distributed optimizer that ran; ``window`` the local steps
            per commit (None: one commit per pass).
    """

    history: dict[str, list[float]]
    centers: list[list[np.ndarray]]
    trace: Trace
    optimizer: DistributedOptimizer
    window: int | None


class _LiveWeights(Sequence):
    """A replica's weights after a local step, computed and read only when the simulator reads them.

    Most steps' weights are never read (only a commit's are): the replica queues
    its steps and runs them when its weights are read. The first read runs them
    and copies the weights; a view that was not read before the replica's next
    step can no longer be (it would show later weights).
    """

    def __init__(self, replica: _Replica):
        self.replica, self.arrays = replica, None
        self.count = replica.count
        self.structure = replica.engine.structure  # what the weights will be, known without running the steps

    def _read(self) -> list[np.ndarray]:
        if self.arrays is None:
            if self.replica.live is not self:
                raise RuntimeError("the weights of an earlier local step were read after the replica stepped on")
            self.arrays = self.replica.run_queued()
        return self.arrays

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index):
        return self._read()[index]

    def __iter__(self):
        return iter(self._read())


class _Engine:
    """A Keras model that replicas take turns on: each one's variables are swapped in when it runs.

    A replica's variables are all of the model's trainable and non-trainable
    ones (seed generators included) and its optimizer's, so a replica on a
    shared engine computes what a model of its own would. Replicas run their
    queued steps only at a commit, so a swap happens once per window, not per
    step.
    """

    def __init__(self, model, rate_scale: float = 1.0, warmup: bool = False, moment: LocalMoment | None = None,
                 momentum: LocalMomentum | None = None):
        from elephant.fit.loop import settable_learning_rate

        rate = settable_learning_rate(model.optimizer)
        train_at_rate(model.optimizer, rate, rate_scale)  # as every task does
        for change in (moment, momentum):  # as a task's replica is built
            if change is not None:
                change.apply(model.optimizer)
        # what the first pass's rate at each step is made from (step_rates), as run_partition's; None: one rate
        self.rates = (rate, rate_scale) if warmup and rate_scale != 1.0 and rate is not None else None
        if not model.optimizer.built:  # as the first train step would, so the slots exist to swap
            model.optimizer.build(model.trainable_variables)
        self.model, self.stepper = model, stepper(model)
        self.structure = [(tuple(int(d) for d in v.shape), np.dtype(v.dtype)) for v in model.weights]
        self.access = variable_access([*model.trainable_variables, *model.non_trainable_variables,
                                       *model.optimizer.variables])
        self.initial = self.read()
        self.holder: _Replica | None = None

    def read(self) -> list[np.ndarray]:
        self.stepper.sync_to_model()
        return self.access.read()

    def hand_to(self, replica: _Replica) -> None:
        """Make the model hold ``replica``'s variables (saving the previous holder's)."""
        if self.holder is replica:
            return
        if self.holder is not None:
            self.holder.state = self.read()
        self.stepper.sync_to_model()
        self.access.write(replica.state if replica.state is not None else self.initial)
        self.holder, replica.state = replica, None


class _Replica:
    """One simulated worker: its shard, reshuffled every epoch, and its turns on a Keras model."""

    def __init__(self, engine: _Engine, x, y, batch_size: int, shuffle_key: str | None, partition: int,
                 skip: int = 0, buffer: int | None = None):
        self.engine, self.x, self.y = engine, x, y
        self.batch_size, self.shuffle_key, self.partition = batch_size, shuffle_key, partition  # key None: no shuffle
        self.skip = skip  # rows of the first pass the driver's head trained, as TaskSpec.skip_steps
        self.buffer = buffer  # the shuffle buffer's samples, as TaskSpec.shuffle_buffer
        self.n = D.num_samples(x)
        self.epoch = -1
        self.order = np.arange(0)
        self.position = 0  # the first step starts a pass
        self.count = len(engine.model.weights)  # what get_weights returns, without copying it
        self.live: _LiveWeights | None = None
        self.state: list[np.ndarray] | None = None  # the variables while another replica holds the engine
        self.queue: list[tuple[str, Any]] = []
        self.rates: list[float] | None = None  # this pass's rate at each step, where it changes within the pass

    def train_step(self, weights):
        while self.position >= len(self.order):  # a new pass over the shard: reshuffle, as run_partition does
            self.epoch += 1
            self.order = pass_order(self.shuffle_key, self.epoch, self.partition, self.n, self.buffer)
            if self.epoch == 0:
                self.order = self.order[self.skip:]
            self.position = 0
            self.queue.append(("pass", None))
            if self.engine.rates is not None:
                rate, scale = self.engine.rates
                rates = step_rates(rate, scale, self.epoch == 0, -(-len(self.order) // self.batch_size))
                if rates is None and self.rates is not None:  # back to one rate, as the next task sets it
                    self.queue.append(("rate", rate * scale))
                self.rates = rates
        if self.rates is not None:
            self.queue.append(("rate", self.rates[self.position // self.batch_size]))
        if weights is not self.live:  # a pull or a reply replaced the local weights
            self.queue.append(("set", [np.array(w, copy=True) for w in weights]))
        self.queue.append(("step", self.order[self.position : self.position + self.batch_size]))
        self.position += self.batch_size
        self.live = _LiveWeights(self)
        return self.live

    def run_queued(self) -> list[np.ndarray]:
        """Run the steps queued since the last read, on the engine, and return the weights after them."""
        self.engine.hand_to(self)
        run = self.engine.stepper
        for kind, value in self.queue:
            if kind == "pass":
                run.begin_pass()
            elif kind == "set":
                run.set_weights(value)
            elif kind == "rate":
                run.set_learning_rate(value)
            else:
                run.step((D.take(self.x, value), D.take(self.y, value), None))
        self.queue.clear()
        return run.get_weights()


def _keras_step(weights, replica: _Replica, slots):
    return replica.train_step(weights), slots


def simulate_fit(
    model,
    x,
    y,
    *,
    epochs: int = 1,
    batch_size: int = 32,
    mode: str = _SETTINGS["mode"],
    optimizer: Any = _SETTINGS["optimizer"],
    frequency: str | int | None = _SETTINGS["frequency"],
    num_workers: int = 2,
    seed: int | None = _SETTINGS["seed"],
    shuffle: bool = True,
    shuffle_buffer: int | None = None,
    validation_data: tuple | None = None,
    step_times: Sequence[float] | None = None,
    custom_objects=None,
    batch_split: bool | None = _SETTINGS["batch_split"],
    overlap: bool = _SETTINGS["overlap"],
    comm_budget: float = _SETTINGS["comm_budget"],
    share_model: bool = True,
) -> FitTrace:
    """Play ``SparkModel(model, mode, frequency, optimizer, num_workers, seed=seed).fit(x, y, ...)`` in-process.

    Args:
        model: a compiled Keras model; its weights are the starting center and,
            as after ``SparkModel.fit``, it holds the final center at the end.
        x, y: numpy training data (split into ``num_workers`` shards with
            ``seed``, as ``SparkModel.fit`` splits numpy input).
        epochs, batch_size, shuffle, shuffle_buffer: as in ``fit`` (each shard is one
            block, as a numpy fit's partition is, so its order is the Spark fit's).
        mode, optimizer, frequency: as in ``SparkModel`` (same defaults).
        num_workers: simulated workers. Default 2.
        seed: shard split seed, also seeds the per-epoch shuffles: with the
            same seed and starting weights each worker trains the samples of
            its partition in a Spark fit, in the same order (the two then
            differ by floating point, the interleaving of asynchronous commits
            and a window Spark re-decides from its timings). Default 0.
        validation_data: ``(x_val, y_val)``; the center is evaluated on it after
            every epoch and the results go to ``history`` as ``val_*``.
        step_times: time per local step for each worker (default: all equal).
        custom_objects, batch_split, overlap, comm_budget: as in ``SparkModel``;
            with ``overlap`` each reply is merged after the worker's next local
            step. A window decided from the fit's costs is decided from their
            estimates (a Spark fit re-decides it from its first epoch's timings).
        share_model: one Keras model for all the workers, each worker's
            variables (weights, optimizer state, seed generators) swapped in
            when it commits (default: one model traced once, and only the
            variables kept per worker); False rebuilds one model per worker,
            as Spark executors do. Both train the same numbers.

    Returns:
        A :class:`FitTrace`.

    Raises:
        ConfigError: an argument is invalid or the optimizer does not support ``mode``.
    """
    from elephant.model_io import model_from_bytes, model_to_bytes

    settings = Settings.of(locals())  # the arguments named as Settings' fields, checked there
    epochs = check_positive_int("epochs", epochs)
    batch_size = check_positive_int("batch_size", batch_size)
    num_workers = check_positive_int("num_workers", settings.num_workers)  # None: no Spark parallelism to take
    D.check_xy(x, y)
    plan = plan_fit(settings, model, num_workers, batch_size, D.num_samples(x))
    opt, window = plan.rule, plan.window
    global_batch, batch_size = batch_size, plan.worker_batch_size
    shards = D.split_numpy(x, y, num_workers, seed=seed)
    # the orders a Spark fit with this seed trains; no seed: new orders every fit, as a Spark fit's run id gives
    key = (shuffle_key(seed, model.get_weights()) or secrets.token_hex(8)) if shuffle else None
    sizes = [D.num_samples(sx) for sx, _ in shards]
    buffer = buffer_samples(check_positive_int("shuffle_buffer", shuffle_buffer, allow_none=True),
                            D.row_bytes(shards[0]))
    head = min([plan.head_steps] + [-(-n // batch_size) - 1 for n in sizes])  # every shard keeps a step to train
    if head > 0:  # as the Spark fit's driver trains it (elephant.fit.head), before the archive
        train_head(model, [head_rows(shard, pass_order(key, 0, k, n, buffer), head, batch_size)
                           for k, (shard, n) in enumerate(zip(shards, sizes, strict=True))], head, batch_size,
                   plan.head_batch_size)
    skips = [min(n, max(head, 0) * batch_size) for n in sizes]
    archive = model_to_bytes(model)
    rates = (plan.learning_rate_scale, plan.learning_rate_warmup, plan.local_moment, plan.local_momentum)
    engine = _Engine(model_from_bytes(archive, custom_objects), *rates) if share_model else None
    replicas = [
        _Replica(engine or _Engine(model_from_bytes(archive, custom_objects), *rates), sx, sy,
                 batch_size, key, k, skips[k], buffer)
        for k, (sx, sy) in enumerate(shards)
    ]
    times = list(step_times) if step_times is not None else [1.0] * num_workers
    if len(times) != num_workers:
        raise ConfigError(f"`step_times` must give one time per worker ({num_workers}); received {len(times)}")

    steps = [-(-r.n // batch_size) for r in replicas]
    one_epoch = timed(times, window or max(steps), steps)  # every epoch plays the same interleaving
    # but the first, after the head's rows and with shorter windows while the workers' rate ramps up
    first_steps = [-(-(r.n - r.skip) // batch_size) for r in replicas]
    warmup = None if plan.warmup_window is None else (plan.warmup_window, RAMP_STEPS)
    first = one_epoch if first_steps == steps and warmup is None else timed(
        times, window or max(steps), first_steps, warmup=warmup)
    schedule = first + one_epoch * (epochs - 1)

    def updates(events: list[tuple]) -> int:  # rounds or commits
        commits = [events.count(("commit", k)) for k in range(num_workers)]
        return max(commits) if mode == "synchronous" else sum(commits)

    per_epoch = [updates(first)] + [updates(one_epoch)] * (epochs - 1)
    epoch_ends = list(itertools.accumulate(per_epoch))  # index into trace.centers, plus one

    trace = simulate(
        opt, model.get_weights(), replicas, schedule, mode=mode, num_workers=num_workers,
        local_step=_keras_step, num_samples=[batch_size] * num_workers, on_blocked="defer", overlap=overlap,
        keep_centers={i - 1 for i in epoch_ends},  # one model copy per epoch, not per commit
    )

    centers = [trace.centers[i - 1] if i else model.get_weights() for i in epoch_ends]
    history: dict[str, list[float]] = {"updates": [float(n) for n in per_epoch]}
    for weights in centers:
        if validation_data is not None:
            model.set_weights(weights)
            logs = model.evaluate(*validation_data[:2], batch_size=global_batch, verbose=0, return_dict=True)
            for key, value in logs.items():
                history.setdefault(f"val_{key}", []).append(float(value))
    model.set_weights(trace.center)
    return FitTrace(history=history, centers=centers, trace=trace, optimizer=opt, window=window)
