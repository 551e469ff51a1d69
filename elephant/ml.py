"""Spark ML pipeline stages around :class:`elephant.SparkModel`.

:class:`KerasEstimator` is a ``pyspark.ml`` Estimator: ``fit(df)`` trains a copy
of a compiled Keras model data-parallel (``SparkModel`` does the work) and
returns a :class:`KerasModel`, a Transformer that adds a prediction column
(and, for classifiers, a probability Vector) to a DataFrame. Both take part in
``Pipeline``, ``CrossValidator`` and ``TrainValidationSplit`` and are saved and
loaded with the rest of a pipeline (``MLWritable`` / ``MLReadable``): the Params
as Spark's own stages store them, the Keras model as a ``.keras`` archive beside
them. Paths are local or shared file systems (the archive is written by the
driver's Python).
"""

from __future__ import annotations

from typing import Any

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasFeaturesCol, HasLabelCol, HasPredictionCol, HasProbabilityCol
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLWritable

from elephant.config import FitArgs, Settings
from elephant.errors import ConfigError

__all__ = ["KerasEstimator", "KerasModel"]

_MODEL_DIR = "model"  # beside metadata/: the .keras archive, one binary row in Parquet
_TASKS = ("classification", "regression")
_SETTINGS, _FIT = Settings.defaults(), FitArgs.defaults()
_MODE, _EPOCHS, _BATCH = _SETTINGS["mode"], _FIT["epochs"], 32  # as SparkModel and its fit (Keras' 32)
_FREQUENCY = ""  # SparkModel's frequency=None: the distributed optimizer's own window
_PLACEMENTS = ("", "driver", "executors")  # SparkModel's ps_placement; "" is None (decided)


def _to_frequency(value: Any) -> str:
    """``frequency`` as a Param string: ``""`` (the optimizer's window), ``"epoch"``, ``"batch"`` or a positive int."""
    text = "" if value is None else str(value)
    if text in ("", "epoch", "batch") or (text.isdigit() and int(text) > 0):
        return text
    raise TypeError(f"frequency must be '', 'epoch', 'batch' or a positive int; received {value!r}")


class _KerasParams(HasFeaturesCol, HasLabelCol, HasPredictionCol, HasProbabilityCol):
    """The Params shared by the estimator and the model it makes."""

    task = Param(Params._dummy(), "task", "'classification' (prediction: the class index, probability: the "
                 "outputs as a Vector) or 'regression' (prediction: the single output)",
                 typeConverter=TypeConverters.toString)
    epochs = Param(Params._dummy(), "epochs", "epochs to train (> 0)", typeConverter=TypeConverters.toInt)
    batchSize = Param(Params._dummy(), "batchSize", "the global batch size (> 0)", typeConverter=TypeConverters.toInt)
    mode = Param(Params._dummy(), "mode", "'asynchronous', 'synchronous' or 'hogwild'",
                 typeConverter=TypeConverters.toString)
    frequency = Param(Params._dummy(), "frequency", "commit every 'epoch', 'batch' or N local steps ('' for the "
                      "optimizer's own window)",
                      typeConverter=_to_frequency)
    optimizer = Param(Params._dummy(), "optimizer", "a distributed optimizer's name ('' for the mode's default)",
                      typeConverter=TypeConverters.toString)
    numWorkers = Param(Params._dummy(), "numWorkers", "data-parallel workers (0: Spark's default parallelism)",
                       typeConverter=TypeConverters.toInt)
    validationSplit = Param(Params._dummy(), "validationSplit", "fraction of the rows held out for val_* metrics",
                            typeConverter=TypeConverters.toFloat)
    verbose = Param(Params._dummy(), "verbose", "Keras' verbose: 0, 1 or 2", typeConverter=TypeConverters.toInt)
    psShards = Param(Params._dummy(), "psShards", "parameter-server shards (0: decided from the model's size)",
                     typeConverter=TypeConverters.toInt)
    psPlacement = Param(Params._dummy(), "psPlacement", "where the parameter server runs: 'driver', 'executors' "
                        "(the first tasks of each epoch) or '' (decided: the driver)",
                        typeConverter=TypeConverters.toString)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(task="classification", epochs=_EPOCHS, batchSize=_BATCH, mode=_MODE, frequency=_FREQUENCY,
                         optimizer="", numWorkers=0, validationSplit=0.0, verbose=0, probabilityCol="probability",
                         psShards=0, psPlacement="")

    def _check(self) -> None:
        checks = [("task", self.getOrDefault(self.task) in _TASKS, f"one of {_TASKS}"),
                  ("epochs", self.getOrDefault(self.epochs) > 0, "> 0"),
                  ("batchSize", self.getOrDefault(self.batchSize) > 0, "> 0"),
                  ("numWorkers", self.getOrDefault(self.numWorkers) >= 0, ">= 0"),
                  ("validationSplit", 0.0 <= self.getOrDefault(self.validationSplit) < 1.0, "in [0, 1)"),
                  ("verbose", self.getOrDefault(self.verbose) in (0, 1, 2), "0, 1 or 2"),
                  ("psShards", self.getOrDefault(self.psShards) >= 0, ">= 0"),
                  ("psPlacement", self.getOrDefault(self.psPlacement) in _PLACEMENTS, f"one of {_PLACEMENTS}")]
        for name, ok, expected in checks:
            if not ok:
                raise ConfigError(f"`{name}` must be {expected}; received {name}={self.getOrDefault(name)!r}")


def _keras_model(model: Any, build_fn: Any) -> Any:
    """A fresh compiled copy of ``model`` (same weights), or what ``build_fn()`` returns."""
    from elephant.model_io import model_from_bytes, model_to_bytes

    built = build_fn() if build_fn is not None else model_from_bytes(model_to_bytes(model))
    if not (hasattr(built, "fit") and hasattr(built, "get_weights") and getattr(built, "optimizer", None)):
        raise ConfigError(f"`model` must be a compiled keras.Model (or `build_fn` return one); received {built!r}")
    return built


class _Writer(DefaultParamsWriter):
    """The stage's Params (Spark's metadata format) plus its Keras archive as a one-row Parquet table.

    The archive goes through Spark's own writer, so the path may be on any
    file system Spark writes to (local, HDFS, S3, ...), as for Spark's own models.
    """

    def saveImpl(self, path: str) -> None:
        from elephant.model_io import model_to_bytes

        model = self.instance._model_to_save()
        super().saveImpl(path)
        frame = self.sparkSession.createDataFrame([(bytearray(model_to_bytes(model)),)], "archive binary")
        frame.write.parquet(_model_path(path))


class _Reader(DefaultParamsReader):
    def load(self, path: str) -> Any:
        from elephant.model_io import model_from_bytes

        instance = super().load(path)
        row = self.sparkSession.read.parquet(_model_path(path)).head()
        if row is None:
            raise ConfigError(f"the saved stage at {path!r} holds no Keras model (an empty {_MODEL_DIR}/ table)")
        instance._keras = model_from_bytes(bytes(row[0]))
        return instance


def _model_path(path: str) -> str:
    return path.rstrip("/") + "/" + _MODEL_DIR


class _Persisted(MLWritable, MLReadable):
    """Saved and loaded as its Params plus a ``.keras`` archive (:class:`_Writer`, :class:`_Reader`)."""

    def write(self) -> _Writer:
        return _Writer(self)

    @classmethod
    def read(cls) -> _Reader:
        return _Reader(cls)


class KerasEstimator(Estimator, _KerasParams, _Persisted):
    """Trains a Keras model on a DataFrame with elephant; ``fit`` returns a :class:`KerasModel`.

    Args:
        model: a compiled ``keras.Model``. Each ``fit`` trains a copy of it (from
            its current weights); the model itself is never changed.
        build_fn: instead of ``model``, a function of no argument returning a
            compiled model, called once per ``fit``. An estimator made with it
            cannot be saved (its code is not data).
        featuresCol, labelCol, predictionCol, probabilityCol: column names;
            features may be a Vector column (``VectorAssembler``,
            ``StandardScaler``) or an array column. ``probabilityCol=""`` adds no
            probability column.
        task: ``"classification"`` (default) or ``"regression"``; said, never
            guessed from the loss.
        epochs, batchSize, mode, frequency, optimizer, numWorkers, psShards,
            psPlacement, validationSplit, verbose: as ``SparkModel`` and
            ``SparkModel.fit`` take them (``frequency=""``, ``optimizer=""``,
            ``numWorkers=0``, ``psShards=0`` and ``psPlacement=""`` keep their
            defaults: the optimizer's window, the mode's optimizer, Spark's
            parallelism, shards decided from the model's size, the driver).
            ``validationSplit`` holds out that fraction of the rows (seeded) and
            evaluates it on the driver after each epoch.

    Raises:
        ConfigError: both a model and a ``build_fn``; at ``fit``, neither, or a
            Param out of range.
    """

    @keyword_only
    def __init__(self, *, model: Any = None, build_fn: Any = None, featuresCol: str = "features",
                 labelCol: str = "label", predictionCol: str = "prediction", probabilityCol: str = "probability",
                 task: str = "classification", epochs: int = _EPOCHS, batchSize: int = _BATCH, mode: str = _MODE,
                 frequency: Any = _FREQUENCY, optimizer: str = "", numWorkers: int = 0, validationSplit: float = 0.0,
                 verbose: int = 0, psShards: int = 0, psPlacement: str = ""):
        super().__init__()
        if model is not None and build_fn is not None:
            raise ConfigError("KerasEstimator takes `model` (a compiled keras.Model) or `build_fn`, not both; "
                              f"received model={model!r}, build_fn={build_fn!r}")
        if build_fn is not None and not callable(build_fn):
            raise ConfigError(f"`build_fn` must be callable; received {build_fn!r}")
        self._keras, self._build_fn = model, build_fn
        kwargs = {k: v for k, v in self._input_kwargs.items() if k not in ("model", "build_fn")}
        self._set(**kwargs)

    def _fit(self, dataset: Any) -> KerasModel:
        from elephant import SparkModel

        self._check()
        if self._keras is None and self._build_fn is None:
            raise ConfigError("KerasEstimator needs `model` (a compiled keras.Model) or `build_fn`; received neither")
        model = _keras_model(self._keras, self._build_fn)
        get = self.getOrDefault
        sm = SparkModel(model, mode=get(self.mode), frequency=_frequency_value(get(self.frequency)),
                        optimizer=get(self.optimizer) or None, num_workers=get(self.numWorkers) or None,
                        ps_shards=get(self.psShards) or None, ps_placement=get(self.psPlacement) or None,
                        spark=dataset.sparkSession)
        features, label = get(self.featuresCol), get(self.labelCol)
        train, validation = dataset, None
        if get(self.validationSplit) > 0:
            train, held_out = dataset.randomSplit([1.0 - get(self.validationSplit), get(self.validationSplit)], seed=0)
            validation = _to_numpy(held_out, features, label)
        history = sm.fit(train, epochs=get(self.epochs), batch_size=get(self.batchSize), verbose=get(self.verbose),
                         validation_data=validation, features_col=features, label_col=label)
        fitted = KerasModel()
        fitted._keras = sm.model
        fitted.history = {k: list(v) for k, v in history.history.items()}
        fitted.fit_plan = dict(sm.fit_plan or {}, mode=sm.mode, window=sm.window)
        return self._copyValues(fitted)

    def _model_to_save(self) -> Any:
        if self._keras is None:
            raise ConfigError("a KerasEstimator made with `build_fn` cannot be saved (a function is code, not data); "
                              "make it with model=build_fn() to save it")
        return self._keras

    def copy(self, extra: Any = None) -> KerasEstimator:
        copied = super().copy(extra)
        copied._keras, copied._build_fn = self._keras, self._build_fn
        return copied


class KerasModel(Model, _KerasParams, _Persisted):
    """A Keras model trained by :class:`KerasEstimator`; ``transform`` adds its predictions.

    ``predictionCol`` holds the class index as a double for classifiers (what
    ``MulticlassClassificationEvaluator`` reads) and the single output as a
    double for regression (what ``RegressionEvaluator`` reads);
    ``probabilityCol`` holds a classifier's outputs as a Vector. Rows and their
    other columns are kept. Attributes: ``keras_model``, ``history`` (the
    training History's dict) and ``fit_plan`` (workers, batch per worker,
    window, optimizer and mode of the fit); the last two are not saved.
    """

    def __init__(self) -> None:
        super().__init__()
        self._keras: Any = None
        self.history: dict[str, list[float]] = {}
        self.fit_plan: dict[str, Any] = {}

    @property
    def keras_model(self) -> Any:
        return self._keras

    def _transform(self, dataset: Any) -> Any:
        from pyspark.ml.functions import array_to_vector
        from pyspark.sql import functions as F

        from elephant import SparkModel

        raw = f"_elephant_output_{self.uid}"
        get = self.getOrDefault
        out = SparkModel(self._keras, spark=dataset.sparkSession).predict(
            dataset, batch_size=get(self.batchSize), features_col=get(self.featuresCol), prediction_col=raw)
        column = F.col(raw)
        if get(self.task) == "regression":
            out = out.withColumn(get(self.predictionCol), column[0].cast("double"))
        else:
            index = F.array_position(column, F.array_max(column)) - 1  # the first largest output
            out = out.withColumn(get(self.predictionCol), index.cast("double"))
            if get(self.probabilityCol):
                out = out.withColumn(get(self.probabilityCol), array_to_vector(column))
        return out.drop(raw)

    def _model_to_save(self) -> Any:
        return self._keras

    def copy(self, extra: Any = None) -> KerasModel:
        copied = super().copy(extra)
        copied._keras, copied.history, copied.fit_plan = self._keras, self.history, self.fit_plan
        return copied


def _frequency_value(text: str) -> Any:
    return int(text) if text.isdigit() else (text or None)


def _to_numpy(df: Any, features_col: str, label_col: str) -> tuple:
    """The held-out rows on the driver, as ``(x, y)`` numpy arrays."""
    import numpy as np

    from elephant import arrow as A

    table = A.selected_dataframe(df, features_col, label_col).toPandas()
    x = np.stack([np.asarray(v, dtype=np.float32) for v in table.iloc[:, 0]]) if len(table) else np.empty((0,))
    return x, table.iloc[:, 1].to_numpy()
