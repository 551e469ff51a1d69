"""benchmarks/ps_model.py: the analytic bounds and small deterministic simulations.

The script is loaded from its file by ``benchmark`` (``benchmarks`` is not a package); it imports numpy
only at load (matplotlib only when plotting).
"""

from __future__ import annotations

import math

import pytest

from tests.unit.helpers import benchmark

m = benchmark("ps_model")
MB = m.MB


def _cal(**kw):
    base = dict(server_fixed_ms=1.0, server_ms_per_mb=2.0, client_fixed_ms=0.0, client_ms_per_mb=0.0,
                loopback_mb_per_s=1000.0, link_efficiency=1.0,
                encode_ms_per_mb={"none": 0.0, "bf16": 0.0, "int8": 0.0},
                decode_ms_per_mb={"none": 0.0, "bf16": 0.0, "int8": 0.0})
    base.update(kw)
    return m.Calibration(**base)


def test_nic_bound_is_bytes_over_rate():
    # 512 commits of 40 MiB at 10 Gb/s: 512 * 41,943,040 B / 1.25e9 B/s per direction.
    assert m.nic_seconds_per_window(512, 40 * MB, 10.0) == pytest.approx(512 * 40 * MB / 1.25e9)
    assert m.nic_bound_both(512, 40 * MB, 10.0, 2.0) == pytest.approx(512 * 40 * MB / 1.25e9)
    assert m.efficiency_ceiling(2.0, 4.0) == 0.5
    assert m.efficiency_ceiling(2.0, 1.0) == 1.0


def test_int8_factor_counts_the_scales():
    assert m.CODECS["int8"] == pytest.approx(4.0 / (1.0 + 4.0 / 256.0))
    assert m.CODECS["bf16"] == 2.0


def test_bounds_pick_the_binding_resource():
    cal = _cal()
    cfg = m.Config(workers=512, model_bytes=40 * MB, gbit=10.0, shards=16, hosting="driver", codec="int8")
    b = m.bounds(cfg, cal)
    # Replies travel uncompressed: the driver NIC's outbound direction binds.
    assert b["binding"] == "nic_out"
    assert b["nic_out_s_per_window"] == pytest.approx(512 * 40 * MB / 1.25e9)
    assert b["efficiency_ceiling"] == pytest.approx(2.0 / b["nic_out_s_per_window"])
    ex = m.bounds(m.Config(512, 40 * MB, 10.0, 16, "executors", "none"), cal)
    assert ex["nic_in_s_per_window"] == pytest.approx(512 * 40 * MB / 16 / 1.25e9)
    assert ex["shard_cpu_s_per_window"] == pytest.approx(512 * (1.0 + 2.0 * 2.5) / 1000.0)


def test_one_worker_one_shard_latency_is_transfer_plus_cpu():
    cal = _cal()
    P = 10 * MB
    cfg = m.Config(workers=1, model_bytes=P, gbit=1.0, shards=1, window_s=1.0)
    out = m.simulate(cfg, cal, windows=3, warmup=1, jitter=0.0)
    rate = 1e9 / 8.0
    expect = 2 * P / rate + (1.0 + 2.0 * 10) / 1000.0  # in, CPU, out
    assert out["p50_ms"] == pytest.approx(expect * 1000.0)
    assert out["p99_ms"] == pytest.approx(expect * 1000.0)
    assert out["efficiency"] == pytest.approx(1.0 / (1.0 + expect))


def test_compressed_commit_and_replies():
    cal = _cal(server_fixed_ms=0.0, server_ms_per_mb=0.0)
    P = 8 * MB
    rate = 1e9 / 8.0
    base = dict(workers=1, model_bytes=P, gbit=1.0, window_s=1.0, codec="bf16")
    today = m.simulate(m.Config(**base), cal, windows=2, warmup=1, jitter=0.0)
    whatif = m.simulate(m.Config(**base, compressed_replies=True), cal, windows=2, warmup=1, jitter=0.0)
    assert today["p50_ms"] == pytest.approx((P / 2 + P) / rate * 1000.0)
    assert whatif["p50_ms"] == pytest.approx(P / rate * 1000.0)
    assert today["bytes_in_per_window"] == P / 2 and today["bytes_out_per_window"] == P


def test_synchronous_compressed_replies_are_encoded_once_per_round():
    enc = {"none": 0.0, "bf16": 0.0, "int8": 1.0}
    cal = _cal(server_fixed_ms=0.0, server_ms_per_mb=0.0, encode_ms_per_mb=enc, decode_ms_per_mb=enc)
    P, K = 8 * MB, 64
    per = {mode: m.bounds(m.Config(K, P, 100.0, 1, "executors", "int8", True, mode), cal)["shard_cpu_s_per_window"]
           for mode in ("sync", "async")}
    dense = {mode: m.bounds(m.Config(K, P, 100.0, 1, "executors", "int8", False, mode), cal)["shard_cpu_s_per_window"]
             for mode in ("sync", "async")}
    assert per["sync"] - dense["sync"] == pytest.approx(2 * 8 / 1000.0)  # one encode and one decode of 8 MB
    assert per["async"] - dense["async"] == pytest.approx(K * 8 / 1000.0)  # the what-if: an encode per reply
    assert "+replies(what-if)" in m.label(m.Config(K, P, 10.0, codec="int8", compressed_replies=True))
    assert m.label(m.Config(K, P, 10.0, codec="int8", compressed_replies=True, mode="sync")).endswith("int8+replies")


def test_many_workers_on_one_link_are_capped_at_its_rate():
    # CPU free, 64 workers with no compute: the driver NIC carries every commit in and out.
    cal = _cal(server_fixed_ms=0.0, server_ms_per_mb=0.0)
    P = 1 * MB
    cfg = m.Config(workers=64, model_bytes=P, gbit=1.0, shards=4, hosting="driver", window_s=1e-6)
    out = m.simulate(cfg, cal, windows=6, warmup=2, jitter=0.0)
    cap = 1e9 / 8.0 / P
    assert out["commits_per_s"] <= cap * 1.001
    assert out["commits_per_s"] >= cap * 0.9


def test_shards_on_executors_scale_the_link():
    cal = _cal(server_fixed_ms=0.0, server_ms_per_mb=0.0)
    P = 4 * MB
    kw = dict(workers=32, model_bytes=P, gbit=1.0, window_s=0.01)
    one = m.simulate(m.Config(**kw, shards=1), cal, jitter=0.0)
    four = m.simulate(m.Config(**kw, shards=4, hosting="executors"), cal, jitter=0.0)
    cap = 1e9 / 8.0 / P
    assert one["commits_per_s"] == pytest.approx(cap, rel=0.02)
    # Each executor's NIC carries a quarter of every commit: four times the commits.
    assert four["commits_per_s"] == pytest.approx(4 * cap, rel=0.05)
    assert four["efficiency"] > one["efficiency"]


@pytest.mark.parametrize("hosting, mode", [("driver", "async"), ("executors", "async"), ("executors", "sync"),
                                           ("driver", "sync")])
def test_reduced_simulation_matches_all_shards_when_cpu_binds(hosting, mode):
    # Links 100x faster than the CPU needs: the representative shard is exact.
    cal = _cal()
    cfg = m.Config(workers=16, model_bytes=8 * MB, gbit=100.0, shards=4, hosting=hosting, mode=mode,
                   window_s=0.05, driver_cores=2)
    full = m.simulate(cfg, cal, windows=6, warmup=2, jitter=0.0, reduce=False)
    red = m.simulate(cfg, cal, windows=6, warmup=2, jitter=0.0, reduce=True)
    assert red["efficiency"] == pytest.approx(full["efficiency"], rel=0.05)
    assert red["p50_ms"] == pytest.approx(full["p50_ms"], rel=0.05)


def test_reduced_async_is_the_parallel_fan_out_reading():
    # Link-bound: message-FIFO (reduce=False) sends the S slices one after the other, so the
    # first shard answers while the others still receive; the reduced run sends them in
    # parallel and fair-shared, all through together at P/B. So it is the more pessimistic.
    cal = _cal()
    cfg = m.Config(workers=16, model_bytes=8 * MB, gbit=1.0, shards=4, hosting="executors", window_s=0.3)
    full = m.simulate(cfg, cal, windows=6, warmup=2, jitter=0.0, reduce=False)
    red = m.simulate(cfg, cal, windows=6, warmup=2, jitter=0.0, reduce=True)
    assert red["efficiency"] <= full["efficiency"]
    assert red["efficiency"] == pytest.approx(full["efficiency"], rel=0.15)


def test_sync_round_waits_for_every_commit():
    cal = _cal(server_fixed_ms=0.0, server_ms_per_mb=0.0)
    # Two workers, one link of 1 Gb/s, no jitter: both commits go in one after the other, and
    # the replies leave only when the second is in.
    P = 1 * MB
    rate = 1e9 / 8.0
    cfg = m.Config(workers=2, model_bytes=P, gbit=1.0, mode="sync", window_s=1.0)
    t = P / rate
    # First round: worker 0's commit is in at t, worker 1's at 2t (the NIC in turn); the
    # round closes at 2t; the replies leave in arrival order: worker 0's at 3t, worker 1's at 4t.
    first = m.simulate(cfg, cal, windows=1, warmup=0, jitter=0.0)
    assert sorted([first["p50_ms"], first["p99_ms"]]) == pytest.approx([3.5 * t * 1000.0, 3.99 * t * 1000.0],
                                                                       rel=0.01)
    # Later rounds: worker 1 starts t later, so both wait 3t.
    later = m.simulate(cfg, cal, windows=3, warmup=1, jitter=0.0)
    assert later["p50_ms"] == pytest.approx(3 * t * 1000.0)
    assert later["p99_ms"] == pytest.approx(3 * t * 1000.0)


def test_fit_line_recovers_a_line():
    a, b = m.fit_line([0.03, 1.0, 4.0, 40.0], [0.5 + 1.2 * x for x in (0.03, 1.0, 4.0, 40.0)])
    assert a == pytest.approx(0.5) and b == pytest.approx(1.2)
    assert math.isfinite(a)


def test_sync_on_the_driver_reduced_is_the_fair_share_reading():
    # All S shards send their K replies through one NIC when a round closes. Message-FIFO
    # across shards (reduce=False) sends shard 0's K slices first, so every worker waits for
    # nearly the whole burst; the reduced run is what fair sharing of the NIC between the S
    # shards gives (worker k's slices all through at about (k+1)·P/B): never worse.
    cal = _cal()
    cfg = m.Config(workers=16, model_bytes=8 * MB, gbit=1.0, shards=4, hosting="driver", mode="sync",
                   window_s=0.3, driver_cores=2)
    full = m.simulate(cfg, cal, windows=6, warmup=2, jitter=0.0, reduce=False)
    red = m.simulate(cfg, cal, windows=6, warmup=2, jitter=0.0, reduce=True)
    assert red["efficiency"] >= full["efficiency"]
