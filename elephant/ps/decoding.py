"""Decoding: one safetensors message into arrays (views of the buffer, no copy) and our header, strictly.

Decoding wraps slices of the received buffer with ``np.frombuffer`` (no copy).
The tests check compatibility both ways with ``safetensors.numpy``.

Decoding is strict: every deviation (a missing or wrong checksum, truncated or
oversized header, bad JSON, unknown dtype, overlapping or gapped offsets,
trailing bytes, wrong count, shape or dtype against a template, NaN or inf) raises
:class:`~elephant.errors.ProtocolError` with the reason. The layout is described in
:mod:`~elephant.ps.layout`; the commit and reply messages are in :mod:`~elephant.ps.wire`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from elephant.errors import ProtocolError
from elephant.ps.layout import DTYPES, HASHES, MAX_HEADER_BYTES, META_KEY, SUM_BLANK, all_finite, sum_field

__all__ = ["decode"]


def _verify_checksum(mv: memoryview, header_bytes: bytes, metadata: Any) -> None:
    """Refuse a message whose checksum (XXH3, or CRC32) is missing or does not match its bytes."""
    key = next((k for k in ("xxh3", "crc32") if isinstance(metadata, dict) and k in metadata), None)
    digits = metadata[key] if key else None
    if not isinstance(digits, str) or len(digits) != 16 or not digits.isascii():
        raise ProtocolError("message carries no valid checksum (__metadata__.xxh3 or .crc32); refused")
    if key not in HASHES:
        raise ProtocolError(f"message is checksummed with {key}, which needs the xxhash package here; refused")
    field = sum_field(key, digits.encode())
    if field not in header_bytes:
        raise ProtocolError("message checksum field is not in its canonical form; refused")
    digest = HASHES[key](mv[:8])
    digest.update(header_bytes.replace(field, sum_field(key, SUM_BLANK), 1))
    digest.update(mv[8 + len(header_bytes):])
    if digest.hexdigest() != digits:
        raise ProtocolError(f"message checksum mismatch (computed {digest.hexdigest()}, sent {digits}): the message "
                            "was corrupted on its way; nothing was applied")


def _header_int(name: str, entry: Any, field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(f"tensor {name}: {field} must hold non-negative ints; received {entry!r}")
    return value


def _parse_entry(name: str, entry: Any) -> tuple[np.dtype, tuple[int, ...], int, int]:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise ProtocolError(
            f"tensor {name}: expected an object with keys dtype, shape, data_offsets; received {entry!r}"
        )
    dtype = DTYPES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
    if dtype is None:
        raise ProtocolError(f"tensor {name}: unknown dtype {entry['dtype']!r}; expected one of {sorted(DTYPES)}")
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not isinstance(shape, list):
        raise ProtocolError(f"tensor {name}: shape must be a list of ints; received {shape!r}")
    shape_t = tuple(_header_int(name, entry, "shape", d) for d in shape)
    if not isinstance(offsets, list) or len(offsets) != 2:
        raise ProtocolError(f"tensor {name}: data_offsets must be [begin, end]; received {offsets!r}")
    begin, end = (_header_int(name, entry, "data_offsets", o) for o in offsets)
    expected = math.prod(shape_t) * dtype.itemsize
    if end - begin != expected:
        raise ProtocolError(
            f"tensor {name}: data_offsets [{begin}, {end}] span {end - begin} bytes but "
            f"shape {list(shape_t)} of {entry['dtype']} needs {expected}"
        )
    return dtype, shape_t, begin, end


def _parse_meta(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise ProtocolError(f"__metadata__ must map str to str; received {raw!r:.200}")
    if META_KEY not in raw:
        return {}
    try:
        meta = json.loads(raw[META_KEY])
    except ValueError as exc:
        raise ProtocolError(f"message header in __metadata__ is not valid JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise ProtocolError(f"message header must be a JSON object; received {meta!r:.200}")
    return meta


def decode(
    buf: bytes | bytearray | memoryview,
    template: Sequence[Any] | None = None,
    *,
    count: int | None = None,
    check_finite: bool = True,
    checksum: bool = True,
) -> tuple[list[np.ndarray], dict[str, Any]]:
    """Parse a safetensors message without copying the tensor data.

    The arrays are views of ``buf`` (read-only if ``buf`` is ``bytes``).

    Args:
        buf: the whole message.
        template: optional expected arrays (anything with ``shape`` and
            ``dtype``); count, shapes and dtypes must match exactly.
        count: optional expected number of tensors (implied by ``template``).
        check_finite: reject NaN and inf in float tensors (default True).
        checksum: require the XXH3 checksum and check it (default True;
            False reads plain safetensors buffers, which carry none).

    Returns:
        ``(tensors, meta)``: the arrays in index order and our message header
        (``{}`` if the message carries none).

    Raises:
        ProtocolError: the message is malformed or does not match the template.
    """
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    size = mv.nbytes
    if size < 8:
        raise ProtocolError(f"message of {size} bytes is shorter than the 8-byte header-length prefix")
    hlen = int.from_bytes(mv[:8], "little")
    if hlen > MAX_HEADER_BYTES:
        raise ProtocolError(f"header length {hlen} exceeds the limit of {MAX_HEADER_BYTES} bytes")
    if hlen > size - 8:
        raise ProtocolError(f"header length {hlen} exceeds the {size - 8} bytes after the prefix (truncated?)")
    header_bytes = bytes(mv[8 : 8 + hlen])
    try:
        header = json.loads(header_bytes)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"header is not valid JSON{' (corrupted?)' if checksum else ''}: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a JSON object; received {type(header).__name__}")
    metadata = header.pop("__metadata__", None)
    meta = _parse_meta(metadata)

    n = len(header)
    if template is not None:
        count = len(template)
    if count is not None and n != count:
        raise ProtocolError(f"expected {count} tensors, received {n}")
    parsed: list[Any] = [None] * n
    for name, entry in header.items():
        index = int(name) if name.isdigit() and name.isascii() else -1
        if not 0 <= index < n or name != f"{index:04d}" or parsed[index] is not None:
            raise ProtocolError(f"tensor name {name!r} is not one of '0000'..'{n - 1:04d}' (once each)")
        parsed[index] = _parse_entry(name, entry)

    data_start = 8 + hlen
    data_len = size - data_start
    position = 0
    for dtype, shape, begin, end in sorted(parsed, key=lambda p: (p[2], p[3])):
        if begin != position:
            raise ProtocolError(f"data_offsets are not contiguous: a tensor starts at byte {begin}, expected {position}")
        position = end
    if position > data_len:
        raise ProtocolError(f"data_offsets reach byte {position} but the message holds {data_len} data bytes (truncated?)")
    if position < data_len:
        raise ProtocolError(f"message has {data_len - position} trailing bytes after the last tensor")
    if checksum:  # after the layout checks, which name what is wrong with a truncated or padded message
        _verify_checksum(mv, header_bytes, metadata)

    tensors = [
        np.frombuffer(mv, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=data_start + begin).reshape(shape)
        for dtype, shape, begin, end in parsed
    ]
    if template is not None:
        for i, (t, a) in enumerate(zip(template, tensors)):
            if tuple(t.shape) != a.shape:
                raise ProtocolError(f"tensor {i}: expected shape {tuple(t.shape)}, received {a.shape}")
            if np.dtype(t.dtype) != a.dtype:
                raise ProtocolError(f"tensor {i}: expected dtype {np.dtype(t.dtype)}, received {a.dtype}")
    if check_finite:
        _check_finite(tensors, mv[data_start:])
    return tensors, meta


def _check_finite(tensors: list[np.ndarray], data: memoryview) -> None:
    """Refuse the first tensor holding NaN or inf.

    When every tensor has the same float dtype (a model's usual commit) the
    data section is one array of it, checked in one reduction; only a message
    that fails is looked at tensor by tensor, to name the culprit.
    """
    dtypes = {a.dtype for a in tensors}
    if len(tensors) > 1 and len(dtypes) == 1:
        dtype = dtypes.pop()
        if dtype.kind == "f" and all_finite(np.frombuffer(data, dtype=dtype, count=data.nbytes // dtype.itemsize)):
            return
    for i, a in enumerate(tensors):
        if not all_finite(a):
            raise ProtocolError(f"tensor {i} holds non-finite values (NaN or inf)")

