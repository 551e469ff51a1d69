"""The workers' view of a store's center where the rule compresses its replies (no HTTP).

With a rule's ``reply_codec`` (:class:`~elephant.optimizers.compress.Compressed`
with ``replies=True``) a synchronous round's reply carries the change from the
center the workers hold to the new one, encoded once per round; the workers'
center is then that view, one encoding away from the store's exact center,
and named by its digest. A :class:`ReplyView` keeps it for a
:class:`~elephant.ps.store.Store`; without a codec it holds nothing and
replies carry the center itself. It has no lock: the store holds its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from elephant.optimizers.codecs import encode_change
from elephant.protocol import Reply, ReplyChange
from elephant.ps.checks import freeze
from elephant.ps.layout import digest

__all__ = ["ReplyView"]


class ReplyView:
    """The center as the workers hold it, and its digest; None without a ``codec`` (the rule's ``reply_codec``)."""

    def __init__(self, codec: Any):
        self._codec = codec
        self.arrays: list[np.ndarray] | None = None
        self.digest: str | None = None

    def reset(self, center: Sequence[np.ndarray]) -> None:
        """The workers' view becomes ``center`` (at the start, a new epoch, a rollback, an absorbed outcome)."""
        if self._codec is not None:
            self.arrays = list(center)
            self.digest = digest(self.arrays)

    def reply(self, clock: int, center: Sequence[np.ndarray], tensors: Any = None) -> Reply:
        """A reply with the center as the workers hold it: the view, with compressed replies, else ``center``."""
        if self.arrays is None:
            return Reply(clock=clock, center=list(center), tensors=tensors)
        return Reply(clock=clock, center=list(self.arrays), tensors=tensors, view=self.digest)

    def advance(self, center: Sequence[np.ndarray], clock: int) -> tuple[list, dict]:
        """After a round from ``clock``: the center the workers get, and the rest of the round's :class:`Reply`.

        Without a codec that is ``center`` and nothing; with one, the view moves
        to ``center`` encoded (once per round, whatever the workers) and the
        reply carries the view's digest and the encoded change.
        """
        if self._codec is None:
            return center, {}
        layout, view = encode_change(self._codec, self.arrays, center)
        change = ReplyChange(self.digest, clock, self._codec.name, self._codec.block, freeze(layout))
        self.arrays, self.digest = freeze(view), digest(view)
        return self.arrays, {"view": self.digest, "change": change}
