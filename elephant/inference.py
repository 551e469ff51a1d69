"""Distributed predict and evaluate; every partition rebuilds the model once per process."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from elephant import arrow as A
from elephant import data as D
from elephant import framework, session
from elephant.errors import DataError
from elephant.model_io import model_fingerprint, model_to_bytes
from elephant.sources import DataFrameSource, RDDSource, source

__all__ = ["predict", "evaluate", "ModelShipment"]


class ModelShipment:
    """A model's archive broadcast to executors, rebuilt at most once per Python worker of the driver's backend."""

    def __init__(self, sc, model, custom_objects=None):
        self.fingerprint = model_fingerprint(model)
        self.broadcast = sc.broadcast(model_to_bytes(model))
        self.custom_objects = custom_objects or None
        self.backend = framework.current_backend()
        framework.ship(sc, self.backend)

    def spec(self) -> tuple:
        """What a task needs: ``(broadcast, fingerprint, custom_objects, backend)``."""
        return (self.broadcast, self.fingerprint, self.custom_objects, self.backend)

    def close(self) -> None:
        self.broadcast.unpersist()


def inline_spec(model, custom_objects=None) -> tuple:
    """:meth:`ModelShipment.spec` without a broadcast (Spark Connect has none): the archive travels in the task."""
    return (model_to_bytes(model), model_fingerprint(model), custom_objects or None, framework.current_backend())


def _model(spec):
    from elephant import replicas

    broadcast, fp, custom_objects, backend = spec
    framework.enter_task(backend, "an inference task")
    replicas.limit_threads(1)
    return replicas.cached_model(broadcast, fp, "inference", custom_objects)


def predict(model, x, batch_size, *, num_workers, spark, custom_objects=None,
            features_col: str | Sequence[str] = "features", prediction_col: str = "prediction"):
    data = source(x)
    if isinstance(data, DataFrameSource):
        if session.is_connect(x.sparkSession):  # no broadcasts: the model travels in the UDF
            spec = inline_spec(model, custom_objects)
        else:
            spec = ModelShipment(x.sparkSession.sparkContext, model, custom_objects).spec()
        return _predict_dataframe(x, spec, batch_size, features_col, prediction_col)
    session.require_classic(spark, "predict on numpy arrays or an RDD")
    sc = spark.sparkContext
    data.checked_features(model)
    ship = ModelShipment(sc, model, custom_objects)
    spec = ship.spec()
    if isinstance(data, RDDSource):
        return _predict_rdd(x, spec, batch_size, D.model_input_shapes(model))

    def task(blocks):
        from elephant.replicas import predict_block

        m = _model(spec)
        return [predict_block(m, b, batch_size) for b in blocks]

    try:
        blocks = D.ordered_blocks(x, num_workers)
        # collect() returns partitions in order, so the output keeps the input order
        with session.job_description(sc, f"elephant predict: {D.num_samples(x)} samples on {len(blocks)} partitions"):
            parts = sc.parallelize(blocks, len(blocks)).mapPartitions(task).collect()
    finally:
        ship.close()
    return D.concat_outputs(parts)


def rdd_predictions(items: Any, predict: Any, expected_shapes: list[tuple] | None):
    """Inside a task: predictions for a partition of records, bare feature vectors or blocks.

    ``predict(x_block)`` returns one output row per input row. Blocks give one
    output block each; records and vectors give one output per element, in
    order, converted :data:`elephant.data.CHUNK_ROWS` at a time (the partition
    is never one Python list). The format is read from the first element.
    """
    it = iter(items)
    first = next(it, None)
    if first is None:
        return
    items = itertools.chain([first], it)
    labelled = isinstance(first, tuple) and len(first) in (2, 3)
    if labelled and D.records_are_blocks(first, expected_shapes):
        for block in items:
            yield predict(block[0])
        return
    for chunk in D.chunked(items):
        yield from predict(np.asarray([r[0] if labelled else r for r in chunk], dtype=np.float32))


def with_predictions(df, features_col: str | Sequence[str], prediction_col: str, predict: Any, vote: bool = False):
    """``df`` with a ``prediction_col`` column, lazily: ``predict(x_block)`` runs in an Arrow UDF.

    The features reach Python as Arrow batches and leave as one Arrow array per
    batch: no Row objects, every other column stays in the JVM, and rows keep
    their order. ``predict`` returns one output per row: ``array<float>``, or a
    ``bigint`` class with ``vote=True``.

    Raises:
        DataError: a features column is missing, or ``prediction_col`` exists.
    """
    from pyspark.sql import types as T

    if prediction_col in df.columns:
        raise DataError(f"DataFrame already has a column {prediction_col!r}; pass another prediction_col")
    (features,) = A.dataframe_columns(df, features_col)
    name = features_col if isinstance(features_col, str) else "features"

    def batches(columns):
        import pyarrow as pa

        for group in _grouped(columns, PREDICT_ROWS):
            x = np.concatenate([A.arrow_tensor(column, name) for column in group])
            out = np.asarray(predict(x))
            start = 0
            for column in group:  # one output array per input array, of the same length
                part, start = out[start:start + len(column)], start + len(column)
                if vote:
                    yield pa.array(part.astype(np.int64))
                    continue
                part = part.reshape(len(part), -1).astype(np.float32, copy=False)
                offsets = np.arange(len(part) + 1, dtype=np.int32) * part.shape[1]
                yield pa.ListArray.from_arrays(pa.array(offsets), pa.array(part.ravel()))

    return_type = T.LongType() if vote else T.ArrayType(T.FloatType())
    return df.withColumn(prediction_col, _arrow_iter_udf(batches, return_type)(features))


#: Rows predicted per call in a DataFrame's Arrow UDF: Spark's Arrow batches (10,000 rows by
#: default) are grouped up to this many, so that few batches are a group's short last one (padded).
PREDICT_ROWS = 65536


def _grouped(columns: Any, rows: int) -> Any:
    """Consecutive Arrow arrays in lists of about ``rows`` rows (at least one array each)."""
    group, count = [], 0
    for column in columns:
        group.append(column)
        count += len(column)
        if count >= rows:
            yield group
            group, count = [], 0
    if group:
        yield group


def _arrow_iter_udf(fn: Any, return_type: Any):
    """An iterator UDF over Arrow arrays: ``arrow_udf`` (Spark 4.1+), else a pandas UDF around it."""
    from pyspark.sql import functions as F

    if hasattr(F, "arrow_udf"):
        from collections.abc import Iterator

        import pyarrow as pa

        def arrays(columns):
            return fn(columns)

        # pyspark reads the UDF's kind from its type hints (evaluated objects: this module
        # defers annotations, and the names would not resolve in the workers)
        arrays.__annotations__ = {"columns": Iterator[pa.Array], "return": Iterator[pa.Array]}
        return F.arrow_udf(arrays, return_type)

    from collections.abc import Iterator

    def through_pandas(series_batches):
        import pyarrow as pa

        for series in series_batches:
            for out in fn(iter([pa.array(series)])):
                yield out.to_pandas()

    import pandas as pd

    through_pandas.__annotations__ = {"series_batches": Iterator[pd.Series], "return": Iterator[pd.Series]}
    return F.pandas_udf(through_pandas, return_type)


def _predict_rdd(rdd, spec, batch_size, expected_shapes):
    def task(items):
        from elephant.replicas import predict_block

        # _model is cached per Python worker; it is built only if the partition has rows
        return rdd_predictions(items, lambda x: predict_block(_model(spec), x, batch_size), expected_shapes)

    return rdd.mapPartitions(task)


def _predict_dataframe(df, spec, batch_size, features_col, prediction_col):
    def predict(x):
        from elephant.replicas import predict_block

        return predict_block(_model(spec), x, batch_size)  # _model is cached per Python worker

    return with_predictions(df, features_col, prediction_col, predict)


def evaluate(model, x, y, batch_size, *, return_dict, num_workers, spark, custom_objects=None,
             features_col="features", label_col="label", sample_weight=None, weight_col=None):
    data = source(x, y)
    connect = data.spark is not None and session.is_connect(data.spark)
    if connect:  # DataFrame APIs only: Arrow batches in, one JSON row per partition out
        spec, ship = inline_spec(model, custom_objects), None
    else:
        session.require_classic(spark, "evaluate on numpy arrays or an RDD")
        sc = spark.sparkContext
        # x, y and the weights were refused or checked by SparkModel.evaluate (Source.refuse, checked_weights)
        rdd = data.labeled_blocks(model, sc, num_workers, features_col=features_col, label_col=label_col,
                                          weight_col=weight_col, sample_weight=sample_weight)
        ship = ModelShipment(sc, model, custom_objects)
        spec = ship.spec()

    def task(blocks):
        from elephant.replicas import evaluate_block, weighted_metric_keys

        out = []
        m = None
        for block in blocks:
            xb, yb, wb = D.unpack(block)
            count = D.num_samples(xb)
            if count:
                m = m or _model(spec)
                logs = evaluate_block(m, xb, yb, batch_size, wb)
                out.append((count, logs, count if wb is None else float(np.sum(wb)), weighted_metric_keys(m)))
        return out

    if connect:
        return combine_partition_logs(_evaluate_arrow(x, task, features_col, label_col, weight_col), return_dict)
    try:
        with session.job_description(sc, "elephant evaluate"):
            parts = rdd.mapPartitions(task).collect()
    finally:
        ship.close()
    return combine_partition_logs(parts, return_dict)


def _evaluate_arrow(df, task, features_col, label_col, weight_col) -> list[tuple]:
    """``task`` over each partition's blocks, one per Arrow batch, through ``mapInArrow`` (no RDD: works under
    Spark Connect)."""
    import json

    read = A.arrow_block_reader(features_col, label_col, weight_col)

    def parts(batches):
        import pyarrow as pa

        out = task(read(batch) for batch in batches if batch.num_rows)  # block by block, as it streams
        yield pa.RecordBatch.from_arrays([pa.array([json.dumps(out)])], ["parts"])

    rows = A.selected_dataframe(df, features_col, label_col, weight_col).mapInArrow(parts, "parts string").collect()
    return [tuple(part) for row in rows for part in json.loads(row[0])]


def combine_partition_logs(parts: list[tuple], return_dict: bool) -> Any:
    """Partitions' ``(count, logs)`` or ``(count, logs, weight_sum, weighted_keys)`` combined, as Keras' ``evaluate`` returns them.

    A dict if ``return_dict``; else the loss first, then the metrics (a bare
    float when there is only the loss).
    """
    if not parts:
        raise DataError("`x` holds no samples to evaluate")
    result = mean_logs(parts)
    result = {k: result[k] for k in sorted(result, key=lambda k: k != "loss")}  # Keras' order: loss first
    return keras_evaluate_result(result, return_dict)


def mean_logs(parts: Sequence[tuple]) -> dict[str, float]:
    """The mean of partitions' logs, each partition weighing as much as its samples did in Keras' own mean.

    A part is ``(count, logs)`` or ``(count, logs, weight_sum, weighted_keys)``.
    The loss and plain metrics are means over samples (Keras' loss is the sum
    of weighted losses over the batch size), so partitions weigh by ``count``;
    ``weighted_metrics`` (``weighted_keys``) are means over the sample weights,
    so partitions weigh by ``weight_sum``. Exact for mean-type metrics.
    """
    parts = [p for p in parts if p[0] > 0 and p[1]]
    if not parts:
        return {}
    out = {}
    for key in parts[0][1]:
        by_weight = [(p[2] if len(p) > 2 and key in p[3] else p[0], p[1][key]) for p in parts]
        total = sum(w for w, _ in by_weight)
        out[key] = float(sum(w * v for w, v in by_weight) / total) if total else float("nan")
    return out


def keras_evaluate_result(logs: dict[str, float], return_dict: bool) -> Any:
    """``logs`` (loss first) as ``keras.Model.evaluate`` returns them: the dict, a list, or a bare loss."""
    if return_dict:
        return logs
    values = list(logs.values())
    return values[0] if len(values) == 1 else values
