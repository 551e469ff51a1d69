"""Compressed commits: the codecs' bounds, error feedback, the rule transform, the wire and the store."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from elephant.config import Settings
from elephant.errors import ConfigError, ProtocolError
from elephant.optimizers import Commit, Compressed, get, serialize, simulate
from elephant.optimizers.codecs import (BF16_MAX, Codec, apply_change, bf16_decode, bf16_encode, decode_layout,
                                        encode_change, encode_with_feedback, int8_decode, int8_encode,
                                        layout_template, zero_residual)
from elephant.optimizers.schedules import round_robin
from elephant.ps import wire
from elephant.ps.guard import _squared_norm
from elephant.ps.layout import digest
from elephant.protocol import CommitKey
from tests.unit.test_simulate_replay import assert_same_center, replay_async, replay_rounds, run_threads

F32_EPS = 2.0**-23
SHAPES = [(), (0,), (0, 3), (7,), (3, 5), (2, 3, 4), (1000,)]


def _bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def _f32(bits):
    return np.array(bits, np.uint32).view(np.float32)


# ------------------------------------------------------------------ bf16
def test_bf16_round_trips_exactly_on_bfloat16_values():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=4096) * 10.0 ** rng.integers(-30, 30, 4096)).astype(np.float32)
    x = _f32(_bits(x) & np.uint32(0xFFFF0000))  # drop the low 16 bits: bfloat16 values
    specials = np.array([0.0, -0.0, np.inf, -np.inf, BF16_MAX, -BF16_MAX, _f32(0x00010000), 1.0, -2.5], np.float32)
    for values in (x, specials):
        back = bf16_decode(bf16_encode(values))
        np.testing.assert_array_equal(_bits(back), _bits(values))


def test_bf16_rounds_to_nearest_even_within_half_an_ulp():
    rng = np.random.default_rng(1)
    x = (rng.normal(size=100_000) * 10.0 ** rng.integers(-35, 35, 100_000)).astype(np.float32)
    err = np.abs(bf16_decode(bf16_encode(x)).astype(np.float64) - x)
    assert np.all(err <= np.maximum(2.0**-8 * np.abs(x), 2.0**-134))
    # ties go to the even code: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7
    ties = _f32([0x3F808000, 0x3F818000, 0xBF808000])
    assert list(bf16_encode(ties)) == [0x3F80, 0x3F82, 0xBF80]
    assert list(bf16_encode(_f32([0x3F808001]))) == [0x3F81]  # just above the tie: up


def test_bf16_non_finite_and_overflow():
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 3.4e38, -3.4e38, _f32(0x7F7F7FFF)], np.float32)
    back = bf16_decode(bf16_encode(x))
    assert np.isnan(back[:2]).all() and np.signbit(back[1]) and not np.signbit(back[0])
    assert list(back[2:6]) == [np.inf, -np.inf, np.inf, -np.inf]  # above BF16_MAX's half-ulp: inf, as RNE says
    assert back[6] == BF16_MAX  # below it: the largest finite value


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("codec", [Codec("bf16"), Codec("int8", None), Codec("int8", 4), Codec("int8")])
def test_codecs_keep_shape_and_give_float32(codec, shape):
    x = np.random.default_rng(2).normal(size=shape).astype(np.float64)  # any float dtype in, float32 out
    data, side = codec.encode(x)
    assert data.shape == shape and data.dtype == (np.uint16 if codec.name == "bf16" else np.int8)
    want_data, want_side = codec.template(shape)
    assert (want_data.shape, want_data.dtype, want_side.shape, want_side.dtype) == (data.shape, data.dtype,
                                                                                     side.shape, side.dtype)
    out = codec.decode(data, side)
    assert out.shape == shape and out.dtype == np.float32


# ------------------------------------------------------------------ int8
@pytest.mark.parametrize("block", [None, 1, 3, 256])
def test_int8_error_is_within_half_a_scale_per_element(block):
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(size=5000), rng.standard_cauchy(size=1000)]).astype(np.float32)
    codes, scales = int8_encode(x, block)
    out = int8_decode(codes, scales, block).astype(np.float64)
    per = np.repeat(scales.astype(np.float64), x.size if block is None else block)[: x.size]
    assert np.all(np.abs(out - x) <= per * (0.5 + 2.0**-16))
    assert np.abs(codes).max() == 127


def test_int8_scales_are_each_blocks_absmax_over_127():
    x = np.arange(-10, 11, dtype=np.float32) * np.float32(0.5)  # 21 elements, blocks of 8: 8, 8, 5
    codes, scales = int8_encode(x, 8)
    np.testing.assert_array_equal(scales, np.float32(np.array([5.0, 2.5, 5.0]) / 127))
    _, single = int8_encode(x, None)
    assert single.shape == (1,) and single[0] == np.float32(5.0 / 127)
    # an outlier only coarsens its own block
    y = np.full(512, 0.01, np.float32)
    y[0] = 1e6
    out = Codec("int8", 256).decode(*Codec("int8", 256).encode(y))
    np.testing.assert_allclose(out[256:], 0.01, rtol=1e-6)
    assert np.all(Codec("int8", None).decode(*Codec("int8", None).encode(y))[1:] == 0)  # per tensor: all lost


def test_int8_zeros_signs_and_extremes():
    zeros = np.zeros((4, 4), np.float32)
    codes, scales = int8_encode(zeros, 4)
    assert not codes.any() and not scales.any()
    np.testing.assert_array_equal(int8_decode(codes, scales, 4), zeros)
    x = np.random.default_rng(4).normal(size=300).astype(np.float32)
    np.testing.assert_array_equal(int8_encode(-x)[0], -int8_encode(x)[0])  # symmetric
    out = int8_decode(*int8_encode(x, None), None)
    i = np.argmax(np.abs(x))
    assert abs(out[i] - x[i]) <= abs(x[i]) * F32_EPS  # the absmax element is code ±127: exact up to rounding


def test_int8_non_finite_poisons_only_its_block():
    x = np.ones(12, np.float32)
    x[1], x[9] = np.nan, -np.inf
    codes, scales = int8_encode(x, 4)
    assert np.isnan(scales[[0, 2]]).all() and scales[1] == np.float32(1 / 127)
    assert not codes[:4].any() and not codes[8:].any()
    out = int8_decode(codes, scales, 4)
    assert np.isnan(out[:4]).all() and np.isnan(out[8:]).all() and np.allclose(out[4:8], 1.0)


def test_int8_decode_checks_the_scale_count():
    codes, scales = int8_encode(np.ones(10, np.float32), 4)
    with pytest.raises(ProtocolError, match=r"need 3 scales; received scales of shape \(2,\)"):
        int8_decode(codes, scales[:2], 4)


@pytest.mark.parametrize("kwargs, match", [
    ({"name": "int4"}, r"`codec` must be one of \('bf16', 'int8'\); received codec='int4'"),
    ({"block": 0}, r"`block` must be a positive int or None; received block=0"),
    ({"block": True}, r"received block=True"),
    ({"block": 2.5}, r"received block=2.5"),
])
def test_codec_validation(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Codec(**kwargs)


def test_bf16_keeps_no_block():
    assert Codec("bf16", 64).block is None and Codec("int8", np.int64(64)).block == 64


# ------------------------------------------------------------------ error feedback
@pytest.mark.parametrize("codec", [Codec("int8", 16), Codec("int8", None), Codec("bf16")])
def test_error_feedback_loses_nothing_over_many_windows(codec):
    """Σ decode(sentₖ) + r_final = Σ pₖ, up to one float32 rounding per window."""
    rng = np.random.default_rng(5)
    template = [np.zeros((6, 20), np.float32), np.zeros(5, np.float32), np.zeros(3, np.int64)]
    residual = zero_residual(template)
    sent_sum = [np.zeros(t.shape) for t in template]
    raw_sum = [np.zeros(t.shape) for t in template]
    windows = 50
    for k in range(windows):
        scale = 10.0 ** rng.uniform(-4, 0)
        payload = [(rng.standard_cauchy(size=t.shape) * scale).astype(t.dtype) for t in template[:2]]
        payload.append(np.arange(3) + k)  # an integer tensor travels unchanged
        layout, residual = encode_with_feedback(codec, payload, residual)
        for s, r, d, p in zip(sent_sum, raw_sum, decode_layout(codec, layout), payload):
            s += d
            r += p
    np.testing.assert_array_equal(sent_sum[2], raw_sum[2])
    assert residual[2] is None
    for s, r, res in zip(sent_sum[:2], raw_sum[:2], residual[:2]):
        bound = windows * F32_EPS * np.abs(r).max()
        assert np.abs(s + res - r).max() <= bound
        assert np.abs(res).max() > 0  # the check above is not vacuous


def test_without_feedback_the_error_grows():
    rng = np.random.default_rng(6)
    codec, total, drift = Codec("int8", None), np.zeros(200), np.zeros(200)
    residual = zero_residual([np.zeros(200, np.float32)])
    fed = np.zeros(200)
    for _ in range(200):
        p = (rng.normal(size=200) * 1e-3 + 2e-3).astype(np.float32)
        p[0] = 1.0  # one large element sets a coarse scale (1/127): alone, the small ones round to zero
        total += p
        drift += codec.decode(*codec.encode(p))
        layout, residual = encode_with_feedback(codec, [p], residual)
        fed += decode_layout(codec, layout)[0]
    assert np.abs(fed - total).max() <= 0.5 / 127 * (1 + 1e-5)  # only the last residual is missing
    assert np.abs(drift - total).max() > 0.3  # without feedback the small elements' sum is lost


def test_feedback_is_pure():
    p, r = [np.ones(4, np.float32)], [np.full(4, 0.25, np.float32)]
    encode_with_feedback(Codec("int8", None), p, r)
    assert p[0].tolist() == [1.0] * 4 and r[0].tolist() == [0.25] * 4


def test_decode_layout_refusals():
    codec = Codec("bf16")
    nan_layout = [np.array([0x7FC0], np.uint16), np.zeros(0, np.float32)]
    with pytest.raises(ProtocolError, match="tensor 0 decodes from bf16 to non-finite values"):
        decode_layout(codec, nan_layout)
    with pytest.raises(ProtocolError, match="two arrays per tensor; received 3 arrays"):
        decode_layout(codec, nan_layout + nan_layout[:1])
    with pytest.raises(ProtocolError, match="tensor 0: a int8 layout needs int8 codes and float32 scales"):
        decode_layout(Codec("int8"), [np.zeros(2, np.uint16), np.zeros(1, np.float32)])


# ------------------------------------------------------------------ the rule transform
def _bf16_exact_grad(ws):
    """A constant gradient whose SGD steps (lr 0.5) and their sums stay bfloat16 values."""
    return [np.full(w.shape, v, w.dtype) for w, v in zip(ws, (-0.25, 1.5))]


INNERS = [("downpour", "asynchronous", {}), ("agn", "asynchronous", {"window": 4}),
          ("dynsgd", "asynchronous", {"window": 2}), ("delayednesterov", "asynchronous", {"window": 2}),
          ("modelaveraging", "synchronous", {"window": 2})]


@pytest.mark.parametrize("name, mode, kwargs", INNERS, ids=[i[0] for i in INNERS])
def test_wrapped_rule_equals_the_rule_when_the_codec_is_lossless(name, mode, kwargs):
    init = [np.zeros((3, 2), np.float32), np.zeros(2, np.float32)]
    inner = get(name, **kwargs)
    schedule = round_robin(2, inner.window, 4)
    plain = simulate(inner, init, _bf16_exact_grad, schedule, mode=mode, local_lr=0.5)
    wrapped = simulate(Compressed(inner, "bf16"), init, _bf16_exact_grad, schedule, mode=mode, local_lr=0.5)
    assert len(plain.centers) == len(wrapped.centers) > 0
    for mine, theirs in zip(wrapped.centers, plain.centers, strict=True):
        for got, want in zip(mine, theirs, strict=True):
            np.testing.assert_array_equal(got, want)


def test_int8_wrapped_downpour_is_exact_on_multiples_of_a_power_of_two_scale():
    # lr 0.5: each step's delta is an integer multiple of 2^-7 (block 0) or 2^-9 (block 1) with absmax 127 of them
    g = np.array([-127, -42, 43, 127, -127 / 4, -19, 6.25, 6.5], np.float32) * np.float32(2.0**-6)
    init = [np.zeros(8, np.float32)]
    grad = lambda ws: [g]  # noqa: E731
    plain = simulate(get("downpour"), init, grad, round_robin(1, 1, 5), local_lr=0.5)
    wrapped = simulate(Compressed("downpour", "int8", block=4), init, grad, round_robin(1, 1, 5), local_lr=0.5)
    np.testing.assert_array_equal(wrapped.center[0], plain.center[0])
    assert not np.any(wrapped.workers[0].state["residual"][0])


def test_rule_level_feedback_center_plus_residual_is_the_sum_of_deltas():
    opt = Compressed("downpour", "int8", block=8)
    rng = np.random.default_rng(7)
    center = [np.zeros(20, np.float32)]
    state, total = opt.worker_init(center), np.zeros(20)
    for _ in range(30):
        delta = (rng.normal(size=20) * 10.0 ** rng.uniform(-3, 0)).astype(np.float32)
        pulled = [np.zeros(20, np.float32)]
        layout, state = opt.make_commit(state, [delta], pulled, 1)
        center, _, _ = opt.apply(None, center, 0, 0, Commit(layout, 1, 1, 0))
        total += delta
    assert np.abs(center[0] + state["residual"][0] - total).max() <= 60 * F32_EPS * np.abs(total).max()


def test_config_registration_and_modes():
    opt = get({"name": "compressed", "config": {"inner": "modelaveraging", "codec": "bf16"}})
    assert isinstance(opt, Compressed) and opt.modes == ("synchronous",) and opt.streams_rounds
    assert opt.window == 8 and opt.splits_batch and opt.get_config()["block"] is None
    assert get(serialize(opt)) == opt and pickle.loads(pickle.dumps(opt)) == opt
    assert hash(opt) == hash(get(serialize(opt)))
    assert get("compress", inner="downpour", window=3).inner == get("downpour", window=3)
    assert Compressed(get("dynsgd"), staleness_bound=2).staleness_bound == 2
    assert "bf16" in opt.describe(4) and opt.outer is opt.inner.outer
    assert Settings(mode="synchronous", optimizer=serialize(opt)).optimizer == opt
    with pytest.raises(ConfigError, match="supports mode"):
        Settings(mode="synchronous", optimizer={"name": "compressed", "config": {"inner": "downpour"}})


def test_for_fit_rewraps_the_inner_rules_choice():
    opt = Compressed("delayednesterov", "int8", block=64)
    fitted = opt.for_fit(None, 4, True, 32)  # windowed DelayedNesterov runs without outer momentum
    assert isinstance(fitted, Compressed) and fitted.inner.outer.momentum == 0.0
    assert fitted.codec == opt.codec and opt.inner.outer.momentum is None
    assert opt.for_fit(None, 4, True, None) is opt


@pytest.mark.parametrize("kwargs, match", [
    ({"inner": "nope"}, r"Could not interpret optimizer identifier: 'nope'"),
    ({"inner": 3}, r"`inner` must be an optimizer name, config dict or instance; received inner=3"),
    ({"inner": Compressed()}, r"`inner` must be an uncompressed rule; received inner=Compressed\("),
    ({"inner": "compressed"}, r"`inner` must be an uncompressed rule"),
    ({"codec": "fp8"}, r"`codec` must be one of \('bf16', 'int8'\); received codec='fp8'"),
    ({"block": -1}, r"`block` must be a positive int or None; received block=-1"),
    ({"window": 0}, r"`window` must be a positive int; received window=0"),
])
def test_argument_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Compressed(**kwargs)


# ------------------------------------------------------------------ the wire and the store
WEIGHTS = [np.zeros((256, 256), np.float32), np.zeros(256, np.float32), np.zeros((), np.float32)]


def _commit(opt):
    rng = np.random.default_rng(8)
    weights = [rng.normal(size=w.shape).astype(np.float32) for w in WEIGHTS]
    layout, _ = opt.make_commit(opt.worker_init(WEIGHTS), weights, WEIGHTS, 1)
    return Commit(layout, 1, 32, 0), weights


@pytest.mark.parametrize("codec, block", [("int8", 256), ("int8", None), ("bf16", None)])
def test_encoded_commit_crosses_the_wire_intact(codec, block):
    opt = Compressed("downpour", codec, block)
    commit, weights = _commit(opt)
    template = opt.commit_template(WEIGHTS)
    buf = wire.encode_commit(CommitKey("run", 0, 1, 2), 0, commit).tobytes()
    _, _, got = wire.decode_commit(buf, template)
    for a, b in zip(got.tensors, commit.tensors, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    decoded = decode_layout(opt.codec, got.tensors)
    assert [d.shape for d in decoded] == [w.shape for w in weights]
    with pytest.raises(ProtocolError, match="expected 3 tensors, received 6"):
        wire.decode_commit(buf, WEIGHTS)  # the weights' structure is not the payload's
    corrupt = bytearray(buf)
    corrupt[-100] ^= 0x01  # a bit in the codes (the smallest items are laid out last)
    with pytest.raises(ProtocolError, match="checksum mismatch"):
        wire.decode_commit(bytes(corrupt), template)


@pytest.mark.parametrize("codec, ratio", [("int8", 3.8), ("bf16", 1.95)])
def test_bytes_on_the_wire_shrink(codec, ratio):
    plain = len(wire.encode_commit(CommitKey("run", 0, 0, 0), 0, Commit(WEIGHTS, 1, 1, 0)))
    commit, _ = _commit(Compressed("downpour", codec))
    small = len(wire.encode_commit(CommitKey("run", 0, 0, 0), 0, commit))
    assert plain / small >= ratio


def test_layout_template_passes_integer_tensors_unchanged():
    template = layout_template(Codec("int8", 4), [np.zeros((2, 3), np.float32), np.zeros(2, np.int32)])
    assert [(t.shape, t.dtype) for t in template] == [((2, 3), np.int8), ((2,), np.int32),
                                                     ((2,), np.float32), ((0,), np.uint8)]


def test_norm_guard_sums_codes_without_overflow():
    assert _squared_norm(np.full(100, 127, np.int8)) == 100 * 127**2


@pytest.mark.parametrize("transport", ["store", "http"])
def test_compressed_synchronous_store_equals_replay(transport):
    opt = Compressed(get("modelaveraging", window=3), "int8", block=2)
    store, grads, _ = run_threads(opt, "synchronous", [5, 5, 3], transport)
    assert_same_center(store, replay_rounds(opt, store, grads, [5, 5, 3]))


@pytest.mark.parametrize("transport", ["store", "http"])
def test_compressed_asynchronous_store_equals_replay(transport):
    opt = Compressed(get("downpour", window=2), "bf16")
    store, grads, starts = run_threads(opt, "asynchronous", [6, 4, 5], transport)
    assert_same_center(store, replay_async(opt, store, grads, starts))


# ------------------------------------------------------------------ compressed replies
@pytest.mark.parametrize("codec", [Codec("int8", 16), Codec("int8", None), Codec("bf16")])
def test_a_view_follows_the_center_within_one_encoding_and_rebuilds_bit_for_bit(codec):
    rng = np.random.default_rng(11)
    center = [rng.normal(size=(8, 40)).astype(np.float32), np.arange(5, dtype=np.int32)]
    view = [a.copy() for a in center]
    naive = [a.copy() for a in center]  # each step encoded on its own, from the exact center: errors pile up
    worst_view = worst_naive = 0.0
    for _ in range(300):
        step = (rng.normal(size=(8, 40)) * 1e-2).astype(np.float32)
        new = [center[0] + step, center[1] + 1]
        layout, rebuilt = encode_change(codec, view, new)
        assert [r.tobytes() for r in apply_change(codec, view, layout)] == [r.tobytes() for r in rebuilt]
        assert rebuilt[1].dtype == np.int32 and np.array_equal(rebuilt[1], new[1])  # integers travel whole
        naive[0] = naive[0] + decode_layout(codec, encode_with_feedback(codec, [step], [np.zeros_like(step)])[0])[0]
        center, view = new, rebuilt
        worst_view = max(worst_view, float(np.abs(view[0] - center[0]).max()))
        worst_naive = max(worst_naive, float(np.abs(naive[0] - center[0]).max()))
    bound = 2.0**-8 * float(np.abs(center[0]).max()) if codec.name == "bf16" else 0.51 * 3e-2 * 4.5 / 127
    assert worst_view <= bound  # one encoding of one step (the step's absmax is under 4.5 sigma), not 300
    assert worst_naive > 3 * worst_view


def test_apply_change_refusals():
    codec = Codec("int8", 4)
    layout, _ = encode_change(codec, [np.zeros(8, np.float32)], [np.ones(8, np.float32)])
    with pytest.raises(ProtocolError, match="a change of 1 tensors cannot apply to weights of 2 tensors"):
        apply_change(codec, [np.zeros(8, np.float32)] * 2, layout)
    with pytest.raises(ProtocolError, match=r"tensor 0: a change of shape \(8,\) cannot apply to weights of shape \(4, 2\)"):
        apply_change(codec, [np.zeros((4, 2), np.float32)], layout)


@pytest.mark.parametrize("transport", ["store", "http"])
@pytest.mark.parametrize("codec, block", [("int8", 2), ("bf16", None)])
def test_compressed_replies_store_equals_replay(transport, codec, block):
    opt = Compressed(get("modelaveraging", window=3), codec, block=block, replies=True)
    store, grads, _ = run_threads(opt, "synchronous", [5, 5, 3], transport)
    assert_same_center(store, replay_rounds(opt, store, grads, [5, 5, 3]))
    dense = Compressed(get("modelaveraging", window=3), codec, block=block)
    other, _, _ = run_threads(dense, "synchronous", [5, 5, 3], transport)
    # the workers started their windows from the view, so the center moved otherwise
    assert any(not np.array_equal(a, b) for a, b in zip(store.center(), other.center()))


def _reply_server(opt):
    from elephant.ps.app import create_app
    from elephant.ps.server import PSServer
    from elephant.ps.store import Store

    store = Store(WEIGHTS, opt, "synchronous", 1, "run")
    return store, PSServer(create_app(store, "tok")).start()


@pytest.mark.parametrize("codec, ratio", [("int8", 3.8), ("bf16", 1.95)])
def test_compressed_replies_shrink_the_replies_and_rebuild_the_servers_view(codec, ratio):
    from elephant.ps.client import PSClient

    rng = np.random.default_rng(3)
    sizes = {}
    for replies in (False, True):
        opt = Compressed(get("modelaveraging", window=1), codec, replies=replies)
        store, server = _reply_server(opt)
        try:
            with PSClient(server.url, "tok") as client:
                reply = client.pull(0, epoch=0)
                state, pulled, base = opt.worker_init(reply.center), reply.center, reply.clock
                before = store.metrics()["bytes_out"]
                for step in range(3):
                    weights = [p + rng.normal(size=p.shape).astype(np.float32) * 0.1 for p in pulled]
                    layout, state = opt.make_commit(state, weights, pulled, 1)
                    reply = client.commit(CommitKey("run", 0, 0, step), 0, Commit(layout, 1, 32, base))
                    pulled, base = reply.center, reply.clock
                    held = store._view.arrays if replies else store.center()
                    assert [a.tobytes() for a in pulled] == [a.tobytes() for a in held]
                sizes[replies] = store.metrics()["bytes_out"] - before
                if replies:  # the exact center is the rule's, one encoding away from the workers' view
                    gap = max(float(np.abs(a - b).max()) for a, b in zip(store.center(), pulled))
                    assert gap < 0.02 and (gap > 0 or codec == "bf16")  # one worker's bf16 step is bf16 already
        finally:
            server.stop()
            store.close()
    assert sizes[False] / sizes[True] >= ratio


def test_a_change_reply_needs_the_view_it_was_made_from():
    from elephant.protocol import Reply, ReplyChange

    codec = Codec("int8")
    rng = np.random.default_rng(5)
    held = [rng.normal(size=w.shape).astype(np.float32) for w in WEIGHTS]
    center = [h + rng.normal(size=h.shape).astype(np.float32) * 0.01 for h in held]
    layout, view = encode_change(codec, held, center)
    base = digest(held)
    reply = Reply(clock=1, center=view, view=digest(view),
                  change=ReplyChange(base, 0, codec.name, codec.block, layout))
    buf = wire.encode_reply(reply, changed=True).tobytes()
    assert len(buf) < len(wire.encode_reply(reply).tobytes()) / 3.8
    got = wire.decode_reply(buf, WEIGHTS, held=(base, held))
    assert [a.tobytes() for a in got.center] == [a.tobytes() for a in view] and got.view == reply.view
    assert got.change is None and not got.center[0].flags.writeable
    with pytest.raises(ProtocolError, match=r"reply is a change from view [0-9a-f]{16}, but this client holds no view"):
        wire.decode_reply(buf, WEIGHTS)
    with pytest.raises(ProtocolError, match="but this client holds view 0000000000000000"):
        wire.decode_reply(buf, WEIGHTS, held=("0000000000000000", held))
    tampered = [a.copy() for a in held]
    tampered[2] = tampered[2] + np.float32(1e-3)  # a client whose view differs in one value, under the same name
    with pytest.raises(ProtocolError, match="the view rebuilt from a change reply has digest .* the server's"):
        wire.decode_reply(buf, WEIGHTS, held=(base, tampered))
    with pytest.raises(ProtocolError, match="expected 2 center tensors, received 3"):
        wire.decode_reply(buf, WEIGHTS[:2], held=(base, held))


def test_compressed_replies_need_synchronous_rounds():
    from elephant.ps.store import Store

    opt = Compressed("delayednesterov", "int8", replies=True)
    match = r"Compressed\(replies=True\) compresses the replies of synchronous rounds.*received mode='asynchronous'"
    with pytest.raises(ConfigError, match=match):
        Store(WEIGHTS, opt, "asynchronous", 2, "run")
    with pytest.raises(ConfigError, match=match):
        simulate(opt, WEIGHTS, _bf16_exact_grad, round_robin(2, 1, 2), mode="asynchronous")
    with pytest.raises(ConfigError, match=match):
        Settings(mode="asynchronous", optimizer=serialize(opt))
    with pytest.raises(ConfigError, match=r"`replies` must be True or False; received replies='yes'"):
        Compressed(replies="yes")
    sync = Compressed("modelaveraging", "bf16", replies=True)
    assert get(serialize(sync)) == sync and sync != Compressed("modelaveraging", "bf16")
    assert "replies as encoded changes" in sync.describe(2) and sync.reply_codec == sync.codec
    assert sync.for_fit(None, 8, True, 16).replies


def test_each_epoch_starts_from_the_exact_center_in_the_store_and_the_simulator():
    """The view is the center again at an epoch's first pull, in both: a multi-epoch simulated fit is the cluster's."""
    from elephant.ps.store import Store

    opt = Compressed(get("modelaveraging", window=1), "int8", block=4, replies=True)
    init = [np.zeros(8, np.float32)]
    grad = lambda ws: [np.linspace(-1, 1, 8, dtype=np.float32) * 0.37]  # noqa: E731
    one_epoch = [("pull", 0), ("pull", 1)] + [e for k in (0, 1) for e in (("step", k, 1), ("commit", k))] * 3
    one_epoch += [("finish", 0), ("finish", 1)]
    trace = simulate(opt, init, grad, one_epoch + [("pull", 0), ("pull", 1)], mode="synchronous", local_lr=0.3)
    assert not np.array_equal(trace.workers[0].pulled[0], trace.centers[-2][0])  # the last round's view, rounded
    np.testing.assert_array_equal(trace.workers[1].pulled[0], trace.center[0])  # the next epoch's pull: exact

    store = Store(init, opt, "synchronous", 2, "run")
    waits = []
    for k, scale in ((0, 1 / 3), (1, -1 / 7)):  # the mean of two decoded commits is no int8 step of its own
        store.pull(k, epoch=0)
        layout, _ = opt.make_commit(opt.worker_init(init), [np.linspace(0, 1, 8, dtype=np.float32) * scale], init, 1)
        waits.append(store.submit(CommitKey("run", 0, k, 0), 0, Commit(layout, 1, 1, 0)))
    reply = waits[0]()
    assert reply.change is not None and not np.array_equal(reply.center[0], store.center()[0])
    for k in (0, 1):
        store.finish("run", 0, k, 0)
    pulled = store.pull(0, epoch=1)
    np.testing.assert_array_equal(pulled.center[0], store.center()[0])
    assert pulled.view == digest(store.center())
