"""The head of a fit's first epoch: its first steps, trained on the driver by the user's optimizer on the global batch.

Beyond :data:`~elephant.optimizers.local.MAX_SCALED_WORKERS` workers under an
adaptive optimizer, most of what the averaging defaults' first epoch loses
against plain Keras is lost in its first steps (docs/convergence.md, "The first
epoch at 16 workers"): each worker starts its optimizer state from nothing on
a batch of ``batch_size/K`` samples, and the mean of such steps is not the
global batch's step. Post-local SGD (Lin et al., 2020) starts with synchronous
steps on the global batch for that reason. A fit whose plan has a head
(``FitPlan.head_steps``) does it on the driver, where the user's compiled model
and optimizer are: the global batch of each of its steps is the concatenation
of every partition's batch of that step, in the order that partition's task
would train its first pass (:func:`~elephant.worker.pass_order`), so the head trains exactly what
averaging the workers' gradients every step would. The tasks of that epoch then
skip those batches (``TaskSpec.skip_steps``), so the epoch trains every batch
once, and start from the head's weights and optimizer state (the model archive
is made after the head), at the plan's full factor from their first step: the
head replaces the ramp of that factor.

The head is :data:`HEAD_STEPS` steps at most and half the epoch's steps at most
(a short epoch keeps most of its steps on the workers); it costs the driver those
steps of plain training, and the fit one more Spark job over the cached
training data (:func:`gather_head`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from elephant import data as D
from elephant.worker import pass_order

log = logging.getLogger(__name__)

__all__ = ["HEAD_STEPS", "head_steps", "head_rows", "partition_head", "global_batches", "train_head"]

#: The most steps of the first epoch the driver trains (benchmarks/first_epoch.py at 16 workers: 128 plain steps took
#: the synchronous default's first epoch from 3.6 to 1.1 points behind plain Keras on a GRU, 32 and 8 did less).
HEAD_STEPS = 128


def head_steps(samples: int | None, batch_size: int) -> int:
    """The head's steps for a fit of ``samples`` samples in global batches of ``batch_size``: at most
    :data:`HEAD_STEPS`, and at most half the epoch's steps (0 for an epoch of one step, or unknown samples)."""
    if not samples:
        return 0
    return min(HEAD_STEPS, math.ceil(samples / batch_size) // 2)


def _take(block: tuple, rows) -> tuple:
    """Rows ``rows`` (a slice or an index array) of every array of a block (its ``y`` may be None)."""
    return tuple(None if part is None else D.take(part, rows) for part in block)


def head_rows(block: tuple, order: np.ndarray, steps: int, batch_size: int) -> tuple:
    """The rows of ``block`` that its partition's first ``steps`` batches of ``batch_size`` hold, in ``order``."""
    return _take(block, order[: steps * batch_size])


def partition_head(key: str | None, epoch: int, steps: int, batch_size: int):
    """A ``mapPartitionsWithIndex`` function giving ``[(partition, its head rows)]`` (nothing for an empty
    partition): :func:`head_rows` in the order its task trains ``epoch`` with the fit's shuffle ``key``
    (None: ``shuffle=False``)."""
    def rows(partition: int, blocks: Iterable[tuple]) -> list[tuple[int, tuple]]:
        block = next(D.concat_blocks(blocks), None)
        if block is None:
            return []
        order = pass_order(key, epoch, partition, D.num_samples(block[0]))
        return [(partition, head_rows(block, order, steps, batch_size))]

    return rows


def global_batches(parts: Sequence[tuple], steps: int, batch_size: int) -> Iterator[tuple]:
    """The head's global batches: step ``i``'s is every part's ``i``-th batch of ``batch_size`` rows joined in the
    parts' order (a part with fewer rows gives fewer, or none); steps where no part has rows are left out."""
    for i in range(steps):
        rows = slice(i * batch_size, (i + 1) * batch_size)
        merged = next(D.concat_blocks([_take(block, rows) for block in parts]), None)
        if merged is not None:
            yield merged


def train_head(model, parts: Iterable[tuple], steps: int, batch_size: int) -> int:
    """Train the compiled ``model`` with its own optimizer on the head's global batches (:func:`global_batches` of
    each partition's head rows, ``batch_size`` the workers' batch); returns the steps trained."""
    parts = [p for p in parts if p and D.num_samples(p[0]) > 0]
    t0 = time.perf_counter()
    trained = 0
    for batch in global_batches(parts, steps, batch_size):
        x, y, w = D.unpack(batch)
        model.train_on_batch(x, y, sample_weight=w)
        trained += 1
    log.info("the first %d steps of the first epoch trained on the driver on the global batch (%.2fs); the "
             "workers train the rest of it", trained, time.perf_counter() - t0)
    return trained

