"""elephant.ps.store: apply order, clocks, idempotency, fencing, rounds, SSP."""

from __future__ import annotations

import pickle
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from elephant.errors import (
    ConfigError,
    NormGuardError,
    PSError,
    ProtocolError,
    RolledBackError,
    RoundTimeoutError,
    StaleAttemptError,
    StoreClosedError,
)
from elephant.optimizers import Commit, Downpour, ModelAveraging
from elephant.optimizers.base import DistributedOptimizer
from elephant.ps.guard import NORM_WARMUP
from elephant.ps.store import CommitKey, Store, ssp_admitted

RUN = "run-a"


def delta(value, n=3, dtype=np.float64, samples=1, base_clock=0):
    return Commit(tensors=[np.full(n, value, dtype=dtype)], num_steps=1, num_samples=samples, base_clock=base_clock)


def key(partition, step, epoch=0, run=RUN):
    return CommitKey(run, epoch, partition, step)


def async_store(num_workers=2, n=3, optimizer=None, mode="asynchronous", **kwargs):
    return Store([np.zeros(n)], optimizer or Downpour(), mode, num_workers, RUN, **kwargs)


def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)


# ------------------------------------------------------------ construction
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "eventual"}, "`mode` must be one of .*; received mode='eventual'"),
        ({"mode": "synchronous"}, r"Downpour supports modes \('asynchronous', 'hogwild'\); received mode='synchronous'"),
        ({"num_workers": 0}, "`num_workers` must be a positive int; received num_workers=0"),
        ({"run": ""}, "`run` must be a non-empty str; received run=''"),
        ({"round_timeout": 0}, "`round_timeout` must be > 0 seconds; received round_timeout=0"),
    ],
)
def test_invalid_settings_are_refused(kwargs, match):
    args = {"center": [np.zeros(2)], "optimizer": Downpour(), "mode": "asynchronous", "num_workers": 2, "run": RUN}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        Store(**args)


def test_center_is_copied_in_and_out():
    initial = [np.zeros(3)]
    store = Store(initial, Downpour(), "asynchronous", 1, RUN)
    initial[0][:] = 5.0
    copy = store.center()
    copy[0][:] = 7.0
    np.testing.assert_array_equal(store.center()[0], np.zeros(3))


def test_pulled_arrays_are_read_only_snapshots():
    store = async_store()
    reply = store.pull(0)
    with pytest.raises(ValueError, match="read-only"):
        reply.center[0][0] = 1.0
    store.commit(key(0, 0), 1, delta(1.0))
    np.testing.assert_array_equal(reply.center[0], np.zeros(3))  # the old snapshot is not mutated


# ------------------------------------------------------------- asynchronous
def test_commits_apply_in_order_with_clock_ledger_and_staleness():
    store = async_store()
    r1 = store.commit(key(0, 0), 10, delta(1.0, base_clock=0))
    r2 = store.commit(key(1, 0), 11, delta(2.0, base_clock=0))
    r3 = store.commit(key(0, 1), 10, delta(4.0, base_clock=1))
    assert (r1.clock, r2.clock, r3.clock) == (1, 2, 3)
    np.testing.assert_array_equal(r2.center[0], np.full(3, 3.0))
    np.testing.assert_array_equal(store.center()[0], np.full(3, 7.0))
    assert store.clock == 3
    assert store.ledger() == [(key(0, 0), 10), (key(1, 0), 11), (key(0, 1), 10)]
    metrics = store.metrics()
    assert metrics["commits_applied"] == 3
    assert metrics["staleness"] == {0: 1, 1: 2}  # tau = clock before apply - base_clock
    assert metrics["staleness_max"] == 1
    assert metrics["staleness_mean"] == pytest.approx(2 / 3)


def test_replay_is_acknowledged_with_the_current_center_and_not_applied():
    store = async_store()
    store.commit(key(0, 0), 1, delta(1.0))
    store.commit(key(1, 0), 2, delta(10.0))
    replay = store.commit(key(0, 0), 1, delta(1.0))
    assert replay.clock == 2 and replay.tensors is None
    np.testing.assert_array_equal(replay.center[0], np.full(3, 11.0))
    retried = store.commit(key(0, 0), 5, delta(100.0))  # a newer attempt replays an applied step
    np.testing.assert_array_equal(retried.center[0], np.full(3, 11.0))
    assert store.metrics()["replays_dropped"] == 2
    assert [k for k, _ in store.ledger()] == [key(0, 0), key(1, 0)]


def test_superseded_attempt_is_fenced_per_epoch_and_partition():
    store = async_store()
    store.commit(key(0, 0), 7, delta(1.0))
    with pytest.raises(StaleAttemptError, match=r"commit \(run run-a, epoch 0, partition 0, step 1, attempt 3\) "
                                                "was superseded by task attempt 7 of the same partition"):
        store.commit(key(0, 1), 3, delta(1.0))
    with pytest.raises(StaleAttemptError, match="superseded by task attempt 7"):
        store.finish(RUN, 0, 0, 6)
    store.commit(key(1, 0), 3, delta(1.0))  # other partition: own fence
    store.commit(key(0, 0, epoch=1), 3, delta(1.0))  # other epoch: own fence
    assert store.metrics()["stale_attempts_fenced"] == 2
    np.testing.assert_array_equal(store.center()[0], np.full(3, 3.0))


def _fenced():
    store = async_store()
    store.commit(key(0, 0), 7, delta(1.0))
    store.commit(key(0, 1), 3, delta(1.0))


def _timed_out():
    sync_store(num_workers=2, round_timeout=0.05).commit(key(0, 0), 1, delta(1.0, n=2))


def _closed():
    store = async_store()
    store.close()
    store.pull(0)


def _rolled_back():
    store = async_store()
    store.rollback(store.snapshot(), "run-a.t1")
    store.commit(key(0, 0), 1, delta(1.0))


@pytest.mark.parametrize("scenario, error", [(_fenced, StaleAttemptError), (_timed_out, RoundTimeoutError),
                                             (_closed, StoreClosedError), (_rolled_back, RolledBackError)])
def test_the_stores_refusals_are_parameter_server_errors_that_survive_a_trip_to_the_driver(scenario, error):
    with pytest.raises(PSError) as caught:  # what a caller handling any parameter-server failure catches
        scenario()
    assert type(caught.value) is error
    shipped = pickle.loads(pickle.dumps(caught.value))  # as Spark sends a task's exception to the driver
    assert type(shipped) is error and str(shipped) == str(caught.value) != ""


@pytest.mark.parametrize(
    "commit_key, commit, match",
    [
        (key(0, 0, run="run-b"), delta(1.0), "names run 'run-b' but this parameter server serves run 'run-a'"),
        (key(5, 0), delta(1.0), "partition 5 is out of range for num_workers=2"),
        (key(0, -1), delta(1.0), "`step` must be an int >= 0; received step=-1"),
        (key(0, 0), delta(1.0, n=4), r"tensor 0: expected float64\[3\], received float64\[4\]"),
        (key(0, 0), delta(1.0, dtype=np.float32), r"tensor 0: expected float64\[3\], received float32\[3\]"),
        (key(0, 0), Commit([np.ones(3), np.ones(3)], 1, 1, 0), "expected 1 tensors, received 2"),
        (key(0, 0), delta(np.nan), "tensor 0 holds non-finite values"),
        (key(0, 0), delta(1.0, base_clock=4), "base_clock 4 is ahead of the server clock 0"),
        (key(0, 0), Commit([np.ones(3)], -1, 1, 0), "`num_steps` must be an int >= 0; received num_steps=-1"),
    ],
)
def test_bad_commits_are_rejected_and_leave_the_center_unchanged(commit_key, commit, match):
    store = async_store()
    with pytest.raises(ProtocolError, match=match):
        store.commit(commit_key, 1, commit)
    np.testing.assert_array_equal(store.center()[0], np.zeros(3))
    assert store.clock == 0 and store.ledger() == []


@pytest.mark.timeout(60)
def test_eight_threads_of_500_downpour_commits_sum_exactly():
    store = async_store(num_workers=8, n=4)
    rng = np.random.default_rng(0)
    values = rng.integers(-1000, 1000, size=(8, 500, 4)).astype(np.float64)

    def worker(p):
        for step in range(500):
            base = store.clock
            store.commit(key(p, step), 100 + p, Commit([values[p, step]], 1, 1, base))
            if step % 50 == 0:  # an occasional retry of the same key must not double-apply
                store.commit(key(p, step), 100 + p, Commit([values[p, step]], 1, 1, 0))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(worker, range(8)))
    np.testing.assert_array_equal(store.center()[0], values.sum(axis=(0, 1)))
    assert store.clock == 4000
    assert len(store.ledger()) == len(set(store.ledger())) == 4000
    metrics = store.metrics()
    assert metrics["commits_applied"] == 4000 and metrics["replays_dropped"] == 80
    assert sum(metrics["staleness"].values()) == 4000 and min(metrics["staleness"]) >= 0


class _Failing(DistributedOptimizer):
    name = "failing-test-rule"
    modes = ("asynchronous", "hogwild", "synchronous")

    def __init__(self, result="raise"):
        super().__init__()
        self.result = result

    def apply(self, state, center, clock, worker, commit):
        if self.result == "raise":
            raise ArithmeticError("boom")
        return [c.astype(np.float32) for c in center], None, state

    apply_round = None  # set per test


@pytest.mark.parametrize("mode", ["asynchronous", "hogwild"])
def test_a_failing_rule_is_a_ps_error_and_the_commit_can_be_retried(mode):
    rule = _Failing("raise")
    store = Store([np.zeros(3)], rule, mode, 1, RUN)
    with pytest.raises(PSError, match=r"the server rule of _Failing failed: ArithmeticError\('boom'\)"):
        store.commit(key(0, 0), 1, delta(1.0))
    rule.result = "wrong-dtype"
    with pytest.raises(PSError, match=r"server rule returned float32\[3\] for tensor 0, expected float64\[3\]"):
        store.commit(key(0, 0), 1, delta(1.0))
    assert store.clock == 0 and store.ledger() == []
    np.testing.assert_array_equal(store.center()[0], np.zeros(3))


class _RecordingPulls(Downpour):
    def server_init(self, center, num_workers):
        return []

    def on_pull(self, state, center, clock, worker):
        return state + [(worker, clock)]

    def apply(self, state, center, clock, worker, commit):
        new_center, _, state = super().apply(state, center, clock, worker, commit)
        return new_center, [np.array(float(len(state)))], state


def test_pull_calls_on_pull_and_counts():
    store = async_store(optimizer=_RecordingPulls())
    store.pull(1)
    store.commit(key(0, 0), 1, delta(1.0))
    reply = store.pull(0)
    assert reply.clock == 1
    assert store.metrics()["pulls"] == 2
    assert store.commit(key(0, 1), 1, delta(1.0, base_clock=1)).tensors[0] == 2.0  # state saw both pulls
    with pytest.raises(ProtocolError, match="partition 2 is out of range for num_workers=2"):
        store.pull(2)


# ------------------------------------------------------------------ hogwild
def test_hogwild_with_one_worker_equals_asynchronous_bit_for_bit():
    rng = np.random.default_rng(1)
    commits = [Commit([rng.standard_normal(5)], 1, 1, i) for i in range(50)]
    results = []
    for mode in ("asynchronous", "hogwild"):
        store = Store([np.zeros(5)], Downpour(), mode, 1, RUN)
        for i, c in enumerate(commits):
            store.commit(key(0, i), 1, c)
        results.append(store.center()[0])
    assert results[0].tobytes() == results[1].tobytes()


def test_hogwild_under_threads_counts_every_commit_once():
    store = async_store(num_workers=4, mode="hogwild")

    def worker(p):
        for step in range(200):
            store.commit(key(p, step), 1, delta(1.0, base_clock=0))
            store.commit(key(p, step), 1, delta(1.0))  # replay

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(worker, range(4)))
    metrics = store.metrics()
    assert metrics["commits_applied"] == store.clock == 800 and metrics["replays_dropped"] == 800
    center = store.center()[0]
    assert np.isfinite(center).all() and (center <= 800).all()  # updates may be lost, never invented


# -------------------------------------------------------------- synchronous
def sync_store(num_workers=3, **kwargs):
    return Store([np.zeros(2)], ModelAveraging(outer_momentum=0.0), "synchronous", num_workers, RUN, **kwargs)


def test_sync_rounds_with_an_early_finisher_and_a_worker_that_trained_nothing():
    store = sync_store()
    schedule = {  # partition -> [(delta, samples), ...]; partition 1 trained nothing
        0: [(1.0, 10), (2.0, 10)],
        1: [(100.0, 0), (50.0, 0)],
        2: [(4.0, 30)],  # finishes after one round
    }
    replies = {}

    def worker(p):
        base = 0
        for step, (value, samples) in enumerate(schedule[p]):
            reply = store.commit(key(p, step), 20 + p, delta(value, n=2, samples=samples, base_clock=base))
            replies[p, step] = reply
            base = reply.clock
        store.finish(RUN, 0, p, 20 + p)

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(worker, range(3)))
    # round 0: (10 * 1 + 30 * 4) / 40 = 3.25; round 1 without partition 2: 2.0
    for p in range(3):
        assert replies[p, 0].clock == 1
        np.testing.assert_array_equal(replies[p, 0].center[0], [3.25, 3.25])
    np.testing.assert_array_equal(replies[0, 1].center[0], [5.25, 5.25])
    np.testing.assert_array_equal(store.center()[0], [5.25, 5.25])
    metrics = store.metrics()
    assert store.clock == metrics["rounds_applied"] == 2 and metrics["commits_applied"] == 5
    assert [(k.partition, k.step) for k, _ in store.ledger()] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1)]


def test_sync_replay_of_an_applied_round_returns_at_once():
    store = sync_store(num_workers=1)
    store.commit(key(0, 0), 1, delta(2.0, n=2))
    replay = store.commit(key(0, 0), 1, delta(2.0, n=2))
    assert replay.clock == 1 and store.metrics()["replays_dropped"] == 1
    np.testing.assert_array_equal(store.center()[0], [2.0, 2.0])


class _HeldAveraging(ModelAveraging):
    """Model averaging as a rule that keeps every commit until its round closes."""

    streams_rounds = False


def test_a_newer_attempt_replaces_the_pending_commit_of_its_partition():
    store = Store([np.zeros(2)], _HeldAveraging(outer_momentum=0.0), "synchronous", 2, RUN)
    with ThreadPoolExecutor(2) as pool:
        old = pool.submit(store.commit, key(0, 0), 1, delta(100.0, n=2))
        wait_until(lambda: store.metrics()["waiting"] == 1)
        new = pool.submit(store.commit, key(0, 0), 2, delta(1.0, n=2))
        wait_until(lambda: store.metrics()["waiting"] == 2)
        store.commit(key(1, 0), 5, delta(3.0, n=2))
        np.testing.assert_array_equal(new.result(timeout=5).center[0], [2.0, 2.0])
        with pytest.raises(StaleAttemptError, match="superseded by task attempt 2 in its round"):
            old.result(timeout=5)
    assert store.ledger() == [(key(0, 0), 2), (key(1, 0), 5)]


def test_a_newer_attempt_fails_a_streamed_round_and_nothing_is_applied():
    """A sum cannot drop one commit: the round fails and the epoch is rolled back. A barrier
    stage never retries one task, so this is a safeguard, not a path a fit takes."""
    store = sync_store(num_workers=2)
    with ThreadPoolExecutor(1) as pool:
        old = pool.submit(store.commit, key(0, 0), 1, delta(100.0, n=2))
        wait_until(lambda: store.metrics()["waiting"] == 1)
        with pytest.raises(PSError, match="task attempt 2 of partition 0 replaced attempt 1, whose commit is in the sum"):
            store.commit(key(0, 0), 2, delta(1.0, n=2))
        with pytest.raises(PSError, match="replaced attempt 1"):
            old.result(timeout=5)
    assert store.clock == 0 and store.ledger() == []


def test_a_retransmitted_commit_is_summed_once_in_a_streamed_round():
    store = sync_store(num_workers=2)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(store.commit, key(0, 0), 1, delta(4.0, n=2))
        wait_until(lambda: store.metrics()["waiting"] == 1)
        again = pool.submit(store.commit, key(0, 0), 1, delta(4.0, n=2))  # the client's retry
        wait_until(lambda: store.metrics()["waiting"] == 2)
        store.commit(key(1, 0), 1, delta(2.0, n=2))
        for reply in (first.result(timeout=5), again.result(timeout=5)):
            np.testing.assert_array_equal(reply.center[0], [3.0, 3.0])  # (4 + 2) / 2, not (4 + 4 + 2) / 3
    assert store.ledger() == [(key(0, 0), 1), (key(1, 0), 1)]


def test_a_streamed_round_keeps_no_commit_tensors():
    """T25: what a pending round holds does not grow with the partitions' commits."""
    import gc
    import weakref

    store = Store([np.zeros(1000)], ModelAveraging(outer_momentum=0.0), "synchronous", 3, RUN)
    tensors = [np.full(1000, 1.0)]
    alive = weakref.ref(tensors[0])
    wait = store.submit(key(0, 0), 1, Commit(tensors, 1, 2, 0))
    del tensors
    gc.collect()
    assert alive() is None  # summed; the round holds one float64 sum, not the commit
    store.finish(RUN, 0, 1, 1)
    store.finish(RUN, 0, 2, 1)
    np.testing.assert_array_equal(wait().center[0], np.ones(1000))


def test_round_timeout_names_the_missing_partitions_and_withdraws_the_commit():
    store = sync_store(num_workers=3, round_timeout=0.2)
    with pytest.raises(RoundTimeoutError, match=r"step 4\); committed: \[\], missing: \[1, 2\]"):
        store.commit(key(0, 4), 1, delta(1.0, n=2))
    for p in (1, 2):  # the withdrawn commit is not applied when the others arrive
        store.finish(RUN, 0, p, 1)
    assert store.clock == 0 and store.ledger() == []


def test_a_failing_round_rule_fails_every_waiter():
    rule = _Failing()

    def explode(state, center, clock, commits):
        raise ValueError("bad round")

    rule.apply_round = explode
    store = Store([np.zeros(2)], rule, "synchronous", 2, RUN)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(store.commit, key(0, 0), 1, delta(1.0, n=2))
        wait_until(lambda: store.metrics()["waiting"] == 1)
        with pytest.raises(PSError, match=r"round \(epoch 0, step 0\) failed: .*ValueError.*bad round"):
            store.commit(key(1, 0), 1, delta(1.0, n=2))
        with pytest.raises(PSError, match="bad round"):
            first.result(timeout=5)
    assert store.clock == 0


def test_close_wakes_a_waiting_round_and_refuses_new_requests():
    store = sync_store(num_workers=2)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(store.commit, key(0, 0), 1, delta(1.0, n=2))
        wait_until(lambda: store.metrics()["waiting"] == 1)
        store.close()
        with pytest.raises(StoreClosedError, match="shutting down"):
            waiting.result(timeout=5)
    with pytest.raises(StoreClosedError, match="shutting down"):
        store.commit(key(1, 0), 1, delta(1.0, n=2))
    with pytest.raises(StoreClosedError, match="shutting down"):
        store.pull(0)
    np.testing.assert_array_equal(store.center()[0], [0.0, 0.0])  # still readable


# ---------------------------------------------------------------------- SSP
@pytest.mark.parametrize(
    "commits, finished, partition, bound, admitted",
    [
        ((2, 0), set(), 0, 1, False),  # T10.1: clocks (2, 0), s = 1 -> worker 1 blocked
        ((2, 1), set(), 0, 1, True),  # T10.1: after worker 2 commits
        ((1, 0), set(), 0, 0, False),  # s = 0: lock-step
        ((1, 0), set(), 1, 0, True),
        ((1, 1), set(), 0, 0, True),
        ((3, 1), {1}, 0, 1, True),  # T10.2: worker 2 finished at 1, worker 1 at 3
        ((3, 1), set(), 0, 1, False),
        ((9, 0), set(), 0, None, True),  # unbounded
        ((0, 5), {0}, 0, 1, True),  # a finished worker is always admitted
    ],
)
def test_ssp_admission_table(commits, finished, partition, bound, admitted):
    assert ssp_admitted(commits, finished, partition, bound) is admitted


def test_ssp_blocks_the_fast_worker_until_the_slow_one_commits():
    store = async_store(optimizer=Downpour(staleness_bound=1))
    store.commit(key(0, 0), 1, delta(1.0))  # clocks (1, 0): admitted
    with ThreadPoolExecutor(1) as pool:
        fast = pool.submit(store.commit, key(0, 1), 1, delta(1.0, base_clock=1))  # (2, 0): must wait
        wait_until(lambda: store.metrics()["waiting"] == 1)
        assert not fast.done()
        store.commit(key(1, 0), 2, delta(10.0))  # (2, 1): admitted again
        reply = fast.result(timeout=5)
    assert reply.clock == 3
    np.testing.assert_array_equal(reply.center[0], np.full(3, 12.0))  # the reply includes the slow update


def test_ssp_pull_waits_and_a_finished_worker_releases_it():
    store = async_store(optimizer=Downpour(staleness_bound=0), round_timeout=5)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(store.commit, key(0, 0), 1, delta(1.0))  # (1, 0) with s = 0: waits
        wait_until(lambda: store.metrics()["waiting"] == 1)
        pulled = pool.submit(store.pull, 0, 0)
        wait_until(lambda: store.metrics()["waiting"] == 2)
        store.finish(RUN, 0, 1, 1)  # T10.2: the slow worker leaves the minimum
        assert first.result(timeout=5).clock == 1
        assert pulled.result(timeout=5).clock == 1


def test_ssp_admission_timeout_is_a_round_timeout():
    store = async_store(optimizer=Downpour(staleness_bound=0), round_timeout=0.2)
    with pytest.raises(RoundTimeoutError, match="waited 0.2 s for admission under staleness_bound=0: partition 0 "
                                                "has 1 commits in epoch 0, the slowest active partition 1 has 0"):
        store.commit(key(0, 0), 1, delta(1.0))
    assert store.clock == 1  # the commit itself was applied; a retry is acknowledged as a replay


def test_waiting_counter_drops_back_to_zero_after_a_timeout():
    store = async_store(optimizer=Downpour(staleness_bound=0), round_timeout=0.05)
    with pytest.raises(RoundTimeoutError):
        store.commit(key(0, 0), 1, delta(1.0))
    with pytest.raises(RoundTimeoutError, match=r"pull \(worker 0\) waited"):
        store.pull(0, epoch=0)
    assert store.metrics()["waiting"] == 0
    assert store.pull(1, epoch=0).clock == 1  # the slow worker is admitted at once


class _PullLog(Downpour):
    """Downpour that records every on_pull call it gets from the store."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.log = []

    def on_pull(self, state, center, clock, worker):
        self.log.append((worker, clock, float(center[0][0])))
        return state


def test_a_reply_refreshed_by_ssp_or_a_replay_counts_as_a_pull_for_the_rule():
    opt = _PullLog(staleness_bound=0)
    store = async_store(optimizer=opt)
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(store.commit, key(0, 0), 1, delta(1.0))  # (1, 0) with s = 0: held back
        wait_until(lambda: store.metrics()["waiting"] == 1)
        store.commit(key(1, 0), 1, delta(10.0))  # (1, 1): worker 1's own result goes out as is
        assert held.result(timeout=5).clock == 2
    assert opt.log == [(0, 2, 11.0)]  # worker 0 was handed the center after both commits
    store.commit(key(1, 0), 1, delta(10.0))  # a replay answers with the current center
    assert opt.log[-1] == (1, 2, 11.0)


# ----------------------------------------------------------------- rollback
class _InPlaceCounter(Downpour):
    """A rule that updates its state in place, as a careless custom rule might."""

    def server_init(self, center, num_workers):
        return {"applied": np.zeros(1)}

    def apply(self, state, center, clock, worker, commit):
        new_center, tensors, _ = super().apply(None, center, clock, worker, commit)
        state["applied"] += 1
        return new_center, tensors, state


def test_rollback_returns_center_state_clock_and_ledger_to_the_snapshot():
    store = async_store(optimizer=_InPlaceCounter())
    store.commit(key(0, 0), 1, delta(1.0))
    store.finish(RUN, 0, 0, 1)
    snap = store.snapshot()
    store.commit(key(0, 0, epoch=1), 7, delta(10.0, base_clock=1))
    store.commit(key(1, 0, epoch=1), 8, delta(100.0, base_clock=2))
    assert store._state["applied"][0] == 3 and snap.state["applied"][0] == 1  # the snapshot was copied
    assert store.rollback(snap, "run-a.e1t1") == 2
    np.testing.assert_array_equal(store.center()[0], np.full(3, 1.0))
    assert store.clock == 1 and store._state["applied"][0] == 1 and store.run == "run-a.e1t1"
    assert [tuple(k) for k, _ in store.ledger()] == [(RUN, 0, 0, 0)]
    metrics = store.metrics()
    assert (metrics["epochs_rolled_back"], metrics["commits_rolled_back"], metrics["commits_applied"]) == (1, 2, 3)
    # the failed try's tasks are fenced out, by commit and by finish, as superseded attempts (HTTP 409)
    with pytest.raises(RolledBackError, match="its epoch try was rolled back; run run-a.e1t1 replaces run-a"):
        store.commit(key(1, 1, epoch=1), 8, delta(5.0, base_clock=1))
    with pytest.raises(StaleAttemptError):
        store.finish(RUN, 1, 1, 8)
    # the epoch trains again under the new id: the same keys apply once more, whatever their attempt ids
    store.commit(key(0, 0, epoch=1, run="run-a.e1t1"), 2, delta(3.0, base_clock=1))
    np.testing.assert_array_equal(store.center()[0], np.full(3, 4.0))
    assert store._state["applied"][0] == 2
    # the snapshot stays valid for a second rollback
    store.rollback(snap, "run-a.e1t2")
    np.testing.assert_array_equal(store.center()[0], np.full(3, 1.0))
    assert store._state["applied"][0] == 1
    with pytest.raises(ConfigError, match="a rollback needs a new run id"):
        store.rollback(snap, "run-a.e1t2")


def test_rollback_wakes_a_waiting_round_and_an_ssp_admission():
    store = sync_store(num_workers=2)
    snap = store.snapshot()
    ssp = async_store(optimizer=Downpour(staleness_bound=1))
    ssp_snap = ssp.snapshot()
    ssp.commit(key(0, 0), 1, delta(1.0))
    with ThreadPoolExecutor(2) as pool:
        in_round = pool.submit(store.commit, key(0, 0), 1, delta(1.0, n=2))
        admitting = pool.submit(ssp.commit, key(0, 1), 1, delta(1.0, base_clock=1))  # two ahead of a bound of 1
        wait_until(lambda: store.metrics()["waiting"] == 1 and ssp.metrics()["waiting"] == 1)
        store.rollback(snap, "run-a.t1")
        ssp.rollback(ssp_snap, "run-a.t1")
        with pytest.raises(RolledBackError):
            in_round.result(timeout=5)
        with pytest.raises(RolledBackError):
            admitting.result(timeout=5)
    np.testing.assert_array_equal(store.center()[0], [0.0, 0.0])
    np.testing.assert_array_equal(ssp.center()[0], np.zeros(3))
    assert store.metrics()["waiting"] == ssp.metrics()["waiting"] == 0



# --------------------------------------------------------------- norm guard
@pytest.mark.parametrize("mode", ["asynchronous", "synchronous"])
def test_the_norm_guard_refuses_an_update_far_beyond_the_recent_ones(mode):
    optimizer = Downpour() if mode == "asynchronous" else ModelAveraging(outer_momentum=0.0)
    store = Store([np.zeros(3)], optimizer, mode, 1, RUN, norm_guard=100)
    rng = np.random.default_rng(0)
    for step in range(NORM_WARMUP):
        store.commit(key(0, step), 1, delta(float(rng.uniform(0.5, 1.5)), base_clock=step))
    before = store.center()
    with pytest.raises(NormGuardError, match="its norm 1.73e\\+03 is over norm_guard=100 times the median"):
        store.commit(key(0, NORM_WARMUP), 1, delta(1000.0, base_clock=NORM_WARMUP))
    np.testing.assert_array_equal(store.center()[0], before[0])
    assert store.metrics()["commits_norm_refused"] == 1
    store.commit(key(0, NORM_WARMUP), 1, delta(50.0, base_clock=NORM_WARMUP))  # large, but within the guard
    assert store.clock == NORM_WARMUP + 1


def test_the_norm_guard_is_off_by_default_and_checked():
    store = async_store()
    for step in range(20):
        store.commit(key(0, step), 1, delta(1.0, base_clock=step))
    store.commit(key(0, 20), 1, delta(1e12, base_clock=20))  # no guard: applied
    assert store.metrics()["commits_norm_refused"] == 0
    for bad in (1, 0.5, float("nan"), float("inf"), True, "10"):
        with pytest.raises(ConfigError, match="`norm_guard` must be a number > 1 or None"):
            Store([np.zeros(2)], Downpour(), "asynchronous", 1, RUN, norm_guard=bad)
