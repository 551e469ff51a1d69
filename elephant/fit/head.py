"""The head of a fit's first epoch: its first steps, trained on the driver by the user's optimizer on the global batch.

Where the averaging defaults' workers train at a scaled rate (an adaptive
optimizer on the split batch, 2 workers and more), most of what their first
epoch loses against plain Keras is lost in its first steps (docs/convergence.md,
"The first epoch at 16 workers: where it loses"): each worker
starts its optimizer state from nothing on a batch of ``batch_size/K`` samples,
and the mean of such steps is not the global batch's step. Post-local SGD (Lin
et al., 2020) starts with synchronous steps on the global batch for that reason.
A fit whose plan has a head (``FitPlan.head_steps``) does it on the driver,
where the user's compiled model
and optimizer are: the global batch of each of its steps is the concatenation
of every partition's batch of that step, in the order that partition's task
would train its first pass (:func:`~elephant.stream.pass_blocks`), so the head trains exactly what
averaging the workers' gradients every step would. The tasks of that epoch then
skip those batches (``TaskSpec.skip_steps``), so the epoch trains every batch
once, and start from the head's weights and optimizer state (the model archive
is made after the head), at the plan's full factor from their first step: beyond
:data:`~elephant.optimizers.local.MAX_SCALED_WORKERS` workers the head replaces
the ramp of that factor.

The head is :data:`HEAD_STEPS` steps at most and half of a worker's pass at most
(a short epoch keeps most of its steps on the workers); it costs the driver those
steps of plain training (on a copy kept per model structure, traced once:
:mod:`elephant.fit.copies`), and, for data in Spark, one more Spark job over the cached
training data (numpy input: the driver reads its own broadcasts).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from elephant import data as D
from elephant.fit.backup import built_optimizer
from elephant.fit.copies import copy_state
from elephant.stream import first_rows, pass_blocks

log = logging.getLogger(__name__)

__all__ = ["HEAD_STEPS", "HeldState", "head_steps", "head_rows", "partition_head", "global_batches", "train_head"]

#: The most steps of the first epoch the driver trains: enough to cover the first steps, where averaging the workers'
#: adaptive steps loses most of what the first epoch loses; shorter heads gave less of it back (docs/convergence.md,
#: "The first epoch at 16 workers: where it loses").
HEAD_STEPS = 128


def head_steps(pass_steps: int | None) -> int:
    """The head's steps for a fit whose workers train ``pass_steps`` local steps in a pass over their partition: at
    most :data:`HEAD_STEPS`, and at most half of them (0 for a pass of one step, or an unknown one).

    Step ``i`` of the head trains every partition's ``i``-th batch, so it is bounded by the workers' passes, not by
    the global batch's steps: where the batch is split among more workers than it has samples, each worker's batch
    is one sample and its pass has fewer steps than the epoch has global batches."""
    return min(HEAD_STEPS, pass_steps // 2) if pass_steps else 0


def head_rows(block: tuple, order: np.ndarray, steps: int, batch_size: int) -> tuple:
    """The rows of ``block`` that its partition's first ``steps`` batches of ``batch_size`` hold, in ``order``."""
    return D.take_block(block, order[: steps * batch_size])


def partition_head(key: str | None, epoch: int, steps: int, batch_size: int, buffer: int | None = None):
    """A ``mapPartitionsWithIndex`` function giving ``[(partition, its head rows)]`` (nothing for an empty
    partition): the first ``steps`` batches of ``batch_size`` rows of the stream its task trains ``epoch`` from
    (:func:`~elephant.stream.pass_blocks` with the fit's shuffle ``key``, None: ``shuffle=False``, and shuffle
    ``buffer``), read no further than those rows."""
    def rows(partition: int, blocks: Iterable[tuple]) -> list[tuple[int, tuple]]:
        head = first_rows(pass_blocks(blocks, key, epoch, partition, buffer), steps * batch_size)
        return [] if head is None else [(partition, head)]

    return rows


def global_batches(parts: Sequence[tuple], steps: int, batch_size: int,
                   global_batch: int | None = None) -> Iterator[tuple]:
    """The head's global batches: the rows of every part's ``i``-th batch of ``batch_size`` rows joined in the parts'
    order, for ``i`` in ``range(steps)`` (a part with fewer rows gives fewer, or none), cut into batches of
    ``global_batch`` rows (None: one batch per ``i``; the last batch may be short).

    Where the user's batch splits evenly among the workers the two are the same batches. Where it does not, a
    worker's batch is rounded up (``ceil(B/K)``, one sample where ``K > B``) and the ``K`` workers' batches of a
    step hold more than ``B`` rows: cut at ``global_batch = B``, the head trains those rows in plain Keras' batches,
    as many steps as plain Keras takes over them."""
    joined = (next(D.concat_blocks([D.take_block(block, slice(i * batch_size, (i + 1) * batch_size))
                                    for block in parts]), None) for i in range(steps))
    joined = (block for block in joined if block is not None)
    if global_batch is None:
        yield from joined
        return
    rows = next(D.concat_blocks(list(joined)), None)
    if rows is None:
        return
    for start in range(0, D.num_samples(rows[0]), global_batch):
        yield D.take_block(rows, slice(start, start + global_batch))


class HeldState:
    """What the user's model held before the head trained it: its weights and its optimizer's variables.

    The head trains the user's model itself, before the first epoch's job; a fit whose first epoch then fails
    (rolled back, not kept) gives the model back what it held before the fit (:meth:`restore`), as a fit without
    a head leaves it. The optimizer is built first, as the head's first step would build it, so that a fresh
    optimizer's variables (step count 0, empty moments, a loss scale's start) are what is held.
    """

    def __init__(self, model):
        self.model = model
        self.weights = model.get_weights()
        self.optimizer_variables = [np.array(v) for v in built_optimizer(model).variables]

    def restore(self) -> None:
        """Set the model's weights and optimizer variables back to what they were held at."""
        self.model.set_weights(self.weights)
        for variable, value in zip(self.model.optimizer.variables, self.optimizer_variables, strict=True):
            variable.assign(value)


def train_head(model, parts: Iterable[tuple], steps: int, batch_size: int, global_batch: int | None = None,
               trainer=None) -> int:
    """Train the compiled ``model`` with its own optimizer on the head's global batches (:func:`global_batches` of
    each partition's head rows, ``batch_size`` the workers' batch, ``global_batch`` the user's); returns the steps
    trained.

    ``trainer``: a copy of the model that holds its weights and optimizer state (:func:`elephant.fit.copies.take`,
    whose train step an earlier fit of the structure traced): the steps run on it, and the model takes its weights and
    optimizer state after them (None: the steps run on the model itself)."""
    parts = [p for p in parts if p and D.num_samples(p[0]) > 0]
    t0 = time.perf_counter()
    trained = 0
    for batch in global_batches(parts, steps, batch_size, global_batch):
        x, y, w = D.unpack(batch)
        (trainer or model).train_on_batch(x, y, sample_weight=w)
        trained += 1
    if trainer is not None:
        copy_state(trainer, model)
    log.info("the first %d steps of the first epoch trained on the driver on the global batch (%.2fs); the "
             "workers train the rest of it", trained, time.perf_counter() - t0)
    return trained
