"""Parameter-server shards in processes of their own: started, steered over a pipe, stopped without leaks.

Each test starts real child processes (``spawn``: a fresh interpreter each, a
second or two), so the tests share a few starts where they can.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import time

import numpy as np
import pytest

from elephant.errors import ConfigError, PSError
from elephant.optimizers import Commit, get
from elephant.ps.client import InProcessClient, PSClient
from elephant.ps.shard_client import ShardedClient
from elephant.ps.shard_process import NAME_PREFIX, ShardProcess, start_shards
from elephant.ps.sharded_store import ShardedSnapshot, make_store
from elephant.ps.store import CommitKey, Store

RUN, TOKEN = "r", "secret-token"
SHAPES = [(9, 4), (4,), (3, 2, 2), (), (5,)]


def center0():
    rng = np.random.default_rng(1)
    return [rng.normal(size=s).astype(np.float64 if i == 4 else np.float32) for i, s in enumerate(SHAPES)]


def _commits(client, start, count, workers=2, run=RUN, template=None):
    for n in range(start, start + count):
        w = n % workers
        reply = client.pull(w, template=template, epoch=0)
        rng = np.random.default_rng(n)
        tensors = [(0.1 * rng.normal(size=c.shape)).astype(c.dtype) for c in reply.center]
        client.commit(CommitKey(run, 0, w, n), 5, Commit(tensors, 1, 4, reply.clock), template=template)


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def _children():
    return [p for p in multiprocessing.active_children() if p.name.startswith(NAME_PREFIX)]


def _serving(store):
    return store.serve_in_processes(TOKEN, "127.0.0.1", [0], 8)


@pytest.mark.parametrize("rule", ["delayednesterov"])
def test_shard_processes_serve_the_bytes_of_in_process_stores(rule):
    center = center0()
    reference = make_store(center, get(rule), "asynchronous", 2, RUN, shards=2)  # in-process shards
    hosted = make_store(center, get(rule), "asynchronous", 2, RUN, shards=2)
    in_process = ShardedClient([InProcessClient(s) for s in reference.shards], reference.plan)
    start = time.perf_counter()
    urls = _serving(hosted)
    started = time.perf_counter() - start
    try:
        assert hosted.in_processes and not reference.in_processes and len(urls) == 2 and started < 120
        assert all(isinstance(s, ShardProcess) and s.url == u for s, u in zip(hosted.shards, urls))
        assert {s.process.pid for s in hosted.shards}.isdisjoint({os.getpid()})
        with ShardedClient([PSClient(u, TOKEN) for u in urls], hosted.plan) as http:
            _commits(http, 0, 6, template=center)
        _commits(in_process, 0, 6)
        _same(hosted.center(), reference.center())
        _same(hosted.template, reference.center())
        assert hosted.clock == 6 and hosted.samples_applied == 24 and hosted.ledger() == reference.ledger()
        assert hosted.metrics()["commits_applied"] == 6 and hosted.metrics()["bytes_in"] > 0

        # a snapshot crosses the pipe as data, and a rollback to it crosses back
        shot, shot_ref = hosted.snapshot(), reference.snapshot()
        assert isinstance(shot, ShardedSnapshot) and len(shot.state) == 2
        with ShardedClient([PSClient(u, TOKEN) for u in urls], hosted.plan) as http:
            _commits(http, 6, 3, template=center)
        _commits(in_process, 6, 3)
        assert hosted.rollback(shot, RUN + "t1") == reference.rollback(shot_ref, RUN + "t1") == 3
        assert hosted.run == RUN + "t1" and all(s.run == RUN + "t1" for s in hosted.shards)
        _same(hosted.center(), reference.center())
        hosted.learning_rate_changed(0.5)
        reference.learning_rate_changed(0.5)
        with ShardedClient([PSClient(u, TOKEN) for u in urls], hosted.plan) as http:
            _commits(http, 20, 4, run=RUN + "t1", template=center)
        _commits(in_process, 20, 4, run=RUN + "t1")
        _same(hosted.center(), reference.center())
        with pytest.raises(ConfigError, match="a rollback needs a new run id"):  # the child's error, raised here
            hosted.shards[0].rollback(shot.shards[0], RUN + "t1")
    finally:
        in_process.close()
        hosted.stop_processes()
    assert not _children()
    # the final state came back: readable after the processes are gone, as the fit's report reads it
    assert not hosted.in_processes and all(type(s) is Store for s in hosted.shards)
    _same(hosted.center(), reference.center())
    assert hosted.ledger() == reference.ledger() and hosted.metrics()["commits_rolled_back"] == 3
    hosted.stop_processes()  # idempotent


def test_a_start_failure_names_the_shard_and_carries_the_child_s_traceback():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    store = make_store(center0(), get("downpour"), "asynchronous", 2, RUN, shards=2)
    try:
        with pytest.raises(PSError, match=rf"(?s)shard \d \(process \d+\) failed to start:.*Traceback.*"
                                          rf"could not bind the parameter server to 127.0.0.1:{port}"):
            store.serve_in_processes(TOKEN, "127.0.0.1", [port], 8, ports_from="spark.elephant.ps.ports")
    finally:
        taken.close()
    assert not _children() and not store.in_processes  # the shard that started was stopped too
    assert type(store.shards[0]) is Store


def test_stop_joins_and_the_child_exits_when_the_driver_s_pipe_closes():
    spec = dict(center=center0()[:2], optimizer=get("downpour"), mode="asynchronous", num_workers=1, run=RUN,
                round_timeout=5.0, state=None, clock=0, token=TOKEN, host="127.0.0.1", ports=[0],
                ports_from="test", max_body_bytes=1 << 20, threads=4)
    first, second = start_shards([spec, dict(spec)])
    try:
        with PSClient(first.url, TOKEN) as client:
            assert client.health()["run"] == RUN
        second._conn.close()  # as when the driver dies: the child's end reads EOF
        second.process.join(30)
        assert second.process.exitcode == 0
        with pytest.raises(PSError, match="shard 1"):
            second.center()
    finally:
        assert first.stop().clock == 0
        second.stop()
    assert first.process.exitcode == 0 and not _children()
    with pytest.raises(PSError, match="shard 0 was stopped; received a request for metrics"):
        first.metrics()
    with pytest.raises(TypeError, match="cannot be pickled into a Spark task"):
        import pickle

        pickle.dumps(first)


def test_a_blocked_wait_does_not_block_the_other_requests():
    store = make_store(center0(), get("downpour"), "asynchronous", 1, RUN, shards=2)
    urls = _serving(store)
    try:
        import threading

        shard = store.shards[0]
        waited = threading.Thread(target=shard.wait_finished, args=(0,))
        waited.start()
        time.sleep(0.2)
        assert shard.metrics()["run"] == RUN and waited.is_alive()  # answered while the wait blocks
        for url in urls:
            with PSClient(url, TOKEN) as client:
                client.finish(RUN, 0, 0, 1)
        waited.join(10)
        assert not waited.is_alive()
    finally:
        store.stop_processes()



def test_a_rule_defined_in_main_serves_from_threads_with_a_warning(caplog):
    import logging

    from elephant.fit.classic import _hostable
    from elephant.ps.shard_process import unhostable

    rule = get("downpour")
    in_main = type("MainRule", (type(rule),), {"__module__": "__main__"})()
    assert unhostable(rule) is None and _hostable(rule)
    assert "MainRule is defined in __main__" in unhostable(in_main)
    with caplog.at_level(logging.WARNING, logger="elephant.fit.classic"):
        assert not _hostable(in_main)
    assert any("serve from the driver's threads, not processes" in r.getMessage() for r in caplog.records)


def test_stop_terminates_a_child_that_does_not_answer(caplog):
    import logging
    import signal

    spec = dict(center=center0()[:2], optimizer=get("downpour"), mode="asynchronous", num_workers=1, run=RUN,
                round_timeout=5.0, state=None, clock=0, token=TOKEN, host="127.0.0.1", ports=[0],
                ports_from="test", max_body_bytes=1 << 20, threads=4)
    (shard,) = start_shards([spec])
    os.kill(shard.process.pid, signal.SIGSTOP)  # hung: neither answers nor exits
    with caplog.at_level(logging.WARNING, logger="elephant.ps.shard_process"):
        assert shard.stop(timeout=1.0) is None
    assert not shard.process.is_alive() and shard.process.exitcode is not None and not _children()
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "did not answer stop in time" in messages and "did not exit in 1 s; terminating it" in messages
