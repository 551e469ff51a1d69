"""Lossy codecs for commit payloads and the worker's error feedback: pure numpy.

Two codecs, each a pair of pure functions over one tensor:

* ``"bf16"``: float32 → bfloat16 (the upper 16 bits of the float32 pattern, rounded
  to nearest, ties to even), stored as ``uint16``; 2 bytes per element.
  Error bound, for every finite ``x`` with ``|x| ≤`` :data:`BF16_MAX`:
  ``|decode(encode(x)) − x| ≤ 2⁻⁸·|x|`` for normal values and ``≤ 2⁻¹³⁴`` in the
  subnormal range (half a bfloat16 unit in the last place; bfloat16 keeps
  float32's exponent range and 8 significant bits). Values representable in
  bfloat16 (float32 values whose low 16 bits are zero) round-trip exactly.
  Finite values above :data:`BF16_MAX` round to ±inf (as round-to-nearest does);
  ±inf stays ±inf and NaN stays NaN (a quiet NaN with the same sign).
* ``"int8"``: symmetric absmax quantisation. The flattened tensor is cut into
  blocks of ``block`` elements (the last one shorter; ``block=None``: one block,
  a per-tensor scale). Each block gets the float32 scale ``s = max|x| / 127`` and
  the codes ``q = round(x / s)`` in [−127, 127], stored as ``int8`` in the
  tensor's shape; decoding gives ``q·s``. Error bound, per element of a block
  whose scale is a normal float32 (``max|x| ≥ 127·2⁻¹²⁶``), float32 arithmetic
  included: ``|decode(encode(x)) − x| ≤ (1/2 + 2⁻¹⁶)·s`` (half a step, plus the
  rounding of ``x/s`` and of ``q·s``, each under ``2⁻¹⁷·s`` for ``|q| ≤ 127``).
  An all-zero block has ``s = 0`` and decodes to exact zeros. A block holding NaN or ±inf gets ``s = NaN`` (codes 0),
  so it decodes to NaN and the wire refuses the message: non-finite values are
  never silently made finite. 1 byte per element plus 4 bytes per block
  (``block=256``: 1.016 bytes per element, 3.94 times fewer than float32).

Encoded tensors travel as a **layout** of two arrays per weight tensor, so a
commit stays a flat list of arrays for :mod:`elephant.ps.wire` and the server can
decode it without knowing the model: ``[data₀ … dataₙ₋₁, side₀ … sideₙ₋₁]`` where
``dataᵢ`` has the tensor's shape (``int8`` or ``uint16`` codes) and ``sideᵢ`` holds
the ``int8`` scales (``float32``, one per block) or is an empty ``float32`` array
(``bf16``). A tensor that is not floating point (an integer counter in some
layers) travels unchanged as ``dataᵢ`` with an empty ``uint8`` ``sideᵢ`` marking it.

Error feedback (Seide et al., 2014; Karimireddy et al., 2019): the worker adds the
residual of its last encoding to the next payload before encoding it,
``t = p + r;  sent = encode(t);  r ← t − decode(sent)``, so over any number of
windows ``Σ decode(sentₖ) + r_final = Σ pₖ`` (up to float32 rounding): nothing is
lost, only delayed by a window. See :func:`encode_with_feedback`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from elephant.errors import ConfigError, ProtocolError

__all__ = ["BF16_MAX", "CODECS", "DEFAULT_BLOCK", "Codec", "apply_change", "bf16_decode", "bf16_encode",
           "decode_layout", "encode_change", "encode_with_feedback", "int8_decode", "int8_encode", "layout_template",
           "zero_residual"]

#: The codec names :class:`Codec` accepts.
CODECS = ("bf16", "int8")
#: The default ``int8`` block: 256 elements of the flattened tensor per scale.
DEFAULT_BLOCK = 256
#: The largest finite bfloat16 value, (2 − 2⁻⁷)·2¹²⁷.
BF16_MAX = float(np.array(0x7F7F0000, np.uint32).view(np.float32))
_RAW = np.dtype(np.uint8)  # the side array's dtype marking a tensor sent unchanged


# ------------------------------------------------------------------ bfloat16
def bf16_encode(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to bfloat16 (nearest, ties to even) as ``uint16`` codes of the same shape."""
    x32 = np.asarray(x, dtype=np.float32)
    bits = np.ascontiguousarray(x32).reshape(-1).view(np.uint32)
    rounded = bits >> 16  # in place from here: one temporary
    rounded &= np.uint32(1)
    rounded += np.uint32(0x7FFF)
    with np.errstate(over="ignore"):  # NaN patterns may wrap around: they are replaced below
        rounded += bits
    rounded >>= 16
    codes = rounded.astype(np.uint16)
    nan = np.isnan(x32.reshape(-1))
    if nan.any():
        codes[nan] = ((bits[nan] >> 16) | np.uint32(0x0040)).astype(np.uint16)  # a quiet NaN keeping its sign
    return codes.reshape(x32.shape)


def bf16_decode(codes: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 ``codes`` (exact: every bfloat16 value is a float32 value)."""
    return (np.asarray(codes, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ------------------------------------------------------------------ int8
def _blocks(flat: np.ndarray, block: int | None) -> np.ndarray:
    """``flat`` as rows of ``block`` elements, the last one padded with zeros (``block=None``: one row)."""
    if block is None:
        return flat.reshape(1, -1)
    if flat.size % block == 0:  # whole blocks: a view, no copy
        return flat.reshape(-1, block)
    rows = -(-flat.size // block)
    padded = np.zeros(rows * block, dtype=flat.dtype)
    padded[: flat.size] = flat
    return padded.reshape(rows, block)


def int8_encode(x: np.ndarray, block: int | None = DEFAULT_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, scales)``: ``int8`` codes in ``x``'s shape and one ``float32`` scale per block.

    Args:
        x: the tensor (any float dtype; encoded from its float32 value, in float32 arithmetic).
        block: elements of the flattened tensor per scale. Default 256; None: one
            scale for the whole tensor (``scales`` then has shape ``(1,)``).
    """
    x32 = np.asarray(x, dtype=np.float32)
    rows = _blocks(x32.reshape(-1), block)
    with np.errstate(invalid="ignore", over="ignore"):
        if rows.size:
            absmax = np.maximum(rows.max(axis=1), -rows.min(axis=1))  # NaN propagates
        else:
            absmax = np.zeros(rows.shape[0], np.float32)
        scales = (absmax.astype(np.float64) / 127.0).astype(np.float32)
        bad = ~np.isfinite(scales)  # a block holding NaN or inf
        scales[bad] = np.nan
        q = rows / np.where(scales > 0, scales, np.float32(1.0))[:, None]
        np.rint(q, out=q)
    q[bad] = 0
    np.clip(q, -127, 127, out=q)
    codes = q.astype(np.int8).reshape(-1)[: x32.size].reshape(x32.shape)
    return codes, scales


def int8_decode(codes: np.ndarray, scales: np.ndarray, block: int | None = DEFAULT_BLOCK) -> np.ndarray:
    """float32 values ``codes · scale`` in ``codes``' shape (``block`` as given to :func:`int8_encode`).

    Raises:
        ProtocolError: ``scales`` does not hold one scale per block of ``codes``.
    """
    codes, scales = np.asarray(codes), np.asarray(scales)
    rows = _blocks(codes.reshape(-1).astype(np.float32), block)
    if scales.shape != (rows.shape[0],):
        raise ProtocolError(f"int8 codes of shape {codes.shape} with block={block} need {rows.shape[0]} scales; "
                            f"received scales of shape {scales.shape}")
    values = rows * np.asarray(scales, dtype=np.float32)[:, None]
    return values.reshape(-1)[: codes.size].reshape(codes.shape)


# ------------------------------------------------------------------ codec
@dataclasses.dataclass(frozen=True)
class Codec:
    """One codec with its settings; ``encode``/``decode`` work on one tensor.

    Args:
        name: ``"bf16"`` or ``"int8"`` (see the module docstring for each one's error bound).
        block: ``int8`` only: elements per scale, a positive int, or None for one
            scale per tensor. Default 256 (:data:`DEFAULT_BLOCK`). ``bf16`` has no
            scales and keeps ``block=None`` whatever is given.

    Raises:
        ConfigError: an unknown ``name`` or a ``block`` that is not a positive int or None.
    """

    name: str = "int8"
    block: int | None = DEFAULT_BLOCK

    def __post_init__(self):
        if self.name not in CODECS:
            raise ConfigError(f"`codec` must be one of {CODECS}; received codec={self.name!r}")
        block = self.block
        if block is not None and (isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1):
            raise ConfigError(f"`block` must be a positive int or None; received block={block!r}")
        object.__setattr__(self, "block", None if self.name == "bf16" or block is None else int(block))

    def encode(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(data, side)`` for float tensor ``x``: the codes in ``x``'s shape and the scales (empty for bf16)."""
        if self.name == "bf16":
            return bf16_encode(x), np.zeros(0, np.float32)
        return int8_encode(x, self.block)

    def decode(self, data: np.ndarray, side: np.ndarray) -> np.ndarray:
        """The float32 tensor of ``data``'s shape that ``(data, side)`` encodes."""
        if self.name == "bf16":
            return bf16_decode(data)
        return int8_decode(data, side, self.block)

    def template(self, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Zero-memory arrays with the shapes and dtypes of ``encode``'s output for a tensor of ``shape``."""
        if self.name == "bf16":
            return np.broadcast_to(np.uint16(0), shape), np.zeros(0, np.float32)
        size = int(np.prod(shape, dtype=np.int64))
        blocks = 1 if self.block is None else -(-size // self.block)
        return np.broadcast_to(np.int8(0), shape), np.broadcast_to(np.float32(0), (blocks,))


def _floating(a: np.ndarray) -> bool:
    return np.asarray(a).dtype.kind == "f"


def layout_template(codec: Codec, template: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Zero-memory arrays with the shapes and dtypes of the encoded layout of weights like ``template``."""
    pairs = [codec.template(np.shape(t)) if _floating(t) else (t, np.zeros(0, _RAW)) for t in template]
    return [d for d, _ in pairs] + [s for _, s in pairs]


def zero_residual(template: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The residual at the start of a partition: float32 zeros for each floating tensor, None for the others."""
    return [np.zeros(np.shape(t), np.float32) if _floating(t) else None for t in template]


def encode_with_feedback(codec: Codec, payload: Sequence[np.ndarray],
                         residual: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
    """Encode ``payload + residual``; return ``(layout, new_residual)``.

    For each floating tensor ``t = p + r`` (in float32), the layout carries
    ``encode(t)`` and the new residual is ``t − decode(encode(t))``. Other
    tensors travel unchanged and keep a None residual. Pure: the arguments are
    not modified.
    """
    data, side, new = [], [], []
    for p, r in zip(payload, residual, strict=True):
        if not _floating(p):
            data.append(np.asarray(p))
            side.append(np.zeros(0, _RAW))
            new.append(None)
            continue
        target = np.asarray(p, dtype=np.float32) + r
        d, s = codec.encode(target)
        data.append(d)
        side.append(s)
        new.append(target - codec.decode(d, s))
    return data + side, new


def decode_layout(codec: Codec, layout: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The payload a layout encodes: float32 tensors (and the unchanged non-float ones), in order.

    Raises:
        ProtocolError: the layout has an odd count, an array that does not match
            ``codec``, or decodes to NaN or inf (the wire refuses non-finite float
            tensors; codes hide them from its check, so it is repeated here).
    """
    if len(layout) % 2:
        raise ProtocolError(f"a {codec.name} layout holds two arrays per tensor; received {len(layout)} arrays")
    n = len(layout) // 2
    out = []
    for i, (d, s) in enumerate(zip(layout[:n], layout[n:])):
        if s.dtype == _RAW:
            out.append(d)
            continue
        want = np.uint16 if codec.name == "bf16" else np.int8
        if d.dtype != want or s.dtype != np.float32:
            raise ProtocolError(f"tensor {i}: a {codec.name} layout needs {np.dtype(want)} codes and float32 scales; "
                                f"received {d.dtype} and {s.dtype}")
        x = codec.decode(d, s)
        if not np.isfinite(x).all():
            raise ProtocolError(f"tensor {i} decodes from {codec.name} to non-finite values (NaN or inf)")
        out.append(x)
    return out


def apply_change(codec: Codec, view: Sequence[np.ndarray], layout: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The weights a holder of ``view`` rebuilds from an encoded change (:func:`encode_change`'s layout).

    Each floating tensor becomes ``view + decode(change)``, computed in float32 and
    cast back to the view's dtype; a tensor that is not floating point travels whole
    and is taken as it is. The server and every client call this one function on the
    same inputs, so their results agree bit for bit (element-wise float32 arithmetic
    is correctly rounded whatever the machine).

    Raises:
        ProtocolError: the layout does not match ``codec`` or ``view`` (count, shapes),
            or decodes to non-finite values.
    """
    decoded = decode_layout(codec, layout)
    if len(decoded) != len(view):
        raise ProtocolError(f"a change of {len(decoded)} tensors cannot apply to weights of {len(view)} tensors")
    out = []
    for i, (v, x) in enumerate(zip(view, decoded)):
        v = np.asarray(v)
        if np.shape(x) != v.shape:
            raise ProtocolError(f"tensor {i}: a change of shape {np.shape(x)} cannot apply to weights of shape {v.shape}")
        if not _floating(v):
            out.append(np.array(x, dtype=v.dtype, copy=True))
            continue
        out.append(np.asarray(np.add(v, x, dtype=np.float32), dtype=v.dtype))  # 0-d stays an array
    return out


def encode_change(codec: Codec, view: Sequence[np.ndarray],
                  center: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Encode the step from ``view`` (what the workers hold) to ``center``: ``(layout, new_view)``.

    The layout carries ``encode(center − view)`` for each floating tensor (the
    whole tensor for the others), and ``new_view`` is :func:`apply_change` of it:
    what a worker holding ``view`` rebuilds. The next change is measured from
    ``new_view`` again, so the quantisation error is fed back and never piles up:
    ``new_view`` stays within one encoding's error of ``center``, whatever the
    number of rounds (for ``int8``, half a step of the change's block scale).
    """
    data, side = [], []
    for v, c in zip(view, center, strict=True):
        c = np.asarray(c)
        if not _floating(c):
            data.append(c)
            side.append(np.zeros(0, _RAW))
            continue
        d, s = codec.encode(np.subtract(c, v, dtype=np.float32))
        data.append(d)
        side.append(s)
    layout = data + side
    return layout, apply_change(codec, view, layout)
