"""DataFrames as numpy blocks, through Arrow: whole columns converted at once, never row by row.

The JVM selects the feature, label and weight columns (Vectors turned into
arrays by ``vector_to_array``) and writes them as Arrow record batches that
each Python task reads (:func:`arrow_batches`; ``mapInArrow`` where the result
must be a DataFrame, as under Spark Connect), and :func:`arrow_tensor` turns a
column into one numpy array per batch. Never a Row object or a pickle per row.
:func:`pack_arrays` writes arrays as raw bytes with dtype/shape headers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from elephant.data import checked_blocks
from elephant.errors import DataError

__all__ = ["arrow_batches", "arrow_block_reader", "arrow_tensor", "dataframe_blocks", "dataframe_columns", "pack_arrays",
           "selected_dataframe", "unpack_arrays"]


def dataframe_columns(df, features_col: str | Sequence[str], extra: Sequence[str] = ()) -> list:
    """Column expressions selecting the features (Vectors as arrays) and ``extra`` columns of ``df``.

    Raises:
        DataError: a column is missing or has a type that holds no features.
    """
    from pyspark.sql import functions as F
    from pyspark.ml.functions import vector_to_array

    cols = [features_col] if isinstance(features_col, str) else list(features_col)
    missing = [c for c in cols + list(extra) if c not in df.columns]
    if missing:
        raise DataError(f"DataFrame has no column(s) {missing}; its columns are {df.columns}")
    exprs = []
    for c in cols:
        kind = type(df.schema[c].dataType).__name__
        if kind == "VectorUDT":
            exprs.append(vector_to_array(F.col(c), dtype="float32").alias(c))
        elif kind in ("ArrayType",) or kind.endswith(_NUMERIC):
            exprs.append(F.col(c))
        else:
            raise DataError(f"column {c!r} has type {df.schema[c].dataType.simpleString()}; expected a Vector, an array or a number")
    if len(cols) > 1:
        scalar = [c for c in cols if not type(df.schema[c].dataType).__name__.endswith(_NUMERIC)]
        if scalar:
            raise DataError(f"a list of `features_col` stacks numeric columns; {scalar} are not numeric")
        exprs = [F.array(*[F.col(c).cast("float") for c in cols]).alias("features")]
    return exprs + [F.col(c) for c in extra]


def arrow_tensor(column: Any, name: str, dtype: Any = np.float32) -> np.ndarray:
    """An Arrow column (one sample per row) as an array: a number per row gives ``(n, 1)``,
    an array per row ``(n, d)``, nested arrays ``(n, d1, d2, ...)``; no Python loop over rows.

    Raises:
        DataError: nulls, or arrays of different lengths in the column.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    n, shape, values = len(column), [len(column)], column
    if values.null_count:
        raise DataError(f"column {name!r} holds {values.null_count} null(s) in a batch of {n} rows")
    while pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or pa.types.is_fixed_size_list(values.type):
        lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
        if len(lengths) and lengths.min() != lengths.max():
            raise DataError(f"column {name!r} holds arrays of different lengths ({lengths.min()} to {lengths.max()}); "
                            "every sample needs the same shape")
        shape.append(int(lengths[0]) if len(lengths) else 0)
        values = values.flatten()
        if values.null_count:
            raise DataError(f"column {name!r} holds {values.null_count} null element(s) in its arrays")
    flat = values.to_numpy(zero_copy_only=False)
    if flat.dtype.kind not in "biuf":
        raise DataError(f"column {name!r} holds {values.type} values; expected numbers")
    if dtype is not None:
        flat = flat.astype(dtype, copy=False)
    out = flat.reshape(shape)
    return out[:, None] if out.ndim == 1 and dtype is np.float32 else out


def pack_arrays(arrays: Sequence[np.ndarray | None]) -> bytes:
    """Arrays (or None) as bytes: a JSON header of dtypes and shapes, then the raw data. No pickle."""
    import json

    parts = [None if a is None else np.ascontiguousarray(a) for a in arrays]
    header = json.dumps([None if a is None else [a.dtype.str, list(a.shape)] for a in parts]).encode()
    return b"".join([len(header).to_bytes(4, "little"), header] + [a.tobytes() for a in parts if a is not None])


def unpack_arrays(data: bytes) -> tuple:
    """The arrays of :func:`pack_arrays` (writable copies)."""
    import json

    size = int.from_bytes(data[:4], "little")
    offset, out = 4 + size, []
    for spec in json.loads(data[4:offset]):
        if spec is None:
            out.append(None)
            continue
        dtype, shape = np.dtype(spec[0]), tuple(spec[1])
        count = int(np.prod(shape, dtype=np.int64))
        out.append(np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape).copy())
        offset += count * dtype.itemsize
    return tuple(out)


def selected_dataframe(df, features_col: str | Sequence[str], label_col: str | None, weight_col: str | None = None):
    """``df`` selected to the features (as one array column), the label and the weight, checked.

    Raises:
        DataError: a column is missing or of a type that cannot hold what it should.
    """
    extra = [c for c in (label_col, weight_col) if c]
    exprs = dataframe_columns(df, features_col, extra)
    if weight_col and not type(df.schema[weight_col].dataType).__name__.endswith(_NUMERIC):
        raise DataError(f"`weight_col` {weight_col!r} has type {df.schema[weight_col].dataType.simpleString()}; "
                        "expected a number per row")
    return df.select(*exprs)


def arrow_block_reader(features_col: str | Sequence[str], label_col: str | None, weight_col: str | None = None):
    """A function from one Arrow batch of :func:`selected_dataframe`'s columns to a block."""
    features_name = features_col if isinstance(features_col, str) else "features"
    has_label, has_weight = label_col is not None, weight_col is not None

    def read(batch) -> tuple:
        x = arrow_tensor(batch.column(0), features_name)
        y = arrow_tensor(batch.column(1), label_col, dtype=None) if has_label else None
        if not has_weight:
            return x, y
        weights = batch.column(batch.num_columns - 1)
        w = weights.fill_null(float("nan")).to_numpy(zero_copy_only=False).astype(np.float32)
        if not np.all(np.isfinite(w)):
            raise DataError(f"`weight_col` {weight_col!r} holds null, NaN or infinite weights")
        return x, y, w

    return read


def dataframe_blocks(df, features_col: str | Sequence[str], label_col: str | None, weight_col: str | None = None):
    """An RDD of ``(x_block, y_block)`` (``(x_block, y_block, w_block)`` with ``weight_col``) from a DataFrame.

    ``features_col`` may name a Vector column, an array column or a scalar
    column, or be a list of scalar columns (stacked into one feature vector);
    ``weight_col`` names a numeric column of sample weights. The JVM writes each
    partition as Arrow record batches (``spark.sql.execution.arrow.maxRecordsPerBatch``
    rows each), the Python task reads each into one block by whole-column
    operations (its arrays are read-only views of the batch); a partition
    reaches its task as a stream of those blocks, never merged into one. No
    Row object is made and no Python stage runs before the task's own.
    """
    selected = selected_dataframe(df, features_col, label_col, weight_col)
    read = arrow_block_reader(features_col, label_col, weight_col)
    schema = _arrow_schema(selected)

    def to_blocks(messages):
        import pyarrow as pa

        for message in messages:
            batch = pa.ipc.read_record_batch(pa.py_buffer(message), schema)
            if batch.num_rows:
                yield read(batch)

    return arrow_batches(selected).mapPartitions(lambda messages: checked_blocks(to_blocks(messages)))


def arrow_batches(df):
    """A classic DataFrame's partitions as an RDD of serialized Arrow record batches (IPC messages without
    their schema), written by the JVM as ``toPandas`` writes them: the rows never pass through a Python stage
    of their own, and no Row object is made."""
    from pyspark.rdd import RDD
    from pyspark.serializers import NoOpSerializer

    return RDD(df._jdf.toArrowBatchRdd().toJavaRDD(), df.sparkSession.sparkContext, NoOpSerializer())


def _arrow_schema(df) -> Any:
    """The Arrow schema of the batches the JVM writes for ``df`` (large string and binary types where the
    session asks for them, pyspark 4)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if df.sparkSession.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false").lower() == "true":
        return to_arrow_schema(df.schema, prefers_large_types=True)
    return to_arrow_schema(df.schema)


_NUMERIC = ("IntegerType", "LongType", "FloatType", "DoubleType", "ShortType", "ByteType", "DecimalType")
