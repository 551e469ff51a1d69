"""Encoding: arrays and a JSON-able header into one safetensors message, as buffers never joined.

We produce the layout (:mod:`~elephant.ps.layout`) ourselves, because the library
copies: encoding returns the header plus a memoryview of every array (no join, no
copy). :mod:`~elephant.ps.decoding` reads it back; :mod:`~elephant.ps.wire` builds
the commit and reply messages on top.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from elephant.errors import ProtocolError
from elephant.ps.layout import CHECKSUM_KEY, CODES, FORMAT, HASHES, META_KEY, SUM_BLANK, as_wire_array, sum_field

__all__ = ["Encoded", "encode"]


class Encoded:
    """An encoded message as a list of buffers (header first), never joined.

    Iterating yields the buffers and ``len()`` is the total size, so
    ``requests`` streams it with a ``Content-Length`` and no copy.
    """

    __slots__ = ("buffers", "nbytes")

    def __init__(self, buffers: list[Any], nbytes: int):
        self.buffers, self.nbytes = buffers, nbytes

    def __iter__(self) -> Iterator[Any]:
        return iter(self.buffers)

    def __len__(self) -> int:
        return self.nbytes

    def tobytes(self) -> bytes:
        """The whole message as one ``bytes`` object (one copy)."""
        return b"".join(self.buffers)


def encode(tensors: Sequence[np.ndarray], meta: Mapping[str, Any] | None = None) -> Encoded:
    """Encode arrays and a JSON-able header as one safetensors message.

    Tensor data is laid out by decreasing item size (as safetensors does) so
    every array is aligned in the receiver's buffer; names keep the order.

    Args:
        tensors: the arrays, in order. Supported dtypes: float16/32/64,
            int8-64, uint8-64 and bool.
        meta: our message header, stored as JSON in ``__metadata__``; default none.

    Returns:
        The message as an :class:`Encoded` list of buffers.

    Raises:
        ProtocolError: an array has an unsupported dtype or ``meta`` is not JSON-able.
    """
    arrays = [as_wire_array(i, t) for i, t in enumerate(tensors)]
    order = sorted(range(len(arrays)), key=lambda i: -arrays[i].dtype.itemsize)
    entries: dict[str, Any] = {}
    buffers: list[Any] = [b""]
    offset = 0
    for i in order:
        a = arrays[i]
        n = a.nbytes
        entries[f"{i:04d}"] = {
            "dtype": CODES[(a.dtype.kind, a.dtype.itemsize)],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + n],
        }
        if n:
            buffers.append(memoryview(a.reshape(-1).view(np.uint8)))
        offset += n
    try:
        meta_json = json.dumps(dict(meta or {}), separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"message header is not JSON-serialisable: {exc}") from None
    header: dict[str, Any] = {"__metadata__": {"format": FORMAT, META_KEY: meta_json,
                                               CHECKSUM_KEY: SUM_BLANK.decode()}}
    header.update(entries)
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    prefix = len(raw).to_bytes(8, "little") + raw
    digest = HASHES[CHECKSUM_KEY](prefix)
    for data in buffers[1:]:
        digest.update(data)
    buffers[0] = prefix.replace(sum_field(CHECKSUM_KEY, SUM_BLANK),
                                sum_field(CHECKSUM_KEY, digest.hexdigest().encode()), 1)
    return Encoded(buffers, 8 + len(raw) + offset)
