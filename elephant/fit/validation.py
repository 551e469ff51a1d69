"""The driver's validation pass after an epoch: Keras' ``evaluate`` over one epoch iterator per fit.

``model.evaluate(x, y)`` builds a new epoch iterator at every call (under
TensorFlow a ``tf.data`` pipeline whose functions are traced again), about
30 ms for digits' 450 validation samples (``benchmarks/epoch_cost.py``), a
fixed cost per epoch that a tiny fit notices. Keras' own ``fit`` builds its
validation iterator once and hands it to ``evaluate`` on every epoch
(``_use_cached_eval_dataset=True``): :class:`Validation` does the same, with the
iterator class and arguments the backend's ``evaluate`` builds itself, so the
batches, their order and the logs are the ones ``model.evaluate`` gives. Where
the running Keras keeps no such class (:func:`epoch_iterator_class` None), it
calls ``model.evaluate`` as it is.

The first pass of a fit costs more: building the iterator and tracing the
model's test step, 0.3-0.7 s for the digits MLP, paid after the first epoch's
job on a driver that sat idle during it. :meth:`Validation.warm_up` runs that
pass in a thread while the job runs (its logs are dropped; ``evaluate`` resets
the metrics it reads at its start, so the epoch's own pass is unchanged), where
:func:`warms_up` allows it: the model's test step is Keras' own, which reads the
weights and writes only its metrics. The fit waits for it (:meth:`Validation.close`)
before it sets the epoch's center into the model.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["SparkValidation", "Validation", "epoch_iterator_class", "warms_up"]

#: Each backend's epoch iterator in Keras 3: module, class, whether it takes the model's distribution strategy.
_ITERATORS = {
    "tensorflow": ("keras.src.backend.tensorflow.trainer", "TFEpochIterator", True),
    "jax": ("keras.src.backend.jax.trainer", "JAXEpochIterator", False),
    "torch": ("keras.src.backend.torch.trainer", "TorchEpochIterator", False),
    "numpy": ("keras.src.trainers.epoch_iterator", "EpochIterator", False),
}


def epoch_iterator_class(backend: str) -> tuple[type, bool] | None:
    """``(the class, whether it takes distribute_strategy)`` of ``backend``'s epoch iterator, or None if unknown."""
    where = _ITERATORS.get(backend)
    if where is None:
        return None
    module, name, strategy = where
    try:
        return getattr(importlib.import_module(module), name), strategy
    except (ImportError, AttributeError):  # a Keras that keeps it elsewhere
        return None


#: Backends whose ``evaluate`` reads the model's variables in place. JAX's copies them in and writes
#: them all back at its end, which would undo weights set meanwhile (a failed epoch's kept center).
_WARM_BACKENDS = ("tensorflow", "torch")


def warms_up(model, backend: str, on_copy: bool = False) -> bool:
    """Whether a validation pass may run during an epoch's job.

    Only under :data:`_WARM_BACKENDS` (any backend ``on_copy``: the passes run on a copy of the model, whose
    weights each pass sets first), and only where the model's ``test_step``
    is Keras' own: one written by the user might change state beyond the
    metrics (a counter, a variable), which a pass whose logs are dropped must not do.
    """
    owner = next((c for c in type(model).__mro__ if "test_step" in vars(c)), None)
    return (on_copy or backend in _WARM_BACKENDS) and owner is not None and owner.__module__.startswith("keras.")


class Validation:
    """``model.evaluate`` of one fit's validation data, its epoch iterator built at the first call.

    Args:
        model: the compiled Keras model the driver validates (the fit's model).
        data: ``(x, y)`` or ``(x, y, sample_weight)``.
        batch_size: ``fit``'s ``validation_batch_size`` (None: ``evaluate``'s default).
        backend: the running Keras backend.
    """

    def __init__(self, model, data: Sequence[Any], batch_size: int | None, backend: str):
        self.model, self.batch_size, self.backend = model, batch_size, backend
        self.x, self.y = data[0], data[1]
        self.sample_weight = data[2] if len(data) > 2 else None
        self._found = epoch_iterator_class(backend)
        self._warms = warms_up(model, backend)
        self._copy = None  # a copy of the model the passes run on (evaluate_on)
        self._iterator = None
        self._warming: threading.Thread | None = None
        if self._found is None:
            log.debug("no cached validation iterator for backend %r: model.evaluate builds one per epoch", backend)

    def _epoch_iterator(self):
        if self._iterator is None:
            cls, strategy = self._found
            extra = {"distribute_strategy": self.model.distribute_strategy} if strategy else {}
            self._iterator = cls(x=self.x, y=self.y, sample_weight=self.sample_weight, batch_size=self.batch_size,
                                 steps_per_epoch=None, shuffle=False,
                                 steps_per_execution=self.model.steps_per_execution, **extra)
        return self._iterator

    def evaluate_on(self, copy) -> None:
        """Run the passes on ``copy``, a compiled copy of the model kept per structure (:mod:`elephant.fit.copies`),
        whose test step an earlier fit traced: each pass sets the model's weights into it first."""
        self._copy = copy
        self._warms = warms_up(self.model, self.backend, on_copy=True)

    def warm_up(self) -> None:
        """Build the iterator and trace the test step in a thread, once per fit, if :func:`warms_up` allows.

        Call it when the driver is about to wait (the first epoch's job); the
        next pass, or :meth:`close`, waits for it. A failure is logged and left
        to the next pass, which raises it as ``evaluate`` does.
        """
        if self._found is None or self._iterator is not None or self._warming is not None or not self._warms:
            return

        def run():
            try:
                self._evaluate()
            except Exception as exc:  # the epoch's own pass raises it again
                log.debug("the validation warm-up failed: %r", exc)

        self._warming = threading.Thread(target=run, name="elephant-validation-warm-up", daemon=True)
        self._warming.start()

    def close(self) -> None:
        """Wait for a warm-up still running (the model is the caller's again once the fit returns)."""
        if self._warming is not None:
            self._warming.join()
            self._warming = None

    def __call__(self) -> dict[str, float]:
        """The validation logs of the model's weights now, as ``model.evaluate(..., return_dict=True)`` gives them."""
        self.close()
        return self._evaluate()

    def _evaluate(self) -> dict[str, float]:
        model = self.model
        if self._copy is not None:
            self._copy.set_weights(model.get_weights())
            model = self._copy
        if self._found is None:
            logs = model.evaluate(self.x, self.y, sample_weight=self.sample_weight, batch_size=self.batch_size,
                                  verbose=0, return_dict=True)
        else:
            previous = getattr(model, "_eval_epoch_iterator", None)
            model._eval_epoch_iterator = self._epoch_iterator()  # where Keras' fit keeps it for evaluate
            try:
                logs = model.evaluate(self.x, self.y, sample_weight=self.sample_weight, batch_size=self.batch_size,
                                      verbose=0, return_dict=True, _use_cached_eval_dataset=True)
            finally:
                model._eval_epoch_iterator = previous
        return {k: float(v) for k, v in logs.items()}


class SparkValidation:
    """The validation pass of a fit whose ``validation_data`` is a DataFrame or an RDD: the driver's model
    evaluated on Spark after the epoch (:func:`elephant.inference.evaluate`, one job, each task streaming its
    partition's blocks), with the fit's column names and ``validation_batch_size``.

    Its interface is :class:`Validation`'s: ``warm_up`` and ``close`` have nothing to do (the pass runs on
    executors, which the epoch's job keeps busy).
    """

    def __init__(self, model, data, batch_size: int | None, spark, args, custom_objects=None):
        self.model, self.data, self.batch_size, self.spark = model, data, batch_size, spark
        self.columns = {"features_col": args.features_col, "label_col": args.label_col, "weight_col": args.weight_col}
        self.custom_objects = custom_objects

    def warm_up(self) -> None:
        """Nothing to warm: the pass runs on the executors."""

    def close(self) -> None:
        """Nothing runs between passes."""

    def __call__(self) -> dict[str, float]:
        """The validation logs of the model's weights now, as ``SparkModel.evaluate(..., return_dict=True)``."""
        from elephant.inference import evaluate

        logs = evaluate(self.model, self.data, None, self.batch_size, return_dict=True, num_workers=None,
                        spark=self.spark, custom_objects=self.custom_objects, **self.columns)
        return {k: float(v) for k, v in logs.items()}
