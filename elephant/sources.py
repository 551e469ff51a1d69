"""The kinds of input elephant trains and evaluates on, behind one seam.

``x`` is numpy (an array, or a list/dict of arrays for a multi-input model,
labels in ``y``), an RDD (of ``(features, label[, weight])`` records or
``(x, y[, w])`` numpy blocks) or a Spark DataFrame (columns named by
``features_col``, ``label_col`` and ``weight_col``). :func:`source` decides the
kind once; the kind then refuses the arguments that do not apply to it
(:meth:`Source.refuse`), checks what it can before Spark starts
(:meth:`Source.checked_weights`), and turns itself into an RDD of numpy
blocks (:meth:`Source.labeled_blocks`, :meth:`Source.training`), the one
shape the workers and the evaluation tasks read.

Adding a kind (pandas, say) is one class here and its tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from elephant import arrow as A
from elephant import data as D
from elephant.errors import ConfigError, DataError
from elephant.fit.plan import decide_workers

__all__ = ["DataFrameSource", "NumpySource", "RDDSource", "Source", "Training", "release", "shipped_blocks", "source"]


@dataclasses.dataclass
class Training:
    """A fit's training data as blocks: ``rdd`` of ``num_workers`` partitions, ``samples`` (None: not
    counted yet, the data live in Spark), and the validation data ``validation_split`` held out (numpy);
    where counted, each partition's samples and the bytes of one sample."""

    rdd: Any
    num_workers: int
    samples: int | None = None
    validation: tuple | None = None
    partition_samples: tuple[int, ...] = ()
    row_bytes: float = 0.0
    coalesced: bool = False  # more partitions were coalesced into ``num_workers`` (no barrier stage over them)


class Source:
    """One input kind; see the module's docstring. ``x`` and ``y`` are the caller's, unchanged."""

    kind = ""  # how messages name the kind: "numpy", "an RDD", "a DataFrame"
    distributed = True  # whether the data already live in Spark (labels and weights inside ``x``)

    def __init__(self, x: Any, y: Any = None, coalesced: bool = False):
        self.x, self.y = x, y
        self.coalesced = coalesced  # the data's partitions were coalesced (:meth:`repartitioned`)

    @property
    def spark(self):
        """The session the data belong to (a DataFrame's), else None."""
        return None

    def refuse(self, *, sample_weight: Any = None, weight_col: str | None = None,
               validation_split: float = 0.0) -> None:
        """Refuse the arguments that do not apply to this kind, naming them and what to do instead.

        Raises:
            ConfigError: ``validation_split`` with data that live in Spark.
            DataError: ``y`` or ``sample_weight`` with data that carry their own, or
                ``weight_col`` without a DataFrame.
        """
        if self.distributed:
            if validation_split:
                raise ConfigError(
                    "`validation_split` works with numpy inputs only; for an RDD or DataFrame pass "
                    f"validation_data=(x_val, y_val); received validation_split={validation_split!r}")
            if self.y is not None:
                raise DataError("`y` must be None when `x` is an RDD or a DataFrame (labels travel inside `x`)")
            if sample_weight is not None:
                raise DataError("`sample_weight` must be None when `x` is an RDD or a DataFrame: weights travel inside "
                                "`x`, as (features, label, weight) records or (x, y, w) blocks of an RDD, or a "
                                "DataFrame column named by `weight_col`")
        if weight_col is not None and not isinstance(self, DataFrameSource):
            hint = "; pass sample_weight= instead" if not self.distributed else ""
            raise DataError(f"`weight_col` names a DataFrame column, but `x` is {self.kind}{hint} "
                            f"(received weight_col={weight_col!r})")

    def checked_weights(self, model, sample_weight: Any = None, class_weight: Any = None) -> Any:
        """Check what can be checked before Spark starts; ``sample_weight`` as checked (numpy only)."""
        return sample_weight

    def checked_features(self, model) -> None:
        """Check features to predict on before Spark starts (numpy only: Spark data are checked in their tasks)."""

    def bootstrap(self, seed: int) -> tuple[Any, Any]:
        """A bootstrap resample, ``(x, y)``: as many samples, drawn with replacement (seeded)."""
        raise NotImplementedError

    def available_workers(self, sc) -> int:
        """How many partitions the data offer when ``num_workers`` is not given."""
        return max(1, sc.defaultParallelism)

    def labeled_blocks(self, model, sc, num_workers: int, *, features_col: str | Sequence[str] = "features",
                       label_col: str = "label", weight_col: str | None = None, sample_weight: Any = None):
        """An RDD of ``(x, y[, w])`` numpy blocks in ``num_workers`` partitions (numpy) or the data's own."""
        raise NotImplementedError

    def repartitioned(self, num_workers: int, coalesce: bool = True) -> Source:
        """The same data in ``num_workers`` partitions (a DataFrame or an RDD; numpy is split by :meth:`training`):
        more partitions are coalesced where ``coalesce``, without a shuffle (each worker's task reads several of
        them in turn, as one stream), else repartitioned, as fewer always are."""
        raise NotImplementedError

    def training(self, model, sc, requested: int | None, args, seed: int | None, barrier: bool = False) -> Training:
        """The training blocks of a fit (``args`` a checked :class:`~elephant.config.FitArgs`), one
        partition per worker, class weights turned into sample weights as Keras does. An epoch that is a
        ``barrier`` stage gets repartitioned data: Spark refuses a barrier stage over coalesced partitions."""
        num_workers = decide_workers(requested, self.available_workers(sc))
        parts = self.repartitioned(num_workers, coalesce=not barrier)
        rdd = parts.labeled_blocks(model, sc, num_workers, features_col=args.features_col, label_col=args.label_col,
                                   weight_col=args.weight_col)
        if args.class_weight is not None:
            rdd = rdd.map(D.add_class_weights(args.class_weight))
        return Training(rdd, num_workers, coalesced=parts.coalesced)


class NumpySource(Source):
    kind = "numpy"
    distributed = False

    def checked_weights(self, model, sample_weight: Any = None, class_weight: Any = None) -> Any:
        """The arrays, the labels and the weights against each other and the model.

        Raises:
            DataError: no ``y``, or data and weights that do not fit the model or each other.
        """
        if self.y is None:
            raise DataError("`y` is required when `x` is a numpy array (or a list/dict of arrays)")
        n = D.check_xy(self.x, self.y)
        D.check_features(model, self.x)
        if sample_weight is not None:
            sample_weight = D.check_sample_weight(sample_weight, n)
        if class_weight is not None:
            D.class_weight_labels(self.y)  # refuses multi-output labels before Spark starts
        return sample_weight

    def checked_features(self, model) -> None:
        """Refuse empty features, or features whose shapes do not fit the model."""
        if D.num_samples(self.x) == 0:
            raise DataError("`x` is empty (0 samples); nothing to predict")
        D.check_features(model, self.x)

    def labeled_blocks(self, model, sc, num_workers: int, *, features_col: str | Sequence[str] = "features",
                       label_col: str = "label", weight_col: str | None = None, sample_weight: Any = None):
        """Contiguous blocks, in order, one per partition (checked by :meth:`checked_weights` first)."""
        x, y, w = self.x, self.y, sample_weight
        idx = np.array_split(np.arange(D.num_samples(x)), min(num_workers, D.num_samples(x)))
        return sc.parallelize([(D.take(x, i), D.take(y, i)) + (() if w is None else (w[i],)) for i in idx], len(idx))

    def training(self, model, sc, requested: int | None, args, seed: int | None, barrier: bool = False) -> Training:
        """Shuffled shards (seeded), one per worker and never empty, each shipped once as a broadcast;
        ``validation_split`` holds out the last samples, with their weights, as Keras does."""
        x, y, w = self.x, self.y, args.sample_weight  # checked by checked_weights
        n = D.num_samples(x)
        validation = None
        if args.validation_split:
            cut = int(n * (1.0 - args.validation_split))
            if cut == 0 or cut == n:
                raise DataError(f"validation_split={args.validation_split} leaves no training or no validation "
                                f"samples out of {n}")
            validation = (D.take(x, slice(cut, None)), D.take(y, slice(cut, None))) + (() if w is None else (w[cut:],))
            x, y, w = D.take(x, slice(0, cut)), D.take(y, slice(0, cut)), D.take(w, slice(0, cut))
            n = cut
        if args.class_weight is not None:
            w = D.class_weights_to_sample_weights(y, args.class_weight)
        num_workers = decide_workers(requested, self.available_workers(sc), samples=n)
        blocks = D.split_numpy(x, y, num_workers, seed=seed, sample_weight=w)
        return Training(shipped_blocks(sc, blocks), num_workers, n, validation,
                        tuple(D.num_samples(block[0]) for block in blocks), D.row_bytes(blocks[0]))


    def bootstrap(self, seed: int) -> tuple[Any, Any]:
        idx = np.random.default_rng(seed).integers(0, D.num_samples(self.x), D.num_samples(self.x))
        return D.take(self.x, idx), D.take(self.y, idx)


class RDDSource(Source):
    kind = "an RDD"

    def bootstrap(self, seed: int) -> tuple[Any, Any]:
        return self.x.sample(True, 1.0, seed), self.y

    def available_workers(self, sc) -> int:
        return self.x.getNumPartitions()

    def repartitioned(self, num_workers: int, coalesce: bool = True) -> Source:
        x, coalesced = _partitioned(self.x, self.x.getNumPartitions(), num_workers, coalesce)
        return RDDSource(x, coalesced=coalesced)

    def labeled_blocks(self, model, sc, num_workers: int | None = None, **_: Any):
        """Records grouped into blocks, or blocks as they are, in the RDD's own partitions."""
        return self.x.mapPartitions(D.partition_to_blocks(D.model_input_shapes(model)))


class DataFrameSource(Source):
    kind = "a DataFrame"

    def bootstrap(self, seed: int) -> tuple[Any, Any]:
        return self.x.sample(withReplacement=True, fraction=1.0, seed=seed), self.y

    @property
    def spark(self):
        return self.x.sparkSession

    def repartitioned(self, num_workers: int, coalesce: bool = True) -> Source:
        x, coalesced = _partitioned(self.x, self.x.rdd.getNumPartitions(), num_workers, coalesce)
        return DataFrameSource(x, coalesced=coalesced)

    def labeled_blocks(self, model, sc, num_workers: int | None = None, *,
                       features_col: str | Sequence[str] = "features", label_col: str = "label",
                       weight_col: str | None = None, sample_weight: Any = None):
        """Arrow batches of the named columns as blocks, in the DataFrame's own partitions."""
        return A.dataframe_blocks(self.x, features_col, label_col, weight_col)


def _partitioned(x, partitions: int, num_workers: int, coalesce: bool = True) -> tuple[Any, bool]:
    """``(x', coalesced)``: an RDD or DataFrame ``x`` of ``partitions`` partitions in ``num_workers``,
    coalesced where it has more and ``coalesce`` (no shuffle, and the same parent partitions in the same order on
    every read), else repartitioned. Spark runs no barrier stage over a coalesced RDD (its ancestors must have its
    number of partitions)."""
    if partitions == num_workers:
        return x, False
    if coalesce and partitions > num_workers:
        return x.coalesce(num_workers), True
    return x.repartition(num_workers), False


def source(x: Any, y: Any = None) -> Source:
    """The kind of ``x``.

    Raises:
        DataError: ``x`` is none of them (a generator or ``tf.data`` dataset, say), naming what was received.
    """
    D.check_input_kind(x)
    if D.is_rdd(x):
        return RDDSource(x, y)
    if D.is_dataframe(x):
        return DataFrameSource(x, y)
    return NumpySource(x, y)


def shipped_blocks(sc, blocks: Sequence[tuple]):
    """An RDD with ``blocks[i]`` as partition ``i``, each block shipped once, as its own broadcast.

    ``sc.parallelize(blocks)`` would put the data inside the tasks: every
    epoch's job would carry the whole training set again (and Spark warns of
    tasks of many megabytes). A broadcast travels once to each executor that
    reads it, and each task reads only its own block; a Python worker keeps a
    broadcast's value once it has read it. The RDD is not cached: a cache would
    hold a second copy in the executor's storage memory, and the first job
    over it would run its tasks' Python twice (the block into the cache, then
    the epoch), where Spark hands the second run a worker only after a pause
    (0.3 s of a first epoch on ``local[2]``). Free with :func:`release`.
    """
    broadcasts = [sc.broadcast(block) for block in blocks]
    rdd = sc.parallelize(range(len(blocks)), len(blocks)).map(lambda i: broadcasts[i].value)
    rdd.elephant_broadcasts = broadcasts
    return rdd


def release(rdd) -> None:
    """Unpersist a training RDD, and destroy the broadcasts of :func:`shipped_blocks` behind it."""
    rdd.unpersist()
    for broadcast in getattr(rdd, "elephant_broadcasts", ()):
        broadcast.destroy()
