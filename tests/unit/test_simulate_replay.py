"""Runtime ≡ replay: the threaded parameter-server store and ``simulate`` agree bit for bit.

numpy workers drive a real :class:`elephant.ps.store.Store` from threads (the
same rule calls the Spark worker makes), either directly or over HTTP through
:class:`~elephant.ps.server.PSServer` and one :class:`~elephant.ps.client.PSClient`
per worker thread; the order in which the store applied commits (its ledger) is
then replayed through :func:`simulate`, which must end on a bit-identical center
(optimizers.md §14.6; T4.5 and T5.3).
"""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest

from elephant.optimizers import Commit, DynSGD, get, registered_names, simulate
from elephant.optimizers.simulate import quadratic, sgd
from elephant.ps.app import create_app
from elephant.ps.client import PSClient
from elephant.ps.server import PSServer
from elephant.ps.store import CommitKey, Store

RUN = "replay"
TOKEN = "replay-token"
LR = 0.05
INIT = [np.zeros((3, 2), np.float32), np.zeros((2,), np.float32)]
TARGETS = [
    [np.full((3, 2), 1.0 + k, np.float32), np.array([-1.0, 2.0 * k], np.float32)] for k in range(4)
]
STEP = sgd(LR)


def worker_loop(store, opt, k, commits, grad, starts, ready, samples=8):
    """What the Spark worker does, with numpy instead of Keras; records the clock each window started from."""
    reply = store.pull(k)
    starts[k] = [reply.clock]
    ready.wait()
    state, weights, slots = opt.worker_init(reply.center), [np.array(a) for a in reply.center], None
    pulled, base = reply.center, reply.clock
    for step in range(commits):
        for _ in range(opt.window):
            weights, slots = STEP(weights, grad, slots)
        tensors, state = opt.make_commit(state, weights, pulled, opt.window)
        commit = Commit(tensors, opt.window, opt.window * samples, base)
        reply = store.commit(CommitKey(RUN, 0, k, step), 0, commit)
        weights, state = opt.on_reply(state, weights, reply)
        pulled, base = reply.center, reply.clock
        starts[k].append(reply.clock)
    store.finish(RUN, 0, k, 0)


def run_threads(opt, mode, commits_per_worker, transport="store"):
    n = len(commits_per_worker)
    store = Store(INIT, opt, mode, n, RUN)
    grads = [quadratic(t) for t in TARGETS[:n]]
    starts, errors = {}, []
    ready = threading.Barrier(n) if mode != "synchronous" else threading.Barrier(1)
    server = PSServer(create_app(store, TOKEN)).start() if transport == "http" else None

    def target(k):
        try:
            if server is None:
                worker_loop(store, opt, k, commits_per_worker[k], grads[k], starts, ready)
            else:
                with PSClient(server.url, TOKEN) as client:
                    worker_loop(client, opt, k, commits_per_worker[k], grads[k], starts, ready)
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)
            ready.abort()

    threads = [threading.Thread(target=target, args=(k,), name=f"worker-{k}") for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if server is not None:
        server.stop()
    store.close()
    assert not any(t.is_alive() for t in threads)
    if errors:
        raise errors[0]
    return store, grads, starts


def replay_async(opt, store, grads, starts):
    """Each event at the clock it happened at: the worker's pull and each window's
    steps where its reply arrived (SSP may hold a reply back), its commit at its
    place in the ledger, its finish after its last reply."""
    timeline = []  # (clock, order, event): at one clock, finishes, pulls, steps, then the commit applied there
    for position, (key, _) in enumerate(store.ledger()):
        k = key.partition
        timeline += [(starts[k][key.step], 2, ("step", k, opt.window)), (position, 3, ("commit", k))]
    for k, clocks in starts.items():
        timeline += [(clocks[0], 1, ("pull", k)), (clocks[-1], 0, ("finish", k))]
    schedule = [event for *_, event in sorted(timeline, key=lambda t: (t[0], t[1], t[2][1]))]
    return simulate(opt, INIT, grads, schedule, local_step=STEP, num_samples=8)


def replay_rounds(opt, store, grads, commits_per_worker):
    schedule = [("pull", k) for k in range(len(grads))]
    rounds: dict[int, list[int]] = {}
    for key, _ in store.ledger():
        rounds.setdefault(key.step, []).append(key.partition)
    for step, workers in rounds.items():
        schedule += [e for k in workers for e in (("step", k, opt.window), ("commit", k))]
        schedule += [("finish", k) for k, m in enumerate(commits_per_worker) if m == step + 1]
    return simulate(opt, INIT, grads, schedule, local_step=STEP, num_samples=8)


def assert_same_center(store, trace):
    for got, want in zip(store.center(), trace.center, strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


ASYNC = [name for name in registered_names() if "asynchronous" in get(name).modes]
SYNC = [name for name in registered_names() if "synchronous" in get(name).modes]
KWARGS = {"dcasgd": {"learning_rate": LR}, "adag": {"gamma": 1e-2}}


@pytest.mark.parametrize("transport", ["store", "http"])
@pytest.mark.parametrize("name", ASYNC)
def test_asynchronous_store_equals_replay(name, transport):
    opt = get(name, window=2, **KWARGS.get(name, {}))
    commits = [12, 9, 15, 6]
    store, grads, starts = run_threads(opt, "asynchronous", commits, transport)
    trace = replay_async(opt, store, grads, starts)
    assert trace.clock == store.clock == sum(commits)
    assert_same_center(store, trace)
    assert Counter(trace.staleness) == Counter(store.metrics()["staleness"])
    assert max(trace.staleness) >= 3  # every worker pulled before the first commit


def test_asynchronous_store_with_a_staleness_bound_equals_replay():
    opt = DynSGD(window=1, staleness_bound=1)
    store, grads, starts = run_threads(opt, "asynchronous", [10, 10, 10])
    trace = replay_async(opt, store, grads, starts)  # raises if the store admitted what SSP forbids
    assert_same_center(store, trace)
    assert Counter(trace.staleness) == Counter(store.metrics()["staleness"])


@pytest.mark.parametrize("name", ["adag", "dcasgd"])
def test_stateful_rules_with_a_staleness_bound_equal_replay(name):
    opt = get(name, window=1, staleness_bound=1, **KWARGS[name])
    store, grads, starts = run_threads(opt, "asynchronous", [10, 10, 10])
    assert_same_center(store, replay_async(opt, store, grads, starts))


@pytest.mark.parametrize("transport", ["store", "http"])
@pytest.mark.parametrize("name", SYNC)
def test_synchronous_store_equals_replay(name, transport):
    opt = get(name, window=3)
    commits = [5, 5, 3]  # worker 2 finishes early and leaves the rounds
    store, grads, _ = run_threads(opt, "synchronous", commits, transport)
    trace = replay_rounds(opt, store, grads, commits)
    assert trace.clock == store.clock == 5
    assert_same_center(store, trace)


def test_t5_3_dynsgd_clock_is_atomic():
    """2 threads × 1000 commits of Δ = 1: clock 2000, no clock value used twice, each factor 1/(τ + 1)."""
    applied = []

    class Audited(DynSGD):
        name = "audited-dynsgd"

        def apply(self, state, center, clock, worker, commit):
            applied.append((clock, clock - commit.base_clock))  # runs under the store's lock
            return super().apply(state, center, clock, worker, commit)

    opt = Audited(window=1)
    store = Store([np.zeros(1)], opt, "asynchronous", 2, RUN)
    one = [np.ones(1)]

    def target(k):
        reply = store.pull(k)
        for step in range(1000):
            reply = store.commit(CommitKey(RUN, 0, k, step), 0, Commit(one, 1, 1, reply.clock))
            if step % 7 == 0:
                reply = store.pull(k)  # interleaved pulls

    threads = [threading.Thread(target=target, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    store.close()
    assert store.clock == 2000
    assert [c for c, _ in applied] == list(range(2000))
    expected = sum(1.0 / (tau + 1) for _, tau in applied)
    assert float(store.center()[0][0]) == pytest.approx(expected, rel=1e-12)
