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

import dataclasses
import inspect
import re
from typing import Any

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasFeaturesCol, HasLabelCol, HasPredictionCol, HasProbabilityCol
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLWritable

from elephant.config import FitArgs, Settings
from elephant.errors import ConfigError

__all__ = ["KerasEstimator", "KerasModel", "SETTING_PARAMS"]

_MODEL_DIR = "model"  # beside metadata/: the .keras archive, one binary row in Parquet
_TASKS = ("classification", "regression")
_FIT = FitArgs()  # fit's defaults, resolved (batch_size None is Keras' 32)


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(word.title() for word in rest)


#: Each :class:`~elephant.config.Settings` field is a Param of the estimator (and of the model it makes),
#: named in camelCase (``num_workers``: ``numWorkers``), with the field's default and checked by Settings at ``fit``.
SETTING_PARAMS = {name: _camel(name) for name in Settings.names()}

#: The one translation between Spark ML's Params and Settings: the values that these stages took for "unset"
#: before their Params could hold None (as pipelines saved then hold them) are read as None.
_LEGACY_UNSET = {"frequency": "", "optimizer": "", "num_workers": 0, "ps_shards": 0, "ps_placement": ""}


def _to_frequency(value: Any) -> Any:
    """``frequency`` as Settings takes it: a digit string (as Params once held it) is its int."""
    return int(value) if isinstance(value, str) and value.isdigit() else value


#: Spark's converter of a field's annotation (a Param's value is converted where it is set; None is kept);
#: a field of another annotation, or ``frequency``, is handed to Settings as given.
_CONVERTERS = {"int": TypeConverters.toInt, "int | None": TypeConverters.toInt,
               "float": TypeConverters.toFloat, "float | None": TypeConverters.toFloat,
               "bool": TypeConverters.toBoolean, "bool | None": TypeConverters.toBoolean,
               "str": TypeConverters.toString, "str | None": TypeConverters.toString}


def _converter(field: Any) -> Any:
    base = _to_frequency if field.name == "frequency" else _CONVERTERS.get(str(field.type), lambda value: value)
    unset = _LEGACY_UNSET.get(field.name, object())

    def convert(value: Any) -> Any:
        value = None if value is None else base(value)
        return None if type(value) is type(unset) and value == unset else value

    return convert


def _setting_params() -> dict[str, Param]:
    """One Param per Settings field (:data:`SETTING_PARAMS`)."""
    return {field.name: Param(Params._dummy(), SETTING_PARAMS[field.name], f"as SparkModel's `{field.name}`",
                              typeConverter=_converter(field))
            for field in dataclasses.fields(Settings)}


def _named(exc: ConfigError) -> ConfigError:
    """Settings' or FitArgs' error, with the Param that holds the argument it names."""
    match = re.match(r"`(\w+)`", str(exc))
    camel = _camel(match.group(1)) if match else None
    return ConfigError(f"{exc} (the Param {camel})") if camel and camel != match.group(1) else ConfigError(str(exc))


class _KerasParams(HasFeaturesCol, HasLabelCol, HasPredictionCol, HasProbabilityCol):
    """The Params shared by the estimator and the model it makes: the fit's, and SparkModel's (generated)."""

    task = Param(Params._dummy(), "task", "'classification' (prediction: the class index, probability: the "
                 "outputs as a Vector) or 'regression' (prediction: the single output)",
                 typeConverter=TypeConverters.toString)
    epochs = Param(Params._dummy(), "epochs", "epochs to train (> 0)", typeConverter=TypeConverters.toInt)
    batchSize = Param(Params._dummy(), "batchSize", "the global batch size (> 0)", typeConverter=TypeConverters.toInt)
    validationSplit = Param(Params._dummy(), "validationSplit", "fraction of the rows held out for val_* metrics",
                            typeConverter=TypeConverters.toFloat)
    verbose = Param(Params._dummy(), "verbose", "Keras' verbose: 0, 1 or 2", typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(task="classification", epochs=_FIT.epochs, batchSize=_FIT.batch_size, validationSplit=0.0,
                         verbose=0, probabilityCol="probability")
        self._setDefault(**{SETTING_PARAMS[name]: value for name, value in Settings.defaults().items()})

    def _check(self) -> None:
        """The fit's Params, checked as FitArgs checks them (``task`` here)."""
        get = self.getOrDefault
        if get(self.task) not in _TASKS:
            raise ConfigError(f"`task` must be one of {_TASKS}; received task={get(self.task)!r}")
        try:
            FitArgs(epochs=get(self.epochs), batch_size=get(self.batchSize), verbose=get(self.verbose),
                    validation_split=get(self.validationSplit))
        except ConfigError as exc:
            raise _named(exc) from None

    def _setting_values(self) -> dict[str, Any]:
        """SparkModel's keyword arguments, as the Params hold them."""
        return {name: self.getOrDefault(camel) for name, camel in SETTING_PARAMS.items()}

    def _settings(self) -> Settings:
        """The Params as :class:`~elephant.config.Settings`, checked there; an error names the Param."""
        try:
            return Settings(**self._setting_values())
        except ConfigError as exc:
            raise _named(exc) from None


for _name, _param in _setting_params().items():
    setattr(_KerasParams, _param.name, _param)


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
        epochs, batchSize, validationSplit, verbose: as ``SparkModel.fit``
            takes them. ``validationSplit`` holds out that fraction of the rows
            (seeded) and evaluates it on the driver after each epoch.
        **settings: every :class:`~elephant.SparkModel` setting, as a Param named
            in camelCase (:data:`SETTING_PARAMS`: ``mode``, ``frequency``,
            ``optimizer``, ``numWorkers``, ``readTimeout``, ``seed``,
            ``batchSplit``, ``overlap``, ``epochRetries``, ``onFailure``,
            ``normGuard``, ``commBudget``, ``psShards``, ``psPlacement``...), with
            SparkModel's default and meaning; None is SparkModel's None. The
            values older versions took for unset (``frequency=""``,
            ``optimizer=""``, ``numWorkers=0``, ``psShards=0``,
            ``psPlacement=""``) are read as None.

    Raises:
        ConfigError: both a model and a ``build_fn``; at ``fit``, neither, or a
            Param out of range (Settings' message, naming the Param).
        TypeError: a keyword that is no Param.
    """

    @keyword_only
    def __init__(self, *, model: Any = None, build_fn: Any = None, featuresCol: str = "features",
                 labelCol: str = "label", predictionCol: str = "prediction", probabilityCol: str = "probability",
                 task: str = "classification", epochs: int = _FIT.epochs, batchSize: int = _FIT.batch_size,
                 validationSplit: float = 0.0, verbose: int = 0, **settings: Any):
        super().__init__()
        unknown = sorted(set(settings) - set(SETTING_PARAMS.values()))
        if unknown:
            raise TypeError(f"KerasEstimator got unexpected keyword argument(s) {unknown}; its SparkModel settings "
                            f"are {sorted(SETTING_PARAMS.values())}")
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
        self._settings()
        if self._keras is None and self._build_fn is None:
            raise ConfigError("KerasEstimator needs `model` (a compiled keras.Model) or `build_fn`; received neither")
        model = _keras_model(self._keras, self._build_fn)
        get = self.getOrDefault
        sm = SparkModel(model, spark=dataset.sparkSession, **self._setting_values())
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


def _signature(init: Any) -> inspect.Signature:
    """``init``'s signature with ``**settings`` spelled out: one keyword per :data:`SETTING_PARAMS`, its default."""
    params = [p for p in inspect.signature(init).parameters.values() if p.kind is not p.VAR_KEYWORD]
    defaults = Settings.defaults()
    params += [inspect.Parameter(camel, inspect.Parameter.KEYWORD_ONLY, default=defaults[name])
               for name, camel in SETTING_PARAMS.items()]
    return inspect.Signature(params)


KerasEstimator.__init__.__signature__ = _signature(KerasEstimator.__init__)


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


def _to_numpy(df: Any, features_col: str, label_col: str) -> tuple:
    """The held-out rows on the driver, as ``(x, y)`` numpy arrays."""
    import numpy as np

    from elephant import arrow as A

    table = A.selected_dataframe(df, features_col, label_col).toPandas()
    x = np.stack([np.asarray(v, dtype=np.float32) for v in table.iloc[:, 0]]) if len(table) else np.empty((0,))
    return x, table.iloc[:, 1].to_numpy()
