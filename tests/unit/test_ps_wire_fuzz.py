"""The wire decoder under random input, with hypothesis (reliability plan T22, the short CI part).

Properties: every valid message round-trips exactly; anything else, random bytes or a
valid message with bytes changed, cut or added, either decodes to exactly what was sent
(a change hypothesis reverted) or raises ProtocolError, never another exception; and
no input takes long. ``benchmarks/fuzz_wire.py`` runs the same properties for minutes.
"""

import time

import numpy as np

from hypothesis import HealthCheck, given, settings, strategies as st

from elephant.errors import ProtocolError  # noqa: E402
from elephant.optimizers.base import Commit  # noqa: E402
from elephant.ps import wire  # noqa: E402

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def arrays(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
    size = int(np.prod(shape))
    if dtype.kind == "f":
        values = draw(st.lists(st.floats(-1e4, 1e4, width=16 if dtype.itemsize == 2 else 32), min_size=size,
                               max_size=size))
    elif dtype.kind == "b":
        values = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    else:
        values = draw(st.lists(st.integers(0, 100), min_size=size, max_size=size))
    return np.asarray(values, dtype=dtype).reshape(shape)


@st.composite
def commits(draw):
    tensors = draw(st.lists(arrays(), min_size=1, max_size=4))
    key = wire.CommitKey(draw(st.text(min_size=1, max_size=8)), *draw(st.tuples(*[st.integers(0, 2**31)] * 3)))
    commit = Commit(tensors=tensors, num_steps=draw(st.integers(0, 1000)), num_samples=draw(st.integers(0, 10**6)),
                    base_clock=draw(st.integers(0, 10**6)))
    return key, draw(st.integers(0, 2**40)), commit


def decode_or_refuse(buf, template=None):
    """Decode ``buf``; the only failure allowed is ProtocolError, and no input may take long."""
    started = time.perf_counter()
    try:
        return wire.decode_commit(buf, template)
    except ProtocolError:
        return None
    finally:
        assert time.perf_counter() - started < 0.5


@SETTINGS
@given(commits())
def test_every_valid_commit_round_trips(message):
    key, attempt, commit = message
    got_key, got_attempt, got = wire.decode_commit(wire.encode_commit(key, attempt, commit).tobytes(), commit.tensors)
    assert (got_key, got_attempt) == (key, attempt)
    assert (got.num_steps, got.num_samples, got.base_clock) == (commit.num_steps, commit.num_samples, commit.base_clock)
    for a, b in zip(commit.tensors, got.tensors, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


@SETTINGS
@given(st.binary(max_size=2048))
def test_random_bytes_are_refused_cleanly(buf):
    assert decode_or_refuse(buf) is None


@SETTINGS
@given(commits(), st.data())
def test_a_changed_message_is_refused_or_unchanged(message, data):
    key, attempt, commit = message
    good = wire.encode_commit(key, attempt, commit).tobytes()
    bad = bytearray(good)
    edit = data.draw(st.sampled_from(["flip", "cut", "append", "splice"]))
    if edit == "flip":
        at = data.draw(st.integers(0, len(bad) - 1))
        bad[at] ^= data.draw(st.integers(1, 255))
    elif edit == "cut":
        del bad[data.draw(st.integers(0, len(bad) - 1)):]
    elif edit == "append":
        bad += data.draw(st.binary(min_size=1, max_size=64))
    else:
        at = data.draw(st.integers(0, len(bad)))
        bad[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    decoded = decode_or_refuse(bytes(bad), commit.tensors)
    assert decoded is None or bytes(bad) == good
