"""benchmarks/ps_scale.py's open-loop decisions: arrivals decided in advance, latency from the schedule.

The script is loaded from its file by ``benchmark`` (``benchmarks`` is not a package); it imports numpy only at
load, and its siblings ``ps_roundtrip`` and ``shaped_link``, whose path entry is removed again after the load.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.unit.helpers import benchmark

S = benchmark("ps_scale")


@pytest.mark.parametrize("num_workers, rate, duration", [(1, 50.0, 2.0), (8, 733.3, 1.0), (512, 400.0, 3.0)])
def test_arrivals_are_evenly_spaced_over_all_workers(num_workers, rate, duration):
    per_worker = [S.schedule(k, num_workers, rate, duration) for k in range(num_workers)]
    union = np.sort(np.concatenate(per_worker))
    assert len(union) == math.ceil(rate * duration)  # every send time in [0, duration), none twice
    assert union[0] == 0 and union[-1] < duration
    np.testing.assert_allclose(np.diff(union), 1 / rate, rtol=1e-9)
    for k, times in enumerate(per_worker):  # each worker: first at k/r, then every K/r
        assert times[0] == pytest.approx(k / rate)
        np.testing.assert_allclose(np.diff(times), num_workers / rate, rtol=1e-9)


def test_a_worker_whose_first_send_is_past_the_window_sends_nothing():
    assert len(S.schedule(7, 8, 4.0, 1.0)) == 0  # first at 7/4 s


@pytest.mark.parametrize("worker, num_workers, rate, duration, match", [
    (8, 8, 10.0, 1.0, r"`worker` must be in \[0, 8\); received worker=8"),
    (0, 8, 0.0, 1.0, "`rate` and `duration` must be > 0; received rate=0.0"),
])
def test_schedule_refuses_what_it_cannot_schedule(worker, num_workers, rate, duration, match):
    with pytest.raises(ValueError, match=match):
        S.schedule(worker, num_workers, rate, duration)


class FakeClock:
    """A clock that only moves when the loop sleeps or a send takes time."""

    def __init__(self, send_seconds: float):
        self.now, self.send_seconds, self.slept = 0.0, send_seconds, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def send(self) -> None:
        self.now += self.send_seconds


def test_latency_is_measured_from_the_scheduled_time_so_a_backlog_shows():
    clock = FakeClock(send_seconds=1.5)  # a server slower than the schedule (one send per second)
    out = S.open_loop([0.0, 1.0, 2.0, 3.0], clock.send, clock, clock.sleep, deadline=100.0)
    assert out.latencies == pytest.approx([1.5, 2.0, 2.5, 3.0])  # from the send: 1.5 s each
    assert clock.slept == [] and out.unsent_waits == [] and out.errors == 0


def test_sends_not_started_by_the_deadline_count_with_their_wait_so_far():
    clock = FakeClock(send_seconds=1.5)
    out = S.open_loop([0.0, 1.0, 2.0, 3.0], clock.send, clock, clock.sleep, deadline=4.0)
    assert out.latencies == pytest.approx([1.5, 2.0, 2.5])  # the third ends at 4.5
    assert out.unsent_waits == pytest.approx([1.0])
    assert S.percentiles(out.latencies + out.unsent_waits)["p50_ms"] == pytest.approx(1750.0)


def test_an_early_worker_sleeps_until_its_scheduled_time():
    clock = FakeClock(send_seconds=0.25)
    out = S.open_loop([0.0, 1.0, 2.0], clock.send, clock, clock.sleep, deadline=10.0)
    assert clock.slept == pytest.approx([0.75, 0.75])
    assert out.latencies == pytest.approx([0.25, 0.25, 0.25])


def test_errors_are_counted_not_timed():
    clock = FakeClock(send_seconds=0.0)
    calls = iter([None, RuntimeError("HTTP 503"), None])

    def send():
        if (outcome := next(calls)) is not None:
            raise outcome

    out = S.open_loop([0.0, 1.0, 2.0], send, clock, clock.sleep, deadline=10.0)
    assert (out.errors, out.messages, len(out.latencies)) == (1, ["HTTP 503"], 2)


@pytest.mark.parametrize("num_workers, processes", [(8, 4), (3, 4), (512, 4), (1, 1)])
def test_workers_are_dealt_over_the_processes(num_workers, processes):
    groups = S.split_workers(num_workers, processes)
    assert len(groups) == min(num_workers, processes)
    assert sorted(w for g in groups for w in g) == list(range(num_workers))
    closed = S.closed_loop_workers(num_workers)
    assert {w % len(groups) for w in range(min(closed, len(groups)))} == set(range(min(closed, len(groups))))


def test_offered_rates_are_fractions_of_the_measured_capacity():
    assert S.offered_rates(800.0, [0.5, 1.1]) == pytest.approx([400.0, 880.0])
    with pytest.raises(ValueError, match="`capacity` must be > 0 commits/s; received capacity=0"):
        S.offered_rates(0, [0.5])


@pytest.mark.parametrize("text, bits", [("100mbit", 10**8), ("1gbit", 10**9), ("500kbit", 5 * 10**5),
                                        ("2e8", 2 * 10**8)])
def test_parse_rate(text, bits):
    assert S.shaped_link.parse_rate(text) == bits


def test_parse_rate_says_what_it_expected():
    with pytest.raises(ValueError, match="a rate must look like '100mbit'.*received '100mbps'"):
        S.shaped_link.parse_rate("100mbps")


@pytest.mark.parametrize("codec, dtype", [("int8", np.int8), ("bf16", np.uint16)])
def test_a_compressed_commit_is_the_codecs_encoding_and_a_store_decodes_it(codec, dtype):
    """--codec: the workers send what a fit's worker would, and the wrapped rule decodes it to the delta."""
    from elephant.optimizers import Commit, get
    from elephant.ps.store import CommitKey, Store

    rule = S.rule_spec("delayednesterov", codec)
    assert S.rule_spec("delayednesterov", "none") == "delayednesterov"
    nbytes = 64 << 10
    payload, delta = S.payload_for(nbytes, rule), S.delta_for(nbytes)
    assert payload[0].dtype == dtype and sum(p.nbytes for p in payload) < 0.6 * nbytes
    assert S.payload_for(nbytes, "delayednesterov")[0].dtype == np.float32
    plain, packed = (Store(S.model(nbytes), get(r), "asynchronous", 1, "r") for r in ("downpour", {
        "name": "compressed", "config": {"inner": "downpour", "codec": codec}}))
    plain.commit(CommitKey("r", 0, 0, 0), 1, Commit(delta, 1, 1, 0))
    packed.commit(CommitKey("r", 0, 0, 0), 1, Commit(S.payload_for(nbytes, {
        "name": "compressed", "config": {"inner": "downpour", "codec": codec}}), 1, 1, 0))
    for a, b in zip(plain.center(), packed.center(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-8)  # the delta is ~1e-6: the codec's error is far below
