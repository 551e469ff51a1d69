"""The partition training loop, run inside a Spark task.

The loop runs Keras' own compiled train step over the partition's numpy block
(shuffled once per pass), committing after every ``window`` steps through the
distributed optimizer's worker rule and merging the reply. The last partial
window is flushed, not dropped.

The worker talks to anything with ``pull``/``commit``/``finish`` methods (the
HTTP :class:`~elephant.ps.client.PSClient` or an in-process client), so it never
knows where its parameter server lives.

Training replicas are rebuilt at most once per Python worker process and model
*structure* (architecture, compile settings, initial optimizer state; not the
weights, which every task overwrites with the center it pulls), and cached:
Spark reuses Python workers across tasks, so later epochs of the same fit reuse
the model *and its Keras optimizer state* (e.g. Adam moments). That is a
deliberate choice (dist-keras parity, and resetting moments every epoch
measurably slows convergence). A later fit of a model with the same structure
(a notebook cell run again, a benchmark's next seed) reuses the replica and its
traced train step, which saves seconds per fit, but never its optimizer state:
each fit starts from the optimizer variables the replica was built with, and a
fit that alternates with another on the same replica gets its own back. Models
fitted with custom objects get a replica per fit (their code may have changed).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from elephant import data as D
from elephant.optimizers.base import DistributedOptimizer
from elephant.protocol import Commit, CommitKey, merge_reply

log = logging.getLogger(__name__)

_MODEL_CACHE: OrderedDict[tuple[str, str], Any] = OrderedDict()
_MODEL_CACHE_SIZE = 4
_REPLICAS: OrderedDict[str, _Replica] = OrderedDict()  # structure fingerprint -> replica
_REPLICAS_SIZE = 4
_SAVED_RUNS = 4  # optimizer states kept per replica for fits that alternate on it
_THREADS_SET = False

__all__ = ["TaskSpec", "run_partition", "predict_block", "evaluate_block", "cached_model", "training_model"]


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

    @property
    def commit_run(self) -> str:
        """The run id of this task's commit keys and finish."""
        return self.ps_run or self.run


def _value(maybe_broadcast: Any) -> bytes:
    return maybe_broadcast.value if hasattr(maybe_broadcast, "value") else maybe_broadcast


def limit_threads(cores: int) -> None:
    """Limit TensorFlow to the task's cores (effective before TF first runs here)."""
    global _THREADS_SET
    if _THREADS_SET:
        return
    cores = max(1, int(cores))
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", str(cores))
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", str(min(cores, 2)))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(cores)
        tf.config.threading.set_inter_op_parallelism_threads(min(cores, 2))
    except (RuntimeError, ImportError):  # TF already initialised in this process
        pass
    _THREADS_SET = True


def cached_model(model_bytes: Any, fingerprint: str, key: str = "", custom_objects=None):
    """The Keras model for ``fingerprint``, built at most once per process and key."""
    from elephant.model_io import model_from_bytes

    cache_key = (fingerprint, key)
    model = _MODEL_CACHE.get(cache_key)
    if model is None:
        model = model_from_bytes(_value(model_bytes), custom_objects)
        _MODEL_CACHE[cache_key] = model
        while len(_MODEL_CACHE) > _MODEL_CACHE_SIZE:
            _MODEL_CACHE.popitem(last=False)
        log.debug("built model %s for %r", fingerprint, key)
    else:
        _MODEL_CACHE.move_to_end(cache_key)
    return model


@dataclasses.dataclass
class _Replica:
    """A rebuilt training model, the fit that owns its optimizer state, and other fits' saved states."""

    model: Any
    initial: list[np.ndarray]  # optimizer variables as built from the archive
    run: str | None = None
    saved: OrderedDict[str, list[np.ndarray]] = dataclasses.field(default_factory=OrderedDict)


def _optimizer_values(model) -> list[np.ndarray]:
    return [np.array(v) for v in model.optimizer.variables]


def training_model(spec: TaskSpec):
    """The replica that trains ``spec.run``, with that fit's Keras optimizer state.

    Built at most once per process and ``spec.structure``; without a structure,
    once per process and fit (``spec.fingerprint`` and ``spec.run``). The first task of a fit on a replica saves the
    previous fit's optimizer variables and loads its own (the ones the replica
    was built with, for a new fit), so sharing a replica never leaks optimizer
    state between fits.
    """
    from elephant.model_io import model_from_bytes

    key = spec.structure or f"{spec.fingerprint}/{spec.run}"
    replica = _REPLICAS.get(key)
    if replica is None:
        model = model_from_bytes(_value(spec.model_bytes), spec.custom_objects)
        if not model.optimizer.built:  # as the first train step would, so the slots exist to save and restore
            model.optimizer.build(model.trainable_variables)
        replica = _REPLICAS[key] = _Replica(model, _optimizer_values(model))
        while len(_REPLICAS) > _REPLICAS_SIZE:
            _REPLICAS.popitem(last=False)
        log.debug("built training replica %s", key)
    _REPLICAS.move_to_end(key)
    if replica.run != spec.run:
        if replica.run is not None:
            replica.saved[replica.run] = _optimizer_values(replica.model)
            while len(replica.saved) > _SAVED_RUNS:
                replica.saved.popitem(last=False)
        values = replica.saved.pop(spec.run, replica.initial)
        for variable, value in zip(replica.model.optimizer.variables, values, strict=True):
            variable.assign(value)
        replica.run = spec.run
    return replica.model


class WeightAccess:
    """``get_weights``/``set_weights`` of a training replica in one TensorFlow call each.

    Keras' own methods convert and assign variable by variable: for the 8-variable
    Conv1D of ``benchmarks/end_to_end.py`` they took 1.2-1.4 and 3.2-3.3 ms here,
    against 0.3-0.5 ms for one traced function that reads every variable and
    0.6-0.9 ms for one that assigns them all from a flat buffer per dtype (called
    as concrete functions: 0.15 and 0.24 ms in a later run where calling the
    ``tf.function`` took 0.25 and 0.46 ms). A commit
    reads and writes the weights once each, so at one commit per step this is most
    of the worker's share of the round trip. Other Keras backends get Keras' methods.
    """

    def __init__(self, model):
        import keras

        self.model = model
        self._read = self._write = None
        variables = list(model.weights) if isinstance(model, keras.Model) else []
        if keras.backend.backend() != "tensorflow" or not variables:
            return  # another backend, or a test double with get_weights/set_weights
        import tensorflow as tf

        tvars = [v.value for v in variables]
        shapes = [tuple(int(d) for d in v.shape) for v in variables]
        groups: dict[np.dtype, list[int]] = {}
        for i, v in enumerate(tvars):
            groups.setdefault(np.dtype(v.dtype.as_numpy_dtype), []).append(i)
        self._groups = list(groups.items())
        sizes = [int(np.prod(shape, dtype=np.int64)) for shape in shapes]

        def read():
            return [t.read_value() for t in tvars]

        def write(flats):
            for (_, members), flat in zip(self._groups, flats):
                for i, part in zip(members, tf.split(flat, [sizes[i] for i in members])):
                    tvars[i].assign(tf.reshape(part, shapes[i]))

        signature = [tf.TensorSpec([sum(sizes[i] for i in members)], tf.as_dtype(dtype))
                     for dtype, members in self._groups]
        # Concrete functions: calling a tf.function re-binds and hashes its arguments to find
        # the trace each time (about 0.1 ms for the read and 0.2 ms for the write here).
        self._read = tf.function(read, autograph=False).get_concrete_function()
        self._write = tf.function(write, input_signature=[signature], autograph=False).get_concrete_function()

    def get(self) -> list[np.ndarray]:
        if self._read is None:
            return self.model.get_weights()
        return [np.array(t) for t in self._read()]

    def set(self, weights) -> None:
        if self._write is None:
            self.model.set_weights(weights)
            return
        self._write([np.concatenate([np.asarray(weights[i], dtype=dtype).ravel() for i in members])
                     for dtype, members in self._groups])


_ACCESS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def weight_access(model) -> WeightAccess:
    """The model's :class:`WeightAccess`, built once per model."""
    access = _ACCESS.get(model)
    if access is None:
        access = _ACCESS[model] = WeightAccess(model)
    return access


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
        self.weights = weight_access(model)
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
        reply = client.pull(partition, epoch=spec.epoch)
        self.pulled = reply.center
        self.base_clock = reply.clock
        self.weights.set(reply.center)
        self.state = spec.optimizer.worker_init(reply.center)

    def after_step(self) -> None:
        if self.spec.fault:
            inject_fault(self.spec.fault, self.partition, self.step)
        self.samples_in_window += int(self.sizes[self.step])
        self.step += 1
        self.steps_in_window += 1
        if self._inflight is not None and self._inflight[0].done():
            self.settle()
        if self.spec.window is not None and self.steps_in_window >= self.spec.window:
            self.commit()

    def diverge(self) -> None:
        """Drop the window: a non-finite update is never sent (the server would refuse it)."""
        self.diverged_at = self.step
        self.steps_in_window = self.samples_in_window = 0

    def commit(self) -> None:
        """Send the window (the last, partial one too); in overlapped mode first merge the one in flight."""
        self.settle()
        if self.steps_in_window == 0:
            return
        from elephant.ps.wire import all_finite

        t0 = time.perf_counter()
        opt = self.spec.optimizer
        weights = self.weights.get()
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
        self._adopt(reply, sent, self.weights.get())
        self.comm_seconds += time.perf_counter() - t0

    def _adopt(self, reply, sent: list[np.ndarray], now: list[np.ndarray]) -> None:
        new_weights, self.state = merge_reply(self.spec.optimizer, self.state, reply, sent, now)
        self.weights.set(new_weights)
        self.pulled, self.base_clock = reply.center, reply.clock

    def close(self) -> None:
        """Let a commit still in flight complete (its outcome no longer matters) and stop the thread."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._inflight = None


def inject_fault(fault: str, partition: int, step: int) -> None:
    """Fault injection for reliability tests.

    ``fault`` is ``"partition=P,step=S,kind=raise|exit,marker=PATH"``: the first
    time partition ``P`` reaches local step ``S`` the task fails. The marker file
    makes the fault fire once per fit even though Spark's attempt numbers reset.
    """
    fields = dict(item.split("=", 1) for item in fault.split(",") if "=" in item)
    if int(fields.get("partition", -1)) != partition or int(fields.get("step", -1)) != step:
        return
    marker = fields.get("marker")
    if marker:
        try:
            with open(marker, "x"):
                pass
        except FileExistsError:
            return
    if fields.get("kind", "raise") == "exit":
        os._exit(13)
    raise RuntimeError(f"injected fault in partition {partition} at step {step}")


def shuffle_seed(run: str, epoch: int, partition: int) -> int:
    """The seed of a partition's shuffle in one epoch of one fit (stable across processes, unlike ``hash``)."""
    return zlib.crc32(f"{run}/{epoch}/{partition}".encode())


def _train_pass(model, x: Any, y: Any, w: Any, spec: TaskSpec, window: _Window) -> dict[str, float]:
    """One pass over the block with Keras' compiled train step; commits via ``window``.

    ``model.fit`` costs ~0.1-0.2 s of set-up per call, which dominates short
    partitions, so the pass drives Keras' compiled ``train_function`` directly:
    one step per batch, metrics accumulated as in ``fit`` (reset once per pass).
    """
    n = D.num_samples(x)
    if spec.shuffle:  # seeded: a retried task replays the samples of the attempt it replaces, in order
        order = np.random.default_rng(shuffle_seed(spec.run, spec.epoch, window.partition)).permutation(n)
        x, y, w = D.take(x, order), D.take(y, order), D.take(w, order)
    model.make_train_function()
    model.reset_metrics()
    logs: dict[str, Any] = {}
    for start in range(0, n, spec.batch_size):
        batch = slice(start, start + spec.batch_size)
        logs = model.train_function(iter([(D.take(x, batch), D.take(y, batch), D.take(w, batch))]))
        if "loss" in logs and not math.isfinite(float(logs["loss"])):
            window.diverge()  # as Keras' TerminateOnNaN, but the center never sees the NaN
        else:
            window.after_step()
        if window.diverged_at is not None:
            break
    return {k: float(v) for k, v in logs.items()}


def run_partition(
    spec: TaskSpec,
    partition: int,
    attempt: int,
    blocks: Iterable[tuple[Any, Any]],
    client,
    cores: int = 1,
) -> list[dict[str, Any]]:
    """Train one partition for one epoch; returns ``[stats]`` for the driver.

    ``stats`` holds the partition's local training loss and metrics (means over
    its steps), ``samples``, ``steps``, ``commits`` and timing figures.
    """
    t_start = time.perf_counter()
    limit_threads(cores)
    block = next(D.concat_blocks(blocks), None)
    n = 0 if block is None else D.num_samples(block[0])
    base = {"partition": partition, "attempt": attempt, "samples": n, "steps": 0, "commits": 0}
    if n == 0:
        client.finish(spec.commit_run, spec.epoch, partition, attempt)
        return [base]
    x, y, w = D.unpack(block)
    model = training_model(spec)
    if spec.learning_rate is not None:  # what callbacks set on the driver's model this epoch
        model.optimizer.learning_rate = spec.learning_rate
    t_ready = time.perf_counter()
    window = _Window(model, client, spec, partition, attempt, n)
    try:
        logs = _train_pass(model, x, y, w, spec, window)
        window.commit()  # flush the partial last window
        window.settle()
    finally:
        window.close()
    client.finish(spec.commit_run, spec.epoch, partition, attempt)
    return [
        dict(
            base,
            steps=window.step,
            commits=window.commits,
            diverged_at=window.diverged_at,
            logs=logs,
            weight_sum=n if w is None else float(np.sum(w)),
            weighted_keys=weighted_metric_keys(model),
            seconds=time.perf_counter() - t_start,
            setup_seconds=t_ready - t_start,
            comm_seconds=window.comm_seconds,
        )
    ]


def predict_block(model, x: Any, batch_size: int | None) -> np.ndarray | list | dict:
    return model.predict(x, batch_size=batch_size, verbose=0)


def evaluate_block(model, x: Any, y: Any, batch_size: int | None, sample_weight: Any = None) -> dict[str, float]:
    logs = model.evaluate(x, y, sample_weight=sample_weight, batch_size=batch_size, verbose=0, return_dict=True)
    return {k: float(v) for k, v in logs.items()}


def weighted_metric_keys(model) -> list[str]:
    """The log keys of the model's ``weighted_metrics`` (their means are over the weights, not the samples).

    Keras' compiled metrics report the plain ``metrics`` first and then the
    weighted ones, so the weighted keys are the tail of their result.
    """
    compiled = getattr(model, "_compile_metrics", None)
    if compiled is None or not getattr(compiled, "built", False):
        return []
    try:
        plain = sum(len(group.metrics) for group in compiled._flat_metrics if group)
        return list(compiled.result())[plain:]
    except (AttributeError, TypeError, ValueError):  # a Keras that keeps its metrics elsewhere
        return []
