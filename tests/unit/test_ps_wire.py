"""elephant.ps.wire: safetensors-layout messages, strict decoding, no pickle."""

from __future__ import annotations

import json

import numpy as np
import pytest

import safetensors.numpy as stnp
from safetensors import safe_open

from elephant.errors import ProtocolError  # noqa: E402
from elephant.optimizers.base import Commit, Reply
from elephant.ps import decoding, encoding, layout, wire
from elephant.ps.wire import CommitKey

TENSORS = [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.arange(5, dtype=np.float16),  # odd byte count before wider dtypes: tests alignment
    np.array(2.5),  # 0-d float64
    np.zeros((0, 3), dtype=np.int64),  # zero-size
    np.array([True, False, True]),
    np.array([-1, 7], dtype=np.int8),
    np.array([1, 2**40], dtype=np.uint64),
]


def _message(header: dict, data: bytes = b"", pad: bool = True) -> bytes:
    raw = json.dumps(header).encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + data


def _entry(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


# ---------------------------------------------------------------- round trips
def test_round_trip_keeps_values_shapes_dtypes_and_meta():
    meta = {"run": "r", "epoch": 1, "nested": {"a": [1, 2]}}
    tensors, got_meta = decoding.decode(encoding.encode(TENSORS, meta).tobytes())
    assert got_meta == meta
    assert len(tensors) == len(TENSORS)
    for sent, received in zip(TENSORS, tensors, strict=True):
        assert received.dtype == sent.dtype
        assert received.shape == sent.shape
        np.testing.assert_array_equal(received, sent)


def test_header_is_padded_to_eight_bytes_and_arrays_are_aligned():
    buf = bytearray(encoding.encode(TENSORS, {}).tobytes())
    assert int.from_bytes(buf[:8], "little") % 8 == 0
    tensors, _ = decoding.decode(buf)
    assert all(t.flags.aligned for t in tensors)


def test_encode_does_not_copy_array_data():
    big = np.arange(1000, dtype=np.float32)
    encoded = encoding.encode([big], {})
    assert len(encoded.buffers) == 2
    assert np.shares_memory(np.frombuffer(encoded.buffers[1], dtype=np.uint8), big)
    assert len(encoded) == encoded.nbytes == len(encoded.tobytes())
    assert b"".join(encoded) == encoded.tobytes()


def test_decode_returns_views_of_the_buffer():
    buf = bytearray(encoding.encode([np.zeros(4, dtype=np.float32)], {}).tobytes())
    (array,), _ = decoding.decode(buf)
    buf[-4:] = np.float32(3.0).tobytes()
    assert array[-1] == 3.0


def test_decode_of_bytes_gives_read_only_arrays():
    (array,), _ = decoding.decode(encoding.encode([np.ones(3)], {}).tobytes())
    with pytest.raises(ValueError, match="read-only"):
        array[0] = 2.0


def test_big_endian_input_is_sent_little_endian():
    (array,), _ = decoding.decode(encoding.encode([np.arange(3, dtype=">f4")], {}).tobytes())
    assert array.dtype == np.dtype("<f4")
    np.testing.assert_array_equal(array, [0.0, 1.0, 2.0])


def test_non_contiguous_input_is_encoded_by_value():
    source = np.arange(12.0).reshape(3, 4).T
    (array,), _ = decoding.decode(encoding.encode([source], {}).tobytes())
    np.testing.assert_array_equal(array, source)


# ------------------------------------------------------- safetensors compat
def test_safetensors_library_reads_our_encoding(tmp_path):
    meta = {"kind": "commit", "step": 3}
    buf = encoding.encode(TENSORS, meta).tobytes()
    loaded = stnp.load(buf)
    assert sorted(loaded) == [f"{i:04d}" for i in range(len(TENSORS))]
    for i, sent in enumerate(TENSORS):
        np.testing.assert_array_equal(loaded[f"{i:04d}"], sent)
        assert loaded[f"{i:04d}"].dtype == sent.dtype
    path = tmp_path / "message.safetensors"
    path.write_bytes(buf)
    with safe_open(str(path), framework="np") as f:
        assert json.loads(f.metadata()["elephant"]) == meta


def test_we_read_the_safetensors_library_output():
    meta = {"kind": "reply", "clock": 4}
    named = {f"{i:04d}": t for i, t in enumerate(TENSORS)}
    tensors, got_meta = decoding.decode(stnp.save(named, metadata={"elephant": json.dumps(meta)}), checksum=False)
    assert got_meta == meta
    for sent, received in zip(TENSORS, tensors, strict=True):
        np.testing.assert_array_equal(received, sent)
        assert received.dtype == sent.dtype and received.shape == sent.shape


def test_library_output_without_metadata_decodes_with_empty_meta():
    tensors, meta = decoding.decode(stnp.save({"0000": np.ones(2, dtype=np.float32)}), checksum=False)
    assert meta == {}
    np.testing.assert_array_equal(tensors[0], [1.0, 1.0])


# ------------------------------------------------------------------ errors
GOOD_DATA = np.ones(2, dtype=np.float32).tobytes()


@pytest.mark.parametrize(
    "buf, match",
    [
        (b"\x01\x02", "shorter than the 8-byte header-length prefix"),
        ((100).to_bytes(8, "little") + b"{}", "header length 100 exceeds the 2 bytes after the prefix"),
        ((layout.MAX_HEADER_BYTES + 8).to_bytes(8, "little"), "exceeds the limit"),
        ((8).to_bytes(8, "little") + b"{nojson}", "header is not valid JSON"),
        ((8).to_bytes(8, "little") + b"[1, 2]  ", "header must be a JSON object"),
        (_message({"0000": _entry(dtype="BF16", offsets=(0, 4))}, GOOD_DATA[:4]), "unknown dtype 'BF16'"),
        (_message({"0000": _entry(), "0001": _entry(offsets=(4, 12))}, GOOD_DATA + GOOD_DATA[:4]), "not contiguous"),
        (_message({"0000": _entry(), "0001": _entry(offsets=(12, 20))}, GOOD_DATA * 3), "not contiguous"),
        (_message({"0000": _entry(offsets=(0, 8))}, GOOD_DATA[:6]), "holds 6 data bytes \\(truncated\\?\\)"),
        (_message({"0000": _entry()}, GOOD_DATA + b"xx"), "2 trailing bytes"),
        (_message({"0000": _entry(shape=(3,))}, GOOD_DATA), "span 8 bytes but shape \\[3\\] of F32 needs 12"),
        (_message({"0000": _entry(shape=(-2,))}, GOOD_DATA), "non-negative ints"),
        (_message({"0000": {"dtype": "F32", "shape": [2]}}, GOOD_DATA), "expected an object with keys"),
        (_message({"weights": _entry()}, GOOD_DATA), "tensor name 'weights'"),
        (_message({"0001": _entry()}, GOOD_DATA), "tensor name '0001'"),
        (_message({"__metadata__": {"elephant": 3}, "0000": _entry()}, GOOD_DATA), "must map str to str"),
        (_message({"__metadata__": {"elephant": "{oops"}, "0000": _entry()}, GOOD_DATA), "__metadata__ is not valid"),
        (_message({"__metadata__": {"elephant": "[1]"}, "0000": _entry()}, GOOD_DATA), "must be a JSON object"),
    ],
)
def test_malformed_messages_are_rejected_with_the_reason(buf, match):
    with pytest.raises(ProtocolError, match=match):
        decoding.decode(buf, checksum=False)  # hand-made messages carry no checksum: the structure is under test


def test_unpadded_header_is_accepted():
    tensors, _ = decoding.decode(_message({"0000": _entry()}, GOOD_DATA, pad=False), checksum=False)
    np.testing.assert_array_equal(tensors[0], [1.0, 1.0])


def test_count_mismatch_is_rejected():
    buf = encoding.encode([np.ones(2), np.ones(2)], {}).tobytes()
    with pytest.raises(ProtocolError, match="expected 3 tensors, received 2"):
        decoding.decode(buf, count=3)
    with pytest.raises(ProtocolError, match="expected 1 tensors, received 2"):
        decoding.decode(buf, template=[np.ones(2)])


def test_template_shape_and_dtype_mismatch_are_rejected():
    buf = encoding.encode([np.ones((2, 3), dtype=np.float32)], {}).tobytes()
    with pytest.raises(ProtocolError, match=r"tensor 0: expected shape \(3, 2\), received \(2, 3\)"):
        decoding.decode(buf, template=[np.ones((3, 2), dtype=np.float32)])
    with pytest.raises(ProtocolError, match="tensor 0: expected dtype float64, received float32"):
        decoding.decode(buf, template=[np.ones((2, 3))])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_non_finite_values_are_rejected(bad, dtype):
    values = np.ones(10, dtype=dtype)
    values[7] = bad
    buf = encoding.encode([np.ones(2, dtype=dtype), values], {}).tobytes()
    with pytest.raises(ProtocolError, match="tensor 1 holds non-finite values"):
        decoding.decode(buf)
    tensors, _ = decoding.decode(buf, check_finite=False)
    assert np.isnan(tensors[1][7]) or np.isinf(tensors[1][7])


def test_large_finite_values_whose_sum_overflows_are_accepted():
    values = np.full(4, 3e38, dtype=np.float32)
    tensors, _ = decoding.decode(encoding.encode([values], {}).tobytes())
    np.testing.assert_array_equal(tensors[0], values)


@pytest.mark.parametrize("value", [np.ones(2, dtype=np.complex64), np.array(["a"]), np.array([object()])])
def test_unsupported_dtypes_cannot_be_sent(value):
    with pytest.raises(ProtocolError, match="tensor 0: dtype .* cannot be sent"):
        encoding.encode([value], {})


def test_meta_must_be_json():
    with pytest.raises(ProtocolError, match="not JSON-serialisable"):
        encoding.encode([], {"x": object()})
    with pytest.raises(ProtocolError, match="not JSON-serialisable"):
        encoding.encode([], {"x": float("nan")})


# ---------------------------------------------------------------- messages
def test_commit_round_trip():
    key = CommitKey("run-1", 2, 3, 17)
    commit = Commit(tensors=[np.ones(3, dtype=np.float32)], num_steps=4, num_samples=128, base_clock=9)
    got_key, attempt, got = wire.decode_commit(wire.encode_commit(key, 55, commit).tobytes(), [np.zeros(3, np.float32)])
    assert got_key == key and isinstance(got_key, CommitKey)
    assert attempt == 55
    assert (got.num_steps, got.num_samples, got.base_clock) == (4, 128, 9)
    np.testing.assert_array_equal(got.tensors[0], commit.tensors[0])


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("step", -1, "commit header field 'step' must be an int >= 0; received -1"),
        ("attempt", "7", "'attempt' must be an int >= 0; received '7'"),
        ("epoch", True, "'epoch' must be an int >= 0; received True"),
        ("run", 3, "commit header field 'run' must be a str; received 3"),
        ("kind", "reply", "expected a 'commit' message, received kind='reply'"),
    ],
)
def test_commit_header_fields_are_validated(field, value, match):
    meta = {"kind": "commit", "run": "r", "epoch": 0, "partition": 0, "step": 0, "attempt": 0,
            "num_steps": 1, "num_samples": 1, "base_clock": 0}
    meta[field] = value
    with pytest.raises(ProtocolError, match=match):
        wire.decode_commit(encoding.encode([np.ones(2)], meta).tobytes())


@pytest.mark.parametrize("extra", [None, [], [np.full(2, 5.0)]])
def test_reply_round_trip_keeps_none_and_empty_extras_apart(extra):
    reply = Reply(clock=12, center=[np.ones(2), np.zeros((2, 2), dtype=np.float32)], tensors=extra)
    got = wire.decode_reply(wire.encode_reply(reply).tobytes(), template=reply.center)
    assert got.clock == 12
    assert len(got.center) == 2
    np.testing.assert_array_equal(got.center[1], reply.center[1])
    if extra is None:
        assert got.tensors is None
    else:
        assert len(got.tensors) == len(extra)
        for a, b in zip(got.tensors, extra, strict=True):
            np.testing.assert_array_equal(a, b)


def test_reply_against_a_wrong_template_is_rejected():
    buf = wire.encode_reply(Reply(clock=0, center=[np.ones(2)])).tobytes()
    with pytest.raises(ProtocolError, match=r"center tensor 0: expected float32\[2\], received float64\[2\]"):
        wire.decode_reply(buf, template=[np.ones(2, dtype=np.float32)])
    with pytest.raises(ProtocolError, match="expected 2 center tensors, received 1"):
        wire.decode_reply(buf, template=[np.ones(2), np.ones(2)])


def test_reply_counts_must_match_the_tensors():
    buf = encoding.encode([np.ones(2)], {"kind": "reply", "clock": 0, "n_center": 2, "n_extra": None}).tobytes()
    with pytest.raises(ProtocolError, match="announces 2 center and 0 extra tensors, received 1"):
        wire.decode_reply(buf)


# ---------------------------------------------------------------- checksum
def test_every_flipped_bit_of_a_commit_is_refused():
    """A corrupted commit is refused whatever byte is hit: header, metadata or tensor data."""
    template = [np.zeros((3, 2), np.float32), np.zeros(4, np.float64)]
    commit = Commit(tensors=[np.arange(6, dtype=np.float32).reshape(3, 2), np.linspace(0, 1, 4)], num_steps=2,
                    num_samples=64, base_clock=5)
    good = bytearray(wire.encode_commit(CommitKey("run-a", 1, 0, 3), 17, commit).tobytes())
    wire.decode_commit(bytes(good), template)
    rng = np.random.default_rng(0)
    for position in range(len(good)):
        bad = bytearray(good)
        bad[position] ^= 1 << int(rng.integers(8))
        with pytest.raises(ProtocolError):
            wire.decode_commit(bytes(bad), template)


def test_a_message_without_its_checksum_is_refused():
    plain = stnp.save({"0000": np.ones(2, dtype=np.float32)}, metadata={"elephant": json.dumps({"kind": "reply"})})
    with pytest.raises(ProtocolError, match="carries no valid checksum"):
        decoding.decode(plain)
    buf = encoding.encode([np.ones(2, np.float32)], {"kind": "reply"}).tobytes()
    digits = json.loads(buf[8:8 + int.from_bytes(buf[:8], "little")])["__metadata__"][layout.CHECKSUM_KEY]
    wrong = buf.replace(digits.encode(), b"f" * 16)
    with pytest.raises(ProtocolError, match="checksum mismatch .*nothing was applied"):
        decoding.decode(wrong)
