"""One compiled Keras train step per batch, and flat weight access, on every Keras 3 backend.

A worker pass (:func:`elephant.worker.run_partition`) and a simulated replica
(:func:`elephant.fit.simulate_fit`) drive Keras' own compiled train function
one batch at a time, reading and writing the weights at every commit. Keras
has no public API for either, and each backend calls its train function
differently:

- TensorFlow and PyTorch: ``model.train_function([batch])``; the model's
  variables are the training state.
- JAX: ``logs, state = model.train_function(state, iter([batch]))`` on the
  tuple ``(trainable, non_trainable, optimizer, metrics)`` of values, which the
  jitted function *donates*: the loop owns the state between steps and writes
  it back into the variables only when asked (:meth:`Stepper.sync_to_model`).

:func:`stepper` returns the model's :class:`Stepper` (built once per model).
Its protocol::

    s = stepper(model)
    s.set_weights(center)          # all of model.weights, in order, as numpy
    s.begin_pass()                 # metrics reset: logs are means over the pass
    logs = s.step((x, y, None))    # Keras' logs, as backend scalars
    weights = s.get_weights()      # flat numpy copies
    s.sync_to_model()              # model.weights, optimizer and metrics hold the loop's state

Before :meth:`~Stepper.sync_to_model` only the stepper's own methods see the
loop's state on JAX; on the other backends it is a no-op.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import numpy as np

from elephant.optimizers.local import inner_optimizer

log = logging.getLogger(__name__)

__all__ = ["Stepper", "stepper", "variable_access"]


class Stepper:
    """The slow, backend-neutral stepper: Keras' ``get_weights``/``set_weights``, one variable at a time.

    Used for objects that are not Keras models (test doubles with
    ``get_weights``/``set_weights``) and backends without a fast path. Its
    :meth:`step` calls ``train_function([batch])``, the TensorFlow and PyTorch
    form.

    Args:
        model: a compiled Keras model, or anything with ``get_weights`` and
            ``set_weights`` (then only the weight methods are usable).
    """

    def __init__(self, model):
        self.model = model

    def begin_pass(self) -> None:
        """Make the train function if needed and reset the metrics (logs are then means over the pass)."""
        self.model.make_train_function()
        self.model.reset_metrics()

    def step(self, batch: tuple) -> dict[str, Any]:
        """Train on one batch ``(x, y, sample_weight)``.

        Returns:
            Keras' logs (backend scalars): the loss and metrics accumulated since :meth:`begin_pass`.
        """
        return self.model.train_function([batch])

    def set_learning_rate(self, rate: float) -> None:
        """Train the next steps at ``rate`` (the optimizer's rate must be a number, not a schedule)."""
        self.model.optimizer.learning_rate = rate

    def get_weights(self) -> list[np.ndarray]:
        """All of ``model.weights``, in order, as numpy arrays the caller owns."""
        return self.model.get_weights()

    def set_weights(self, weights) -> None:
        """Set all of ``model.weights`` from numpy arrays, in order (cast to each variable's dtype)."""
        self.model.set_weights(weights)

    def sync_to_model(self) -> None:
        """Make the model's variables hold the loop's state (here they always do)."""


def _dtype_groups(dtypes: list[np.dtype]) -> list[tuple[np.dtype, list[int]]]:
    groups: dict[np.dtype, list[int]] = {}
    for i, dtype in enumerate(dtypes):
        groups.setdefault(np.dtype(dtype), []).append(i)
    return list(groups.items())


def _check_count(weights, expected: int) -> None:
    if len(weights) != expected:
        raise ValueError(f"`weights` must hold {expected} arrays (one per model weight); received {len(weights)}")


def _flatten(weights, groups, expected: int) -> list[np.ndarray]:
    """One flat array per dtype group, the members' values concatenated in order."""
    _check_count(weights, expected)
    return [np.concatenate([np.asarray(weights[i], dtype=dtype).ravel() for i in members])
            for dtype, members in groups]


class TensorFlowStepper(Stepper):
    """TensorFlow: one traced function reads every weight, one writes them all from a flat buffer per dtype.

    Keras' own methods convert and assign variable by variable, several times
    slower than one traced read and one traced write (``benchmarks/README.md``,
    "Keras backends (benchmarks/backends.py)"). A commit reads and writes the
    weights once each, so at one commit per step this is most of the worker's
    share of the round trip.
    """

    def __init__(self, model):
        super().__init__(model)
        self._access = _TensorFlowAccess(list(model.weights))

    def get_weights(self) -> list[np.ndarray]:
        return self._access.read()

    def set_weights(self, weights) -> None:
        self._access.write(weights)


class _TensorFlowAccess:
    """Reads a fixed list of TensorFlow-backed Keras variables with one traced function, writes them with another."""

    def __init__(self, variables):
        import tensorflow as tf

        tvars = [v.value for v in variables]
        shapes = [tuple(int(d) for d in v.shape) for v in variables]
        self._count = len(variables)
        self._groups = _dtype_groups([v.dtype.as_numpy_dtype for v in tvars])
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
        # the trace each time (benchmarks/README.md, "Keras backends (benchmarks/backends.py)").
        self._read = tf.function(read, autograph=False).get_concrete_function()
        self._write = tf.function(write, input_signature=[signature], autograph=False).get_concrete_function()

    def read(self) -> list[np.ndarray]:
        return [np.array(t) for t in self._read()]

    def write(self, arrays) -> None:
        self._write(_flatten(arrays, self._groups, self._count))


class _KerasAccess:
    """Reads and writes Keras variables one at a time (every backend)."""

    def __init__(self, variables):
        self._variables = list(variables)

    def read(self) -> list[np.ndarray]:
        import keras

        return [np.array(keras.ops.convert_to_numpy(v.value), copy=True) for v in self._variables]

    def write(self, arrays) -> None:
        _check_count(arrays, len(self._variables))
        for variable, array in zip(self._variables, arrays):
            variable.assign(array)


def variable_access(variables):
    """Fast ``read()``/``write(arrays)`` of a fixed list of Keras variables (traced under TensorFlow).

    Between a stepper's steps the variables may be stale (JAX keeps its state
    outside them): call its ``sync_to_model`` first.
    """
    import keras

    variables = list(variables)
    if keras.backend.backend() == "tensorflow" and variables:
        return _TensorFlowAccess(variables)
    return _KerasAccess(variables)


class TorchStepper(Stepper):
    """PyTorch: ``train_function([batch])`` on tensors; weights copied as one flat tensor per dtype under ``no_grad``.

    Keras 3.10-3.15 take ``data[0]`` of the list, later ones iterate it; both
    run one step for a one-batch list. The batch is converted to tensors on
    Keras' device, as ``fit``'s data loader does.
    """

    def __init__(self, model):
        super().__init__(model)
        import torch

        self._torch = torch
        self._tensors = [v.value for v in model.weights]
        self._shapes = [tuple(t.shape) for t in self._tensors]
        self._sizes = [int(np.prod(shape, dtype=np.int64)) for shape in self._shapes]
        self._groups = _dtype_groups([torch.empty((), dtype=t.dtype).numpy().dtype for t in self._tensors])
        self._device = self._tensors[0].device

    def step(self, batch: tuple) -> dict[str, Any]:
        from keras import ops

        def convert(value):
            if value is None:
                return None
            if isinstance(value, dict):
                return {k: convert(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return type(value)(convert(v) for v in value)
            return ops.convert_to_tensor(value)

        return self.model.train_function([convert(tuple(batch))])

    def get_weights(self) -> list[np.ndarray]:
        torch = self._torch
        out: list[np.ndarray | None] = [None] * len(self._tensors)
        with torch.no_grad():
            for _, members in self._groups:
                flat = torch.cat([self._tensors[i].detach().reshape(-1) for i in members]).cpu().numpy()
                offset = 0
                for i in members:
                    out[i] = flat[offset : offset + self._sizes[i]].reshape(self._shapes[i])
                    offset += self._sizes[i]
        return out

    def set_weights(self, weights) -> None:
        torch = self._torch
        flats = _flatten(weights, self._groups, len(self._tensors))
        with torch.no_grad():
            for (_, members), flat in zip(self._groups, flats):
                source = torch.from_numpy(flat).to(self._device)
                offset = 0
                for i in members:
                    self._tensors[i].copy_(source[offset : offset + self._sizes[i]].view(self._shapes[i]))
                    offset += self._sizes[i]


_TRAINABLE, _NON_TRAINABLE, _OPTIMIZER, _METRICS = range(4)


class JaxStepper(Stepper):
    """JAX: the loop owns the jitted train function's state tuple between :meth:`begin_pass` and :meth:`sync_to_model`.

    The state ``(trainable, non_trainable, optimizer, metrics)`` is taken from
    the model's variables (as copies: the train function donates it) at the
    first step after a sync, and assigned back to them by :meth:`sync_to_model`,
    as Keras' ``jax_state_sync`` does at the end of a ``fit`` epoch.
    ``model.weights`` maps to state slots by identity: the non-trainable
    variables also hold ``SeedGenerator`` state, which ``weights`` lacks.
    While the state is live, weights are read with ``jax.device_get`` (copied:
    the next step reuses the buffers) and written with ``jax.device_put``
    straight into the state; otherwise they go to the variables.
    """

    def __init__(self, model):
        super().__init__(model)
        import jax

        self._jax = jax
        slots = {id(v): (_TRAINABLE, i) for i, v in enumerate(model.trainable_variables)}
        slots.update({id(v): (_NON_TRAINABLE, i) for i, v in enumerate(model.non_trainable_variables)})
        missing = [v.path for v in model.weights if id(v) not in slots]
        if missing:
            raise ValueError(f"`model` has weights outside its trainable and non-trainable variables: {missing}")
        self._slots = [slots[id(v)] for v in model.weights]
        self._dtypes = [np.dtype(v.dtype) for v in model.weights]
        self._state: list[list[Any]] | None = None
        self._built = False

    def _variables(self) -> list[list[Any]]:
        model = self.model
        return [list(model.trainable_variables), list(model.non_trainable_variables),
                list(model.optimizer.variables), list(model.metrics_variables)]

    def _take_state(self, batch: tuple) -> None:
        if not self._built:  # create the compiled metrics' variables outside jit, as fit does
            self.model._symbolic_build(data_batch=batch)
            self._built = True
        copy = self._jax.numpy.copy
        self._state = [[copy(v.value) for v in group] for group in self._variables()]

    def begin_pass(self) -> None:
        self.model.make_train_function()
        self.model.reset_metrics()
        if self._state is not None:
            copy = self._jax.numpy.copy
            self._state[_METRICS] = [copy(v.value) for v in self.model.metrics_variables]

    def step(self, batch: tuple) -> dict[str, Any]:
        batch = tuple(batch)
        if self._state is None:
            self._take_state(batch)
        logs, state = self.model.train_function(tuple(self._state), iter([batch]))
        self._state = [list(group) for group in state]
        return logs

    def set_learning_rate(self, rate: float) -> None:
        if self._state is None:
            return super().set_learning_rate(rate)
        optimizer = self.model.optimizer
        variable = inner_optimizer(optimizer)._learning_rate
        for i, v in enumerate(optimizer.variables):
            if v is variable:  # the live state's copy of it
                self._state[_OPTIMIZER][i] = self._jax.numpy.asarray(rate, dtype=v.dtype)
                return
        self.sync_to_model()  # not in the state (never seen): set it where the next step takes the state from
        super().set_learning_rate(rate)

    def get_weights(self) -> list[np.ndarray]:
        if self._state is None:
            values = [v.value for v in self.model.weights]
        else:
            values = [self._state[slot][i] for slot, i in self._slots]
        return [np.array(a, copy=True) for a in self._jax.device_get(values)]

    def set_weights(self, weights) -> None:
        _check_count(weights, len(self._slots))
        arrays = self._jax.device_put([np.asarray(w, dtype=dtype) for w, dtype in zip(weights, self._dtypes)])
        if self._state is None:
            for variable, array in zip(self.model.weights, arrays):
                variable.assign(array)
            return
        for (slot, i), array in zip(self._slots, arrays):
            self._state[slot][i] = array

    def sync_to_model(self) -> None:
        """Assign the loop's state to the model's variables and hand them the state (the next step takes a copy)."""
        if self._state is None:
            return
        for group, values in zip(self._variables(), self._state):
            for variable, value in zip(group, values, strict=True):
                variable.assign(value)
        self._state = None


_STEPPERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BY_BACKEND = {"tensorflow": TensorFlowStepper, "torch": TorchStepper, "jax": JaxStepper}


def stepper(model) -> Stepper:
    """The model's :class:`Stepper` for the running Keras backend, built once per model.

    Args:
        model: a compiled Keras model (its backend's fast stepper), or any
            object with ``get_weights``/``set_weights`` (the slow :class:`Stepper`).
    """
    found = _STEPPERS.get(model)
    if found is None:
        import keras

        kind = Stepper
        if isinstance(model, keras.Model) and model.weights:
            kind = _BY_BACKEND.get(keras.backend.backend(), Stepper)
        found = _STEPPERS[model] = kind(model)
        log.debug("built a %s for %s", kind.__name__, getattr(model, "name", type(model).__name__))
    return found
