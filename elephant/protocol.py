"""The runtime's protocol, written once: what a worker and the server exchange, and the rules both follow.

The parameter server (:mod:`elephant.ps.store`, :mod:`elephant.ps.rounds`),
the Spark worker (:mod:`elephant.worker`) and the in-process simulator
(:mod:`elephant.optimizers.simulate`) all use these, so the simulator cannot
drift from the cluster:

* :class:`Commit` (a worker's window), :class:`Reply` (the server's answer to
  a pull or a commit) and :class:`CommitKey` (a commit's idempotency key);
* :func:`ssp_admitted`: when a worker may start its next window under a
  staleness bound (Stale Synchronous Parallel);
* :func:`round_complete`: when a synchronous round closes;
* :func:`merge_reply`: how a worker merges a reply that arrives while it trains
  on (``overlap=True``).

numpy only, like the rules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence, Set
from typing import Any, NamedTuple

import numpy as np

__all__ = ["MODES", "Commit", "CommitKey", "Reply", "ReplyChange", "merge_reply", "round_complete", "ssp_admitted"]

Weights = list  # a list of numpy arrays, in Keras ``get_weights()`` order

#: The synchronisation modes: barrier rounds, commits applied one at a time under a lock, no lock.
MODES = ("synchronous", "asynchronous", "hogwild")


@dataclasses.dataclass(frozen=True)
class Commit:
    """What a worker sends after a window.

    Attributes:
        tensors: the rule's payload (a delta, a normalised delta, or weights).
        num_steps: local steps covered by this window (a flushed partial window
            has fewer than ``window``).
        num_samples: samples trained in this window; synchronous rules weight by it.
        base_clock: server clock of the center this window started from.
    """

    tensors: Weights
    num_steps: int
    num_samples: int
    base_clock: int


@dataclasses.dataclass(frozen=True)
class Reply:
    """What the server answers to a pull or a commit.

    Attributes:
        clock: number of commits (asynchronous) or rounds (synchronous) applied.
        center: the center weights after this commit; with compressed replies, the
            workers' view of it (:class:`ReplyChange`).
        tensors: an optional rule-specific payload (e.g. the EASGD elastic term).
        view: with compressed replies, a digest of ``center`` (the view every
            worker holds after this reply); None otherwise.
        change: with compressed replies, the round's ``center`` as an encoded
            change from the view before the round; None otherwise.
    """

    clock: int
    center: Weights
    tensors: Weights | None = None
    view: str | None = None
    change: ReplyChange | None = None


class ReplyChange(NamedTuple):
    """A synchronous round's reply as the encoded step between two views of the center.

    With ``Compressed(replies=True)`` the workers do not hold the server's exact
    center but a *view* of it that the server keeps too: after each round the view
    moves towards the new center by an encoded change
    (:func:`~elephant.optimizers.codecs.encode_change`), which is what travels
    instead of the dense center; the server's center itself stays exact.

    Attributes:
        base: digest of the view the change applies to.
        base_clock: the clock of that view.
        codec: the codec's name, ``"bf16"`` or ``"int8"``.
        block: the ``int8`` block (None: one scale per tensor, or ``bf16``).
        layout: the encoded change (:mod:`elephant.optimizers.codecs`' layout).
    """

    base: str
    base_clock: int
    codec: str
    block: int | None
    layout: Weights


class CommitKey(NamedTuple):
    """Idempotency key of one commit, stable across Spark task retries.

    ``step`` is the commit's index in the partition's deterministic iteration;
    in synchronous mode ``(epoch, step)`` names the round, so every worker must
    number its commits the same way.
    """

    run: str
    epoch: int
    partition: int
    step: int


def ssp_admitted(commits: Sequence[int], finished: Set[int], partition: int, bound: int | None) -> bool:
    """Stale Synchronous Parallel admission (optimizers.md §10.2).

    ``partition`` may start its next window when it is at most ``bound``
    commits ahead of the slowest partition that has not finished the epoch.
    Finished partitions leave the minimum; ``bound=None`` always admits.

    Args:
        commits: commits applied this epoch, by partition.
        finished: partitions that finished the epoch.
        partition: the partition asking to start a window.
        bound: the staleness bound ``s``, or None (unbounded).
    """
    if bound is None or partition in finished:
        return True
    return commits[partition] - min(c for p, c in enumerate(commits) if p not in finished) <= bound


def round_complete(committed: Set[int], finished: Set[int], num_workers: int) -> bool:
    """Whether a synchronous round closes: someone committed, and every partition that has not finished did."""
    return bool(committed) and set(range(num_workers)) - set(finished) <= set(committed)


def merge_reply(optimizer: Any, state: Any, reply: Reply, sent: Weights, now: Weights) -> tuple[Weights, Any]:
    """A worker's weights after ``reply`` to the commit made at ``sent``: ``(weights, worker state)``.

    The rule's ``on_reply`` is applied to the weights *as they were sent*, and
    the local progress made while the commit was in flight is added back:
    ``new = on_reply(sent) + (now − sent)``. Without overlap ``now is sent``
    and this is ``on_reply`` alone. The result keeps the dtypes of ``now``.
    """
    weights, state = optimizer.on_reply(state, sent, reply)
    if now is not sent:
        weights = [np.asarray(w + (n - s), dtype=n.dtype) for w, n, s in zip(weights, now, sent, strict=True)]
    return weights, state
