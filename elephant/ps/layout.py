"""The safetensors layout both ends of the wire share: its header constants, dtype table and checksums.

A message is one safetensors buffer::

    [8-byte little-endian header length N][N bytes of JSON header, space-padded][tensor bytes]

The JSON header has one entry per tensor, named by its index (``"0000"``,
``"0001"``, ...) as ``{"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}``,
plus ``"__metadata__"``: a str -> str map whose ``"elephant"`` entry holds our
small message header as JSON (run, epoch, partition, step, attempt, clocks,
tensor counts), and whose ``"xxh3"`` entry holds a checksum of the whole
message: the 64-bit XXH3 of every byte, with the 16 hex digits of the checksum
itself written as zeros. A message corrupted anywhere (a flipped bit that TCP's
16-bit checksum missed, a bad NIC or memory) is refused before anything is
applied. XXH3 (the ``xxhash`` package) reads about 45 GB/s here, 12 times
zlib's CRC32, so even a 40 MB message costs under a millisecond per side.
Where ``xxhash`` is missing (it is a dependency of elephant, so only in a
partial environment), messages carry a ``"crc32"`` entry instead, computed
the same way with the standard library's zlib; a decoder checks whichever of
the two a message carries.

This module holds what :mod:`~elephant.ps.encoding` and :mod:`~elephant.ps.decoding`
agree on (the header's constants, the dtype codes, the checksum functions and how an
array travels), and two helpers on arrays as they travel: :func:`all_finite` and
:func:`digest`. The messages themselves are in :mod:`~elephant.ps.wire`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import zlib

import numpy as np

from elephant.errors import ProtocolError

__all__ = [
    "CHECKSUM_KEY",
    "CODES",
    "DTYPES",
    "FORMAT",
    "HASHES",
    "MAX_HEADER_BYTES",
    "META_KEY",
    "SUM_BLANK",
    "all_finite",
    "as_wire_array",
    "digest",
    "sum_field",
]

#: Largest JSON header accepted (safetensors itself allows 100 MB; ours are tiny).
MAX_HEADER_BYTES = 16 * 1024 * 1024

#: The ``__metadata__`` entry that holds our message header as JSON.
META_KEY = "elephant"
#: The ``__metadata__`` ``"format"`` entry every message carries.
FORMAT = "elephant-ps/1"
#: The checksum's 16 hex digits as they are hashed: zeros.
SUM_BLANK = b"0" * 16


class _CRC32:
    """zlib's CRC32 with xxhash's streaming interface, as 16 hex digits."""

    def __init__(self, data: Any = b""):
        self._crc = zlib.crc32(data)

    def update(self, data: Any) -> None:
        self._crc = zlib.crc32(data, self._crc)

    def hexdigest(self) -> str:
        return f"{self._crc:016x}"


try:
    import xxhash

    #: The checksum functions this process knows, by ``__metadata__`` key (called with the first bytes, or none).
    HASHES: dict[str, Any] = {"xxh3": xxhash.xxh3_64, "crc32": _CRC32}
except ImportError:  # a partial environment: elephant itself depends on xxhash
    HASHES = {"crc32": _CRC32}

#: The ``__metadata__`` entry this process writes its checksum to (``"xxh3"`` when xxhash is installed).
CHECKSUM_KEY = next(iter(HASHES))

#: The safetensors dtype codes and the little-endian numpy dtype of each.
DTYPES: dict[str, np.dtype] = {
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "I8": np.dtype("i1"),
    "I16": np.dtype("<i2"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
    "U8": np.dtype("u1"),
    "U16": np.dtype("<u2"),
    "U32": np.dtype("<u4"),
    "U64": np.dtype("<u8"),
    "BOOL": np.dtype("?"),
}
#: A dtype's code by its ``(kind, itemsize)``.
CODES: dict[tuple[str, int], str] = {(dt.kind, dt.itemsize): code for code, dt in DTYPES.items()}


def sum_field(key: str, digits: bytes) -> bytes:
    """The checksum's ``"key":"digits"`` field as it is written in the JSON header."""
    return b'"' + key.encode() + b'":"' + digits + b'"'


def as_wire_array(index: int, a: Any) -> np.ndarray:
    """``a`` as it travels: a supported dtype, little-endian, C order (0-d kept 0-d).

    Raises:
        ProtocolError: the dtype cannot be sent.
    """
    a = np.asarray(a)
    code = CODES.get((a.dtype.kind, a.dtype.itemsize))
    if code is None:
        supported = sorted(str(d) for d in DTYPES.values())
        raise ProtocolError(f"tensor {index}: dtype {a.dtype} cannot be sent; expected one of {supported}")
    if a.dtype != DTYPES[code]:  # big-endian input
        a = a.astype(DTYPES[code])
    return a if a.flags.c_contiguous else a.copy(order="C")  # (ascontiguousarray makes 0-d arrays 1-d)


def all_finite(a: np.ndarray) -> bool:
    """True unless a float array holds NaN or inf.

    Fast path: a sum of squares is finite only if every element is (NaN and
    inf propagate), so one reduction with no temporary settles the common
    case; for float32/64 it is a BLAS dot product, about twice as fast as
    ``np.add.reduce`` and four times as fast as ``np.isfinite(a).all()``. An
    overflowing sum falls back to the exact element-wise test.
    """
    if a.dtype.kind != "f" or a.size == 0:
        return True
    with np.errstate(all="ignore"):
        if a.dtype.itemsize >= 4 and a.flags.c_contiguous:
            flat = a.reshape(-1)
            total = np.dot(flat, flat)
        else:
            total = np.add.reduce(a, axis=None)
        if math.isfinite(float(total)):
            return True
    return bool(np.isfinite(a).all())


def digest(arrays: Sequence[Any]) -> str:
    """A 64-bit digest (16 hex digits) of arrays' dtypes, shapes and bytes, in order.

    Names a view of the center in compressed replies (:class:`~elephant.protocol.ReplyChange`):
    a client rebuilding a view checks that it holds the same bits as the server.
    """
    h = HASHES[CHECKSUM_KEY]()
    for i, a in enumerate(arrays):
        a = as_wire_array(i, a)  # as it travels: little-endian, C order, 0-d kept 0-d
        h.update(f"{a.dtype.str}{a.shape};".encode())
        h.update(memoryview(a.reshape(-1).view(np.uint8)))
    return h.hexdigest()
