"""The pieces of a fit from a Spark Connect client that run without Spark: slots, results, store hand-over."""

from __future__ import annotations

import numpy as np
import pytest

from elephant.fit.connect import connect_slots
from elephant.fit.hosted import decode_result, encode_result
from elephant.optimizers import Commit, Downpour, ModelAveraging
from elephant.optimizers.dcasgd import DCASGDState
from elephant.ps.store import CommitKey, Store


@pytest.mark.parametrize("conf, slots", [
    ({"spark.master": "local[2]"}, 2),
    ({"spark.master": "local[4, 3]"}, 4),  # with task retries
    ({"spark.master": "local"}, 1),
    ({"spark.master": "local-cluster[2,1,1024]"}, 2),
    ({"spark.master": "local-cluster[3, 2, 2048]", "spark.task.cpus": "2"}, 3),
    ({"spark.master": "spark://h:7077", "spark.executor.instances": "4", "spark.executor.cores": "2"}, 8),
    ({"spark.master": "yarn", "spark.executor.instances": "4"}, None),  # cores unknown
    ({"spark.master": "local[*]"}, None),  # the server's cores, which the client cannot see
    ({"spark.master": None}, None),
])
def test_slots_are_read_from_what_the_conf_states(conf, slots):
    assert connect_slots(conf) == slots


def _commit(delta, base_clock, samples):
    return Commit(tensors=[delta], num_steps=1, num_samples=samples, base_clock=base_clock)


def _async_store(center, **kwargs):
    return Store(center, Downpour(), "asynchronous", 2, "run1", **kwargs)


def test_a_store_goes_on_from_another_stores_epoch():
    client = _async_store([np.zeros(3)])
    start = client.snapshot()
    hosted = _async_store(start.center, state=start.state, clock=start.clock)
    for step in range(3):
        commit = _commit(np.full(3, 1.0), base_clock=step, samples=5)
        hosted.commit(CommitKey("run1", 0, step % 2, step), 1, commit)
    client.absorb(hosted.outcome())
    np.testing.assert_array_equal(client.center()[0], np.full(3, 3.0))
    assert client.clock == 3 and len(client.ledger()) == 3 and client.samples_applied == 15
    assert client.metrics()["commits_applied"] == 3
    # the next epoch's store starts from the client's clock, so staleness is measured across epochs
    again = _async_store(client.center(), state=client.snapshot().state, clock=client.clock)
    again.commit(CommitKey("run1", 1, 0, 0), 1, _commit(np.ones(3), base_clock=1, samples=5))
    client.absorb(again.outcome())
    assert client.clock == 4 and client.metrics()["staleness"] == {0: 3, 2: 1}
    assert client.metrics()["commits_applied"] == 4


def test_a_store_refuses_a_negative_clock():
    with pytest.raises(Exception, match="clock"):
        _async_store([np.zeros(3)], clock=-1)


@pytest.mark.parametrize("state", [
    None,
    {"workers": 2, "gain": 1.0, 0: [np.ones(2)], 1: [np.zeros(2)]},
    DCASGDState(mean_square=[np.ones(2)], backups={1: [np.full(2, 3.0)]}),
])
def test_a_task_result_round_trips_without_pickle(state):
    hosted = Store([np.arange(4, dtype=np.float32).reshape(2, 2), np.ones(3)], ModelAveraging(), "synchronous", 1,
                   "run1", state=state)
    stats = [{"partition": 0, "samples": np.int64(7), "logs": {"loss": np.float32(0.5)}, "diverged_at": None}]
    data = encode_result(stats, (1, hosted.outcome()))
    assert isinstance(data, bytes)
    got_stats, (shard, outcome) = decode_result(data, "elephant.optimizers")
    assert shard == 1
    assert got_stats == [{"partition": 0, "samples": 7, "logs": {"loss": 0.5}, "diverged_at": None}]
    for a, b in zip(outcome.center, hosted.center(), strict=True):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype
    assert type(outcome.state) is type(state)
    if isinstance(state, DCASGDState):
        np.testing.assert_array_equal(outcome.state.backups[1][0], np.full(2, 3.0))
    assert decode_result(encode_result(stats, None), "elephant.optimizers")[1] is None


def test_a_ledger_comes_back_as_commit_keys():
    hosted = _async_store([np.zeros(2)])
    hosted.commit(CommitKey("run1", 0, 1, 0), 9, _commit(np.ones(2), base_clock=0, samples=1))
    _, (_, outcome) = decode_result(encode_result([], (0, hosted.outcome())), "elephant.optimizers")
    assert outcome.ledger == [(CommitKey("run1", 0, 1, 0), 9)] and outcome.ledger[0][0].partition == 1
    assert outcome.staleness == {0: 1} and outcome.clock == 1


def test_a_hosting_task_waits_until_every_partition_has_finished_the_epoch():
    import threading

    store = _async_store([np.zeros(2)])
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (store.wait_finished(0), done.set()), daemon=True)
    waiter.start()
    store.finish("run1", 0, 0, 1)
    assert not done.wait(0.2)  # partition 1 is still training
    store.finish("run1", 0, 1, 2)
    assert done.wait(5)


def test_closing_the_store_wakes_a_hosting_task_that_waits():
    import threading

    from elephant.ps.store import StoreClosedError

    store = _async_store([np.zeros(2)])
    errors = []

    def wait():
        try:
            store.wait_finished(0)
        except StoreClosedError as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    store.finish("run1", 0, 0, 1)
    store.close()
    waiter.join(5)
    assert not waiter.is_alive() and len(errors) == 1


def test_a_sharded_store_goes_on_from_its_shards_epochs_served_elsewhere():
    """Each hosting task serves one shard from the client's snapshot; the client absorbs them into one center."""
    from elephant.errors import ConfigError
    from elephant.ps.sharded_store import make_store

    center = [np.arange(12, dtype=np.float32).reshape(4, 3), np.ones(5, np.float32)]
    one = make_store(center, Downpour(), "asynchronous", 2, "run1")
    client = make_store(center, Downpour(), "asynchronous", 2, "run1", shards=2)
    start = client.snapshot()
    hosted = [Store(shot.center, shard.optimizer, "asynchronous", 2, "run1", state=shot.state, clock=shot.clock)
              for shot, shard in zip(start.shards, client.shards, strict=True)]
    delta = [np.full((4, 3), 0.5, np.float32), np.full(5, -1.0, np.float32)]
    for step in range(2):
        key = CommitKey("run1", 0, step, 0)
        one.commit(key, 1, Commit(tensors=delta, num_steps=1, num_samples=5, base_clock=0))
        for store, piece in zip(hosted, client.plan.split(delta), strict=True):
            store.commit(key, 1, Commit(tensors=piece, num_steps=1, num_samples=5, base_clock=0))
    served = [decode_result(encode_result([], (i, s.outcome())), "elephant.optimizers")[1] for i, s in
              enumerate(hosted)]
    with pytest.raises(ConfigError, match="one outcome per shard of the plan"):
        client.absorb([served[0][1]])
    assert client.clock == 0  # refused whole: no shard took anything
    client.absorb([outcome for _, outcome in sorted(served, key=lambda pair: pair[0])])
    for a, b in zip(client.center(), one.center(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert client.clock == one.clock == 2 and len(client.ledger()) == 2
    assert client.metrics()["commits_applied"] == one.metrics()["commits_applied"] == 2


def test_a_hosting_task_waits_a_while_at_a_time():
    import time

    store = _async_store([np.zeros(2)])
    store.finish("run1", 0, 0, 1)
    started = time.monotonic()
    assert store.wait_finished(0, timeout=0.2) is False  # partition 1 is still training
    assert 0.15 < time.monotonic() - started < 3
    store.finish("run1", 0, 1, 2)
    assert store.wait_finished(0, timeout=0.2) is True and store.wait_finished(0) is True


def test_a_shard_server_that_stopped_is_found_lost():
    """A hosting task that waits for the epoch ends when another shard's server went down with its failed task."""
    import socket

    from elephant.fit.hosted import lost_servers

    listening = socket.create_server(("127.0.0.1", 0))
    closed = socket.create_server(("127.0.0.1", 0))
    up, down = (f"http://127.0.0.1:{s.getsockname()[1]}" for s in (listening, closed))
    closed.close()
    try:
        assert lost_servers([up, down], 0) == [down]
        assert lost_servers([down, up], 0) == []  # its own server is not checked
        assert lost_servers([up, up], 1) == []
    finally:
        listening.close()
