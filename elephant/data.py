"""numpy blocks: the checks of data and weights, the shard split, and records stacked into blocks.

A *block* is ``(x_block, y_block)`` or ``(x_block, y_block, w_block)``:
``x_block`` is an array, or a list/dict of arrays for multi-input models;
``y_block`` likewise for multi-output models (``None`` when there are no
labels); ``w_block`` holds the samples' weights, as Keras' ``sample_weight``. Each partition of the training RDD holds
one block, so the training hot path works on whole arrays and never loops over
rows in Python. RDDs of records and DataFrames are converted to blocks once per
fit and cached (DataFrames through Arrow: :mod:`elephant.arrow`; the input kinds
themselves: :mod:`elephant.sources`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from elephant.errors import DataError

log = logging.getLogger(__name__)

__all__ = [
    "is_rdd",
    "is_dataframe",
    "num_samples",
    "take",
    "take_block",
    "repeat_last",
    "split_numpy",
    "ordered_blocks",
    "concat_outputs",
    "unpack",
    "check_xy",
    "check_sample_weight",
    "check_class_weight",
    "class_weight_labels",
    "class_weights_to_sample_weights",
    "add_class_weights",
    "check_features",
    "stack_records",
    "checked_blocks",
    "row_bytes",
    "stream_summary",
    "records_are_blocks",
    "partition_to_blocks",
    "concat_blocks",
]


def is_rdd(x: Any) -> bool:
    return type(x).__name__ in ("RDD", "PipelinedRDD") and hasattr(x, "mapPartitions")


def is_dataframe(x: Any) -> bool:
    return type(x).__name__ == "DataFrame" and hasattr(x, "schema")


def check_input_kind(x: Any, name: str = "x") -> None:
    """Refuse what cannot be split across Spark tasks, naming the type received.

    Accepted: numpy arrays (or anything ``np.asarray`` takes, such as a tensor
    or a pandas frame), a list/tuple/dict of them, an RDD or a DataFrame.
    """
    if is_rdd(x) or is_dataframe(x) or isinstance(x, (np.ndarray, list, tuple, Mapping)) or hasattr(x, "__array__"):
        return
    kind = f"{type(x).__module__}.{type(x).__qualname__}"
    streaming = hasattr(x, "__iter__") or hasattr(x, "__getitem__")
    reason = (" (a dataset, generator or keras.utils.PyDataset is read by one process and cannot be split "
              "across Spark executors)") if streaming else ""
    raise DataError(f"`{name}` must be numpy arrays (a list or dict of them for several inputs), an RDD or a "
                    f"Spark DataFrame; received {kind}{reason}. Convert it to numpy, or load it as a DataFrame")


def _leaves(x: Any) -> list[np.ndarray]:
    if isinstance(x, Mapping):
        return [np.asarray(v) for v in x.values()]
    if isinstance(x, (list, tuple)):
        return [np.asarray(v) for v in x]
    return [np.asarray(x)]


def _map(x: Any, fn):
    if isinstance(x, Mapping):
        return {k: fn(np.asarray(v)) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [fn(np.asarray(v)) for v in x]
    return fn(np.asarray(x))


def num_samples(x: Any, name: str = "x") -> int:
    """Number of samples in an array or a list/dict of arrays (all must agree)."""
    leaves = _leaves(x)
    if not leaves:
        raise DataError(f"`{name}` holds no arrays; received {name}={x!r}")
    lengths = {len(a) if a.ndim else 0 for a in leaves}
    if len(lengths) != 1:
        raise DataError(f"the arrays of `{name}` have different lengths: {sorted(lengths)}")
    return lengths.pop()


def take(x: Any, index) -> Any:
    """Rows ``index`` (a slice or an index array) of every array in ``x``."""
    if x is None:
        return None
    return _map(x, lambda a: a[index])


def repeat_last(x: Any, count: int) -> Any:
    """``x`` with its last row repeated ``count`` more times, in every array."""
    return _map(x, lambda a: np.concatenate([a, np.repeat(a[-1:], count, axis=0)]))


def take_block(block: tuple, index) -> tuple:
    """Rows ``index`` of every part of a block (``(x, y)`` or ``(x, y, w)``; ``y`` may be None)."""
    return tuple(take(part, index) for part in block)


def concat_outputs(parts: list[Any]) -> Any:
    """Predictions of consecutive blocks joined in order (arrays, or lists/dicts of them for several outputs)."""
    parts = [p for p in parts if p is not None]
    if isinstance(parts[0], dict):
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    if isinstance(parts[0], (list, tuple)):
        return [np.concatenate([p[i] for p in parts]) for i in range(len(parts[0]))]
    return np.concatenate(parts)


def ordered_blocks(x: Any, num_workers: int) -> list[Any]:
    """``x`` cut into at most ``num_workers`` contiguous blocks, in order (for predictions that keep it)."""
    n = num_samples(x)
    return [take(x, idx) for idx in np.array_split(np.arange(n), min(num_workers, n))]


def split_numpy(x: Any, y: Any, num_parts: int, seed: int | None = 0, sample_weight: Any = None) -> list[tuple]:
    """Split ``(x, y)`` (and ``sample_weight`` when given) into ``num_parts`` blocks of near-equal size.

    Rows are shuffled once with ``seed`` (``None`` keeps the given order) so that
    each worker sees a representative shard even when the input is sorted.
    """
    n = num_samples(x)
    order = np.arange(n) if seed is None else np.random.default_rng(seed).permutation(n)
    parts = np.array_split(order, num_parts)
    if sample_weight is None:
        return [(take(x, idx), take(y, idx)) for idx in parts]
    return [(take(x, idx), take(y, idx), take(sample_weight, idx)) for idx in parts]


def unpack(block: tuple) -> tuple[Any, Any, Any]:
    """``(x, y, w)`` of a block, ``w`` None when the block carries no weights."""
    return (block[0], block[1], block[2]) if len(block) == 3 else (block[0], block[1], None)


def check_sample_weight(sample_weight: Any, n: int, name: str = "sample_weight") -> np.ndarray:
    """``sample_weight`` as a float array of ``n`` finite weights (Keras' shapes: ``(n,)``, or more dims)."""
    w = np.asarray(sample_weight)
    if w.dtype == object or not (np.issubdtype(w.dtype, np.number) or w.dtype == bool):
        raise DataError(f"`{name}` must be numbers, one weight per sample; received an array of dtype {w.dtype}")
    if w.ndim == 0 or len(w) != n:
        got = "a scalar" if w.ndim == 0 else f"{len(w)} weights"
        raise DataError(f"`{name}` must hold one weight per sample ({n}); received {got}")
    w = w.astype(np.float32)
    if not np.all(np.isfinite(w)):
        raise DataError(f"`{name}` holds {int(np.sum(~np.isfinite(w)))} NaN or infinite weights")
    return w


def check_class_weight(class_weight: Any) -> dict[int, float]:
    """Keras' ``class_weight``: a dict from class index to a finite weight."""
    if not isinstance(class_weight, Mapping) or not class_weight:
        raise DataError("`class_weight` must be a dict from class index to weight, e.g. {0: 1.0, 1: 5.0}; "
                        f"received {type(class_weight).__name__}")
    out = {}
    for k, v in class_weight.items():
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise DataError(f"`class_weight` keys must be class indices (ints); received key {k!r}")
        if isinstance(v, bool) or not isinstance(v, (int, float, np.number)) or not np.isfinite(v):
            raise DataError(f"`class_weight` values must be finite numbers; received {k!r}: {v!r}")
        out[int(k)] = float(v)
    return out


def class_weight_labels(y: Any) -> np.ndarray:
    """The one label array ``class_weight`` applies to; refuses multi-output labels and odd shapes (cheap)."""
    if isinstance(y, (Mapping, list, tuple)) and not isinstance(y, np.ndarray):
        leaves = _leaves(y)
        if len(leaves) != 1:
            raise DataError("`class_weight` works with single-output models only (as in Keras); "
                            f"received labels for {len(leaves)} outputs. Pass sample weights instead")
        y = leaves[0]
    labels = np.asarray(y)
    if labels.ndim > 2:
        raise DataError(f"`class_weight` needs labels of shape (n,), (n, 1) or (n, classes); received {labels.shape}")
    return labels


def class_weights_to_sample_weights(y: Any, class_weight: Mapping[int, float]) -> np.ndarray:
    """Each sample's weight from its class, as Keras does (missing classes weigh 1).

    The class is the label itself for sparse labels (``(n,)`` or ``(n, 1)``,
    rounded) and the arg-max for one-hot or probability labels ``(n, C)``.
    """
    labels = class_weight_labels(y)
    if labels.ndim == 2:
        labels = labels[:, 0] if labels.shape[1] == 1 else np.argmax(labels, axis=-1)
    classes = np.round(labels).astype(np.int64)
    weights = np.ones(len(classes), dtype=np.float32)
    for cls, weight in class_weight.items():
        weights[classes == cls] = weight
    return weights


def add_class_weights(class_weight: Mapping[int, float]):
    """A ``map`` function giving each ``(x, y)`` block its class weights (a block with weights is refused)."""

    def add(block: tuple) -> tuple:
        x, y, w = unpack(block)
        if w is not None:
            raise DataError("the data carries sample weights and `class_weight` was given; pass one of them "
                            "(Keras refuses both together)")
        return x, y, class_weights_to_sample_weights(y, class_weight)

    return add


def check_xy(x: Any, y: Any) -> int:
    """Validate numpy ``x``/``y`` and return the number of samples."""
    n = num_samples(x, "x")
    if n == 0:
        raise DataError("`x` is empty (0 samples); elephant needs at least one sample to train")
    if y is not None:
        ny = num_samples(y, "y")
        if ny != n:
            raise DataError(f"`x` and `y` have different lengths: x has {n} samples, y has {ny}")
    for a in _leaves(x):
        if a.dtype == object:
            raise DataError("`x` holds an object array; convert it to a numeric dtype first")
    return n


def check_validation_data(model, data: Any) -> None:
    """Validate ``validation_data=(x_val, y_val[, sample_weight])`` against the model."""
    names = ("validation_data[0]", "validation_data[1]", "validation_data[2]")
    n = num_samples(data[0], names[0])
    if n == 0:
        raise DataError(f"`{names[0]}` is empty (0 samples)")
    for name, part in zip(names[1:], data[1:]):
        if part is None:
            continue
        m = num_samples(part if isinstance(part, (list, dict)) else np.asarray(part), name)
        if m != n:
            raise DataError(f"`{name}` has {m} samples but `{names[0]}` has {n}")
    check_features(model, data[0], names[0])


def model_input_shapes(model) -> list[tuple] | None:
    """Per-input shapes without the batch dimension, or None when unknown."""
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        return None
    if not inputs:
        return None
    return [tuple(t.shape[1:]) for t in inputs]


def check_features(model, x: Any, name: str = "x") -> None:
    """Raise ``DataError`` unless the feature shapes of ``x`` fit the model's inputs."""
    expected = model_input_shapes(model)
    if expected is None:
        return
    names = [getattr(t, "name", None) for t in model.inputs]
    if isinstance(x, Mapping) and all(n in x for n in names):
        x = [x[n] for n in names]  # dict inputs are matched by input name
    leaves = _leaves(x)
    if len(leaves) != len(expected):
        raise DataError(f"the model has {len(expected)} inputs but `{name}` provides {len(leaves)} arrays")
    for i, (a, want) in enumerate(zip(leaves, expected)):
        got = tuple(a.shape[1:])
        ok = len(got) == len(want) and all(w is None or w == g for w, g in zip(want, got))
        if not ok:
            where = name if len(expected) == 1 else f"{name}[{i}]"
            raise DataError(
                f"`{where}` has feature shape {got} but the model expects {tuple(want)} "
                f"(shape without the batch dimension; None matches any size)"
            )


def shape_summary(block) -> list[tuple]:
    """The feature shapes of a block (its sample axis left out), one per input."""
    return [tuple(a.shape[1:]) for a in _leaves(block[0])]


def stream_summary(blocks: Iterable[tuple]) -> tuple[int, list[tuple], float]:
    """A partition's ``(rows, feature shapes of its first block, bytes of one row)``, read as a stream of blocks."""
    rows, shapes, size = 0, [], 0.0
    for block in blocks:
        if not rows:
            shapes, size = shape_summary(block), row_bytes(block)
        rows += num_samples(block[0])
    return rows, shapes, size


def checked_samples(model, parts: Sequence[tuple[int, Sequence[Sequence[int]]]]) -> int:
    """The training samples of the partitions that hold data, ``(samples, feature shapes)`` each, checked.

    Raises:
        DataError: no samples at all, or features whose shapes do not fit the model.
    """
    total = sum(n for n, _ in parts)
    if total == 0:
        raise DataError("`x` holds no samples; elephant needs at least one sample to train")
    shapes = [tuple(s) for s in parts[0][1]]
    check_features(model, [np.empty((0,) + s) for s in shapes] if len(shapes) > 1 else np.empty((0,) + shapes[0]))
    return total


def records_are_blocks(first: Any, expected_shapes: list[tuple] | None) -> bool:
    """Whether an RDD's first element is a block rather than one record.

    Both are tuples: ``(features, label)`` or ``(features, label, weight)``
    records, ``(x_block, y_block)`` or ``(x_block, y_block, w_block)`` blocks.
    Decided from the model's input rank: a block's features carry a batch
    dimension, a record's do not.
    """
    if not isinstance(first, tuple) or len(first) not in (2, 3):
        raise DataError(
            "an RDD passed to elephant must hold (features, label) or (features, label, weight) records, or "
            f"(x_block, y_block[, w_block]) blocks; its first element is {_describe(first)}"
        )
    features = _leaves(first[0])[0]
    if expected_shapes is None:
        return features.ndim >= 2
    return features.ndim == len(expected_shapes[0]) + 1


def _describe(item: Any) -> str:
    return f"a tuple of {len(item)} items" if isinstance(item, tuple) else type(item).__name__


#: Rows converted at a time from per-row Python objects (RDD records, DataFrame rows):
#: a partition is never held as one Python list, only as numpy chunks.
CHUNK_ROWS = 4096


def chunked(items: Iterable[Any], size: int | None = None) -> Iterator[list[Any]]:
    """Lists of at most ``size`` (default :data:`CHUNK_ROWS`) consecutive items."""
    size = size or CHUNK_ROWS
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def stack_records(records: Iterable[tuple], feature_dtype=np.float32) -> Iterator[tuple]:
    """Blocks of up to :data:`CHUNK_ROWS` consecutive ``(features, label)`` or ``(features, label, weight)`` records.

    One chunk of records is alive as Python objects at a time, and the blocks
    are given out as they are made, so a partition of any size streams through.

    Raises:
        DataError: records with and without weights mixed, or a weight that is None, NaN or infinite.
    """
    weighted = None
    for chunk in chunked(records):
        if weighted is None:
            weighted = len(chunk[0]) == 3
        if any(len(r) != (3 if weighted else 2) for r in chunk):
            raise DataError("the RDD mixes (features, label) and (features, label, weight) records; "
                            "give every record a weight, or none")
        block = (np.asarray([r[0] for r in chunk], dtype=feature_dtype), np.asarray([r[1] for r in chunk]))
        if weighted:
            w = np.asarray([r[2] for r in chunk], dtype=np.float32)
            if not np.all(np.isfinite(w)):
                raise DataError("the RDD's records hold None, NaN or infinite sample weights")
            block += (w,)
        yield block


def checked_blocks(blocks: Iterable[tuple]) -> Iterator[tuple]:
    """The blocks that hold rows, as they come, refusing a mix of blocks with and without weights.

    Raises:
        DataError: a block with weights and one without in the same stream.
    """
    parts = None
    for block in blocks:
        if parts is None:
            parts = len(block)
        elif len(block) != parts:
            raise DataError("the RDD mixes blocks with and without sample weights; give every block weights, or none")
        if num_samples(block[0]) > 0:
            yield block


def row_bytes(block: tuple) -> float:
    """The bytes one sample of ``block`` takes (its features, labels and weights), 0 for an empty block."""
    n = num_samples(block[0])
    return sum(a.nbytes for part in block if part is not None for a in _leaves(part)) / n if n else 0.0


def concat_blocks(blocks: Iterable[tuple]) -> Iterator[tuple]:
    """Merge the blocks of one partition into a single block."""
    blocks = [b for b in blocks if num_samples(b[0]) > 0]
    if not blocks:
        return iter(())
    if len({len(b) for b in blocks}) > 1:
        raise DataError("the RDD mixes blocks with and without sample weights; give every block weights, or none")
    if len(blocks) == 1:
        return iter(blocks)
    xs = [b[0] for b in blocks]
    ys = [b[1] for b in blocks]
    merged = (_concat(xs), None if ys[0] is None else _concat(ys))
    if len(blocks[0]) == 3:
        merged += (_concat([b[2] for b in blocks]),)
    return iter([merged])


def _concat(parts: Sequence[Any]) -> Any:
    first = parts[0]
    if isinstance(first, Mapping):
        return {k: np.concatenate([np.asarray(p[k]) for p in parts]) for k in first}
    if isinstance(first, (list, tuple)):
        return [np.concatenate([np.asarray(p[i]) for p in parts]) for i in range(len(first))]
    return np.concatenate([np.asarray(p) for p in parts])


def partition_to_blocks(expected_shapes: list[tuple] | None):
    """A ``mapPartitions`` function turning records or blocks into a stream of blocks (never one merged block).

    The format is read from each partition's first element, inside the task:
    a ``first()`` job on the driver would leave a Python worker half-read, and
    Spark would start (and the worker rebuild its model in) a fresh one.
    Records are stacked :data:`CHUNK_ROWS` at a time (:func:`stack_records`);
    blocks go on as they are (:func:`checked_blocks`).
    """

    def convert(items: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        it = iter(items)
        first = next(it, None)
        if first is None:
            return iter(())
        items = itertools.chain([first], it)
        return checked_blocks(items) if records_are_blocks(first, expected_shapes) else stack_records(items)

    return convert
