"""The parameter server's messages: commits and replies in the safetensors layout, no pickle.

The messages the parameter server and its clients exchange: a worker's commit
(:func:`encode_commit`, :func:`decode_commit`) and a pull or commit reply
(:func:`encode_reply`, :func:`decode_reply`), each a safetensors message whose
``"elephant"`` metadata entry is the message header (kind, run, epoch, partition,
step, attempt, clocks, tensor counts). The layout and its checksum are described in
:mod:`~elephant.ps.layout`; :mod:`~elephant.ps.encoding` writes it and
:mod:`~elephant.ps.decoding` reads it strictly: every deviation raises
:class:`~elephant.errors.ProtocolError` with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from elephant.errors import ConfigError, ProtocolError
from elephant.protocol import Commit, CommitKey, Reply
from elephant.ps.decoding import decode
from elephant.ps.encoding import Encoded, encode
from elephant.ps.layout import digest

logger = logging.getLogger(__name__)

__all__ = [
    "CommitKey",
    "encode_commit",
    "decode_commit",
    "encode_reply",
    "decode_reply",
]


# ------------------------------------------------------------------ messages
_COMMIT_INTS = ("epoch", "partition", "step", "attempt", "num_steps", "num_samples", "base_clock")


def _meta_int(meta: Mapping[str, Any], field: str, what: str) -> int:
    value = meta.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(f"{what} header field {field!r} must be an int >= 0; received {value!r}")
    return value


def _check_kind(meta: Mapping[str, Any], kind: str) -> None:
    if meta.get("kind") != kind:
        raise ProtocolError(f"expected a {kind!r} message, received kind={meta.get('kind')!r}")


def encode_commit(key: CommitKey, attempt: int, commit: Commit) -> Encoded:
    """Encode a worker's commit with its idempotency key and task attempt id."""
    meta = {
        "kind": "commit",
        "run": key.run,
        "epoch": key.epoch,
        "partition": key.partition,
        "step": key.step,
        "attempt": attempt,
        "num_steps": commit.num_steps,
        "num_samples": commit.num_samples,
        "base_clock": commit.base_clock,
    }
    return encode(commit.tensors, meta)


def decode_commit(
    buf: bytes | bytearray | memoryview, template: Sequence[Any] | None = None
) -> tuple[CommitKey, int, Commit]:
    """Decode and validate a commit: ``(key, attempt, commit)``.

    Raises:
        ProtocolError: malformed message, header fields, or tensors that do not
            match ``template`` (count, shapes, dtypes) or are not finite.
    """
    tensors, meta = decode(buf, template)
    _check_kind(meta, "commit")
    if not isinstance(meta.get("run"), str):
        raise ProtocolError(f"commit header field 'run' must be a str; received {meta.get('run')!r}")
    ints = {f: _meta_int(meta, f, "commit") for f in _COMMIT_INTS}
    key = CommitKey(meta["run"], ints["epoch"], ints["partition"], ints["step"])
    counts = {f: ints[f] for f in ("num_steps", "num_samples", "base_clock")}
    return key, ints["attempt"], Commit(tensors=tensors, **counts)


def encode_reply(reply: Reply, changed: bool = False) -> Encoded:
    """Encode a pull or commit reply: the center, then the optional reply tensors.

    With ``changed`` and a reply that has a :attr:`~elephant.protocol.Reply.change`,
    the encoded change travels instead of the center (for a client that holds
    the change's base view); a reply with a :attr:`~elephant.protocol.Reply.view`
    names it, so the client knows what it holds.
    """
    extra = reply.tensors
    meta: dict[str, Any] = {
        "kind": "reply",
        "clock": reply.clock,
        "n_center": len(reply.center),
        "n_extra": None if extra is None else len(extra),
    }
    if reply.view is not None:
        meta["view"] = reply.view
    change = reply.change if changed else None
    if change is None:
        return encode(list(reply.center) + list(extra or []), meta)
    meta.update(delta_of=change.base, codec=change.codec, block=change.block)
    return encode(list(change.layout) + list(extra or []), meta)


def _str_field(meta: Mapping[str, Any], field: str) -> str:
    value = meta.get(field)
    if not isinstance(value, str) or not value:
        raise ProtocolError(f"reply header field {field!r} must be a non-empty str; received {value!r}")
    return value


def _rebuild(meta: Mapping[str, Any], layout: list[np.ndarray], held: tuple[str, Sequence[Any]] | None) -> list:
    """The center a change reply encodes, from the view this client holds; its digest must be the reply's."""
    from elephant.optimizers.codecs import Codec, apply_change

    base, view = _str_field(meta, "delta_of"), _str_field(meta, "view")
    if held is None or held[0] != base:
        have = "no view" if held is None else f"view {held[0]}"
        raise ProtocolError(f"reply is a change from view {base}, but this client holds {have}")
    block = meta.get("block")
    try:
        codec = Codec(meta.get("codec"), block)
    except ConfigError as exc:
        raise ProtocolError(f"reply header names an invalid codec: {exc}") from None
    center = apply_change(codec, held[1], layout)
    for a in center:
        a.flags.writeable = False
    rebuilt = digest(center)
    if rebuilt != view:
        raise ProtocolError(f"the view rebuilt from a change reply has digest {rebuilt}, the server's {view}")
    return center


def decode_reply(buf: bytes | bytearray | memoryview, template: Sequence[Any] | None = None,
                 held: tuple[str, Sequence[Any]] | None = None) -> Reply:
    """Decode a reply; ``template`` (optional) is checked against the center part.

    A change reply (:func:`encode_reply` with ``changed``) is rebuilt from
    ``held``, the ``(view, center)`` of this client's last reply, and the
    result's digest checked against the reply's view.
    """
    tensors, meta = decode(buf)
    _check_kind(meta, "reply")
    clock = _meta_int(meta, "clock", "reply")
    n_center = _meta_int(meta, "n_center", "reply")
    n_extra = meta.get("n_extra")
    if n_extra is not None:
        n_extra = _meta_int(meta, "n_extra", "reply")
    n_sent = 2 * n_center if "delta_of" in meta else n_center  # a change: codes and scales per tensor
    if n_sent + (n_extra or 0) != len(tensors):
        raise ProtocolError(
            f"reply header announces {n_sent} center and {n_extra or 0} extra tensors, received {len(tensors)}"
        )
    view = _str_field(meta, "view") if "view" in meta else None
    center = tensors[:n_center] if "delta_of" not in meta else _rebuild(meta, tensors[:n_sent], held)
    if template is not None:
        if len(template) != n_center:
            raise ProtocolError(f"expected {len(template)} center tensors, received {n_center}")
        for i, (t, a) in enumerate(zip(template, center)):
            if tuple(t.shape) != a.shape or np.dtype(t.dtype) != a.dtype:
                raise ProtocolError(
                    f"center tensor {i}: expected {np.dtype(t.dtype)}{list(t.shape)}, received {a.dtype}{list(a.shape)}"
                )
    return Reply(clock=clock, center=center, tensors=None if n_extra is None else tensors[n_sent:], view=view)
