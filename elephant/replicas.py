"""Keras models on an executor, cached per Python worker process: training replicas, inference models, weight access.

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

Inference (:mod:`elephant.inference`) keeps its models in the same bounded
cache (:func:`cached_model`), and every Keras call a task makes on a cached
model (:func:`predict_block`, :func:`evaluate_block`) is here.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["WeightAccess", "cached_model", "evaluate_block", "limit_threads", "predict_block", "training_model",
           "weight_access", "weighted_metric_keys"]

_MODEL_CACHE: OrderedDict[tuple[str, str], Any] = OrderedDict()
_MODEL_CACHE_SIZE = 4
_REPLICAS: OrderedDict[str, Any] = OrderedDict()  # structure fingerprint -> _Replica
_REPLICAS_SIZE = 4
_SAVED_RUNS = 4  # optimizer states kept per replica for fits that alternate on it
_THREADS_SET = False


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


def training_model(spec):
    """The replica that trains ``spec.run`` (a :class:`~elephant.worker.TaskSpec`), with that fit's optimizer state.

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
