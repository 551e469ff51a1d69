"""elephant.ps.shard_client: a sharded parameter server gives one store's bytes, for every rule.

The plan and the shard-count decision are tested in test_ps_shards_plan.py.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from elephant.errors import ConfigError, PSError, StaleAttemptError
from elephant.optimizers import Commit, DistributedOptimizer, get, registered_names
from elephant.ps.app import create_app
from elephant.ps.client import InProcessClient, PSClient
from elephant.ps.server import PSServer
from elephant.ps.shard_client import ShardedClient, check_shardable, shard_stores
from elephant.ps.shards import plan_shards
from elephant.ps.store import CommitKey, Store

RUN, TOKEN = "r", "tok"
SHAPES = [(9, 4), (4,), (3, 2, 2), (), (5,)]  # the first is cut into row ranges at S=2 and S=3


def initial_center():
    rng = np.random.default_rng(1)
    return [rng.normal(size=s).astype(np.float64 if i == 4 else np.float32) for i, s in enumerate(SHAPES)]


#: One row per registered rule: the keyword-argument variants each runs with (conformance-table style).
SHARD_TABLE = {
    "downpour": [{}],
    "agn": [{"window": 1}, {"step_scale": 1.0, "sqrt_scaling": True}],
    "adag": [{"gamma": 1e-2}],
    "dynsgd": [{}, {"sqrt_scaling": True}],
    "easgd": [{"alpha": 0.2}],
    "aeasgd": [{"alpha": 0.2}],
    "eamsgd": [{"alpha": 0.2, "momentum": 0.5}],
    "modelaveraging": [{}, {"outer_momentum": 0.0}],
    "dcasgd": [{"learning_rate": 0.1}, {"learning_rate": 0.1, "adaptive": True}],
    "delayednesterov": [{"window": 8}, {"outer_momentum": 0.5}],
}
CASES = [pytest.param(name, kwargs, mode, workers, id=f"{name}{k}-{mode}-K{workers}")
         for name, variants in SHARD_TABLE.items() for k, kwargs in enumerate(variants)
         for mode in get(name).modes for workers in ((2, 3) if mode == "synchronous" else (3,))]


#: Registered rules with a conformance test of their own: compressed commits are encoded layouts
#: (test_compressed_commits_through_shards_give_one_store_s_bytes below).
OWN_TEST = {"compressed"}


def test_the_table_covers_every_registered_rule_and_each_is_elementwise():
    assert sorted(SHARD_TABLE) == sorted(set(registered_names()) - OWN_TEST)
    assert all(get(name).elementwise for name in SHARD_TABLE)
    assert get("compressed").elementwise  # as its inner rule


def payload(seed, center):
    """A deterministic commit payload near the center (deltas for some rules, weights for the elastic ones)."""
    rng = np.random.default_rng(seed)
    return [(c + 0.1 * rng.normal(size=c.shape)).astype(c.dtype) - (c if seed % 2 else 0) for c in center]


def run_async(client_for, workers):
    """A fixed interleaving of pulls and commits; every reply's clock, center and tensors as bytes."""
    center = initial_center()
    clients = [client_for() for _ in range(workers)]
    base = {w: clients[w].pull(w, epoch=0).clock for w in range(workers)}
    seen = []
    for n, w in enumerate([0, 1, 2, 2, 1, 0, 1, 1, 2, 0, 0, 2][: 4 * workers]):
        w %= workers
        if n == 6:  # a mid-epoch pull (ADAG and DC-ASGD remember what a worker last received)
            base[w] = clients[w].pull(w, epoch=0).clock
        commit = Commit(payload(n, center), num_steps=1 + n % 3, num_samples=n % 4, base_clock=base[w])
        reply = clients[w].commit(CommitKey(RUN, 0, w, n), 7, commit)
        base[w] = reply.clock
        seen.append(_bytes(reply))
    for w, client in enumerate(clients):
        client.finish(RUN, 0, w, 7)
        client.close()
    return seen


def run_sync(client_for, workers):
    """Rounds with one thread per worker; worker 1 stops a round early and one window trains nothing."""
    center = initial_center()
    rounds = {w: 2 if w == 1 else 3 for w in range(workers)}

    def worker(w):
        with client_for() as client:
            base, seen = client.pull(w, epoch=0).clock, []
            for step in range(rounds[w]):
                samples = 0 if (w, step) == (workers - 1, 0) else 4 + w
                commit = Commit(payload(10 * w + step, center), num_steps=2, num_samples=samples, base_clock=base)
                reply = client.commit(CommitKey(RUN, 0, w, step), 3, commit)
                base = reply.clock
                seen.append(_bytes(reply))
            client.finish(RUN, 0, w, 3)
            return seen

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(worker, range(workers)))


def _bytes(reply):
    tensors = None if reply.tensors is None else [(t.dtype.str, t.shape, t.tobytes()) for t in reply.tensors]
    return reply.clock, [(c.dtype.str, c.shape, c.tobytes()) for c in reply.center], tensors


def serve(name, kwargs, mode, workers, shards):
    """Run the schedule on one store (``shards=None``) or on sharded stores; return the replies, center, clocks."""
    optimizer, center = get(name, **kwargs), initial_center()
    if shards is None:
        stores, plan = [Store(center, optimizer, mode, workers, RUN, round_timeout=20)], None
        client_for = lambda: InProcessClient(stores[0])  # noqa: E731
    else:
        plan = plan_shards(center, shards)
        stores = shard_stores(center, plan, optimizer, mode, workers, RUN, round_timeout=20)
        client_for = lambda: ShardedClient([InProcessClient(s) for s in stores], plan)  # noqa: E731
    seen = (run_sync if mode == "synchronous" else run_async)(client_for, workers)
    final = stores[0].center() if plan is None else plan.join([s.center() for s in stores])
    return seen, final, [s.clock for s in stores]


@pytest.mark.parametrize("name, kwargs, mode, workers", CASES)
def test_sharded_stores_give_one_store_s_bytes(name, kwargs, mode, workers):
    seen, center, (clock,) = serve(name, kwargs, mode, workers, None)
    assert clock > 0
    for shards in (2, 3):
        seen_s, center_s, clocks = serve(name, kwargs, mode, workers, shards)
        assert clocks == [clock] * shards
        assert seen_s == seen  # every reply: clock, center and rule tensors, byte for byte
        assert all(a.dtype == b.dtype and a.tobytes() == b.tobytes() for a, b in zip(center_s, center))


# --------------------------------------------------------------- compressed commits
COMPRESSED = [
    pytest.param("delayednesterov", "asynchronous", "int8", 8, id="delayednesterov-int8-block8"),
    pytest.param("downpour", "asynchronous", "int8", None, id="downpour-int8-one-scale"),
    pytest.param("modelaveraging", "synchronous", "int8", 8, id="modelaveraging-int8-block8"),
    pytest.param("modelaveraging", "synchronous", "bf16", None, id="modelaveraging-bf16"),
]


def _serve_compressed(inner, mode, codec, block, shards):
    """``serve`` for ``Compressed(inner)``: each worker encodes its payloads with error feedback, as a task does."""
    from elephant.optimizers import Compressed

    optimizer, center, workers = Compressed(inner, codec, block), initial_center(), 3
    if shards is None:
        stores, plan = [Store(center, optimizer, mode, workers, RUN, round_timeout=20)], None
        client_for = lambda: InProcessClient(stores[0])  # noqa: E731
    else:
        plan = plan_shards(center, shards, codec=optimizer.codec)
        stores = shard_stores(center, plan, optimizer, mode, workers, RUN, round_timeout=20)
        client_for = lambda: ShardedClient([InProcessClient(s) for s in stores], plan)  # noqa: E731
    states = {w: optimizer.worker_init(center) for w in range(workers)}

    def encoded(w, tensors):
        layout, states[w] = optimizer.make_commit(states[w], [c + t for c, t in zip(center, tensors)], center, 1)
        return layout

    seen = []
    if mode == "synchronous":
        clients = [client_for() for _ in range(workers)]
        for step in range(3):
            with ThreadPoolExecutor(workers) as pool:
                replies = list(pool.map(lambda w: clients[w].commit(CommitKey(RUN, 0, w, step), 1, Commit(
                    encoded(w, payload(10 * w + step, center)), 2, 4 + w, step)), range(workers)))
            seen.extend(_bytes(r) for r in replies)
    else:
        clients = [client_for() for _ in range(workers)]
        base = {w: clients[w].pull(w, epoch=0).clock for w in range(workers)}
        for n, w in enumerate([0, 1, 2, 2, 1, 0, 1, 2]):
            reply = clients[w].commit(CommitKey(RUN, 0, w, n), 1, Commit(encoded(w, payload(n, center)), 1, 1, base[w]))
            base[w] = reply.clock
            seen.append(_bytes(reply))
    for client in clients:
        client.close()
    final = stores[0].center() if plan is None else plan.join([s.center() for s in stores])
    return seen, final


@pytest.mark.parametrize("inner, mode, codec, block", COMPRESSED)
def test_compressed_commits_through_shards_give_one_store_s_bytes(inner, mode, codec, block):
    seen, center = _serve_compressed(inner, mode, codec, block, None)
    for shards in (2, 3):
        plan = plan_shards(initial_center(), shards, codec=get("compressed", inner=inner, codec=codec,
                                                                 block=block).codec)
        assert any(p.rows is not None for pieces in plan.shards for p in pieces)  # a tensor is cut
        seen_s, center_s = _serve_compressed(inner, mode, codec, block, shards)
        assert seen_s == seen
        assert all(a.dtype == b.dtype and a.tobytes() == b.tobytes() for a, b in zip(center_s, center))


def test_a_plan_for_int8_blocks_cuts_only_where_a_block_ends():
    from elephant.optimizers.codecs import Codec

    tensors = [np.zeros((90, 12), np.float32), np.zeros((40, 3), np.float32), np.zeros((7,), np.float32)]
    for block in (8, 64, 256):
        plan = plan_shards(tensors, 4, codec=Codec("int8", block))
        for pieces in plan.shards:
            for p in pieces:
                if p.rows is not None:
                    assert p.rows[0] * 12 % block == 0 or p.tensor != 0
                    assert p.rows[0] * 3 % block == 0 or p.tensor != 1
        assert plan.codec == Codec("int8", block)
        assert type(plan).from_data(plan.as_data()) == plan
    # without a codec (or with bf16, which has no blocks) the cuts are the plain plan's
    assert plan_shards(tensors, 4, codec=Codec("bf16")).shards == plan_shards(tensors, 4).shards


# --------------------------------------------------------------- partial commits
class FailingClient:
    """An in-process client whose commits fail (before reaching the store) at the given steps, once each."""

    def __init__(self, store, fail_steps=()):
        self.inner, self.fail_steps, self.address = InProcessClient(store), set(fail_steps), "flaky"

    def commit(self, key, attempt, commit, template=None):
        if key.step in self.fail_steps:
            self.fail_steps.discard(key.step)
            raise PSError(f"commit step {key.step}: injected failure")
        return self.inner.commit(key, attempt, commit, template)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def commits(n, workers=2):
    rng = np.random.default_rng(5)
    return [(CommitKey(RUN, 0, i % workers, i), Commit([rng.normal(size=s).astype(c.dtype) for s, c in
                                                         zip(SHAPES, initial_center())], 1, 1, 0)) for i in range(n)]


def test_a_commit_that_reached_one_shard_completes_on_retry_applied_once_per_shard():
    optimizer, center = get("delayednesterov", outer_momentum=0.5), initial_center()
    plan = plan_shards(center, 2)
    stores = shard_stores(center, plan, optimizer, "asynchronous", 2, RUN)
    single = Store(center, optimizer, "asynchronous", 2, RUN)
    with ShardedClient([InProcessClient(stores[0]), FailingClient(stores[1], fail_steps={1})], plan) as client:
        for key, commit in commits(4):
            expected = InProcessClient(single).commit(key, 1, commit)
            if key.step == 1:
                with pytest.raises(PSError, match=r"^shard 1 of 2 \(flaky\): commit step 1: injected failure$"):
                    client.commit(key, 1, commit)
                assert [s.clock for s in stores] == [2, 1]
            reply = client.commit(key, 1, commit)
            assert reply.clock == expected.clock
            assert [c.tobytes() for c in reply.center] == [c.tobytes() for c in expected.center]
        shard_metrics = client.metrics()["shards"]
    assert [(m["commits_applied"], m["replays_dropped"]) for m in shard_metrics] == [(4, 1), (4, 0)]
    assert [s.ledger() for s in stores] == [single.ledger()] * 2
    assert all(a.tobytes() == b.tobytes() for a, b in zip(plan.join([s.center() for s in stores]), single.center()))


def test_when_shard_clocks_disagree_the_reply_has_the_least_and_each_shard_its_own_base():
    optimizer, center = get("dynsgd"), initial_center()  # DynSGD scales by each shard's staleness
    plan = plan_shards(center, 2)
    stores = shard_stores(center, plan, optimizer, "asynchronous", 2, RUN)
    (key_a, commit_a), (key_b, commit_b) = commits(2)
    with ShardedClient([InProcessClient(stores[0]), FailingClient(stores[1], {0})], plan) as a, \
            ShardedClient([InProcessClient(s) for s in stores], plan) as b:
        with pytest.raises(PSError, match="shard 1 of 2"):
            a.commit(key_a, 1, commit_a)  # applied on shard 0 only
        assert [s.clock for s in stores] == [1, 0] and b.health()["clock"] == 0
        pulled = b.pull(1)
        assert pulled.clock == 0  # the least shard clock: a base no shard can refuse
        assert [c.tobytes() for c in pulled.center] == [c.tobytes() for c in plan.join([s.center() for s in stores])]
        reply = b.commit(key_b, 1, Commit(commit_b.tensors, 1, 1, base_clock=pulled.clock))
        assert reply.clock == 1 and [s.clock for s in stores] == [2, 1]
        assert [s.metrics()["staleness"] for s in stores] == [{0: 2}, {0: 1}]  # shard 0 got base 1, shard 1 base 0
        retried = a.commit(key_a, 1, commit_a)  # completes: a replay on shard 0, applied on shard 1
        assert retried.clock == 2 and retried.tensors is None
    assert [s.metrics()["staleness"] for s in stores] == [{0: 2}, {0: 1, 1: 1}]
    assert [s.ledger() for s in stores][0] == [(key_a, 1), (key_b, 1)]


# ----------------------------------------------------------------- the client
def test_errors_name_the_shard_and_keep_their_kind():
    center = initial_center()
    plan = plan_shards(center, 3)
    stores = shard_stores(center, plan, get("downpour"), "asynchronous", 2, RUN)
    with ShardedClient([InProcessClient(s) for s in stores], plan) as client:
        client.commit(CommitKey(RUN, 0, 0, 0), 5, Commit(center, 1, 1, 0))
        with pytest.raises(StaleAttemptError, match=r"^shard 0 of 3 \(in-process\): .*superseded by task attempt 5.*"
                                                    r"\(shards \[1, 2\] failed too\)$"):
            client.commit(CommitKey(RUN, 0, 0, 1), 4, Commit(center, 1, 1, 0))
        with pytest.raises(PSError, match=r"rejected by shards\[in-process, in-process, in-process\]: "
                                          r"split: expected 5 tensors, received 4"):
            client.commit(CommitKey(RUN, 0, 0, 2), 5, Commit(center[:4], 1, 1, 0))
        with pytest.raises(PSError, match=r"^pull \(worker 0\): shards\[in-process, in-process, in-process\] sent "
                                          r"an invalid reply: center tensor 0: expected float64\[9, 4\], received "):
            client.pull(0, template=[np.zeros((9, 4), np.float64), *center[1:]])
        health = client.health()
        assert health["status"] == "ok" and health["clock"] == 1 and len(health["shards"]) == 3
    with pytest.raises(PSError, match="the sharded client is closed"):
        client.pull(0)


def test_a_foreign_error_becomes_a_ps_error_naming_the_shard():
    class Broken(InProcessClient):
        def pull(self, worker, template=None, epoch=None):
            raise OSError("disk on fire")

    center = initial_center()
    plan = plan_shards(center, 2)
    stores = shard_stores(center, plan, get("downpour"), "asynchronous", 1, RUN)
    with ShardedClient([InProcessClient(stores[0]), Broken(stores[1])], plan) as client:
        with pytest.raises(PSError, match=r"pull \(worker 0\) to shard 1 of 2 \(in-process\) failed: "
                                          r"OSError\('disk on fire'\)"):
            client.pull(0)


def test_client_settings_are_validated_and_it_refuses_to_pickle():
    center = initial_center()
    plan = plan_shards(center, 2)
    stores = shard_stores(center, plan, get("downpour"), "asynchronous", 1, RUN)
    with pytest.raises(ConfigError, match=r"`clients` must hold one client per shard of the plan \(2\); "
                                          r"received 1 clients"):
        ShardedClient([InProcessClient(stores[0])], plan)
    with pytest.raises(ConfigError, match=r"`clients\[1\]` lacks the client method\(s\) \['health'"):
        ShardedClient([InProcessClient(stores[0]), object()], plan)
    with pytest.raises(ConfigError, match=r"`plan` must be a ShardPlan \(from plan_shards\); received plan=2"):
        ShardedClient([], 2)
    with ShardedClient([InProcessClient(s) for s in stores], plan) as client:
        client.pull(0)
        assert [t.name for t in threading.enumerate() if t.name.startswith("elephant-ps-shards")]
        with pytest.raises(TypeError, match="build one inside each Spark task"):
            pickle.dumps(client)
    client.close()  # idempotent


def test_what_cannot_be_sharded_is_refused():
    class GlobalClip(DistributedOptimizer):  # clips a commit by its norm over all tensors: not elementwise
        def apply(self, state, center, clock, worker, commit):
            norm = np.sqrt(sum(float(np.vdot(t, t)) for t in commit.tensors))
            return [c + t / max(1.0, norm) for c, t in zip(center, commit.tensors)], None, state

    center = initial_center()
    plan = plan_shards(center, 2)
    with pytest.raises(ConfigError, match=r"a sharded parameter server cannot apply `norm_guard`: .*"
                                          r"received norm_guard=3.0"):
        shard_stores(center, plan, get("downpour"), "asynchronous", 1, RUN, norm_guard=3.0)
    with pytest.raises(ConfigError, match=r"GlobalClip's server rule is not declared elementwise .*received "
                                          r"optimizer=GlobalClip\(window=1, staleness_bound=None\)"):
        shard_stores(center, plan, GlobalClip(), "asynchronous", 1, RUN)
    with pytest.raises(ConfigError, match=r"`plan` must be a ShardPlan"):
        shard_stores(center, None, get("downpour"), "asynchronous", 1, RUN)
    check_shardable(get("downpour"))


# -------------------------------------------------------------- over HTTP
def test_shards_served_over_http_give_one_store_s_centers():
    optimizer, center = get("delayednesterov", outer_momentum=0.5), initial_center()
    plan = plan_shards(center, 2)
    stores = shard_stores(center, plan, optimizer, "asynchronous", 2, RUN)
    single = InProcessClient(Store(center, optimizer, "asynchronous", 2, RUN))
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(PSServer(create_app(s, TOKEN), host="127.0.0.1")) for s in stores]
        with ShardedClient([PSClient(server.url, TOKEN) for server in servers], plan) as client:
            assert client.pull(0, template=center).clock == 0
            for key, commit in commits(5):
                reply, expected = client.commit(key, 1, commit, template=center), single.commit(key, 1, commit)
                assert reply.clock == expected.clock
                assert [c.tobytes() for c in reply.center] == [c.tobytes() for c in expected.center]
            last_key, last_commit = commits(5)[-1]
            replay = client.commit(last_key, 1, last_commit)
            for w in range(2):
                client.finish(RUN, 0, w, 1)
            metrics = client.metrics()
    assert replay.clock == 5 and replay.tensors is None
    assert [m["commits_applied"] for m in metrics["shards"]] == [5, 5] and metrics["bytes_in"] > 0
    assert [m["replays_dropped"] for m in metrics["shards"]] == [1, 1]
