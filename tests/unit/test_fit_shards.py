"""A fit's parameter-server shards: ``ps_shards`` checked, the decision, and the driver's ShardedStore facade.

The facade must give a fit what one store gives it: the center, a snapshot and
its rollback, the metrics, and a backup that restores every shard's rule state.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from elephant import checkpoint
from elephant.config import Settings
from elephant.errors import ConfigError, PSError
from elephant.fit.backup import resume_from_backup, rule_identity, save_backup
from elephant.fit.plan import plan_fit
from elephant.fit.shard_choice import check_requested_shards, decide_shards, shard_blocker
from elephant.optimizers import Commit, Downpour, get
from elephant.ps.client import InProcessClient, PSClient
from elephant.ps.shard_client import ShardedClient, connect_shards
from elephant.ps.sharded_store import ShardedSnapshot, ShardedStore, make_store
from elephant.ps.shards import ShardPlan, plan_shards
from elephant.ps.store import CommitKey, Store
from elephant.worker import TaskSpec

from .helpers import tiny_model

RUN = "r"
SHAPES = [(9, 4), (4,), (3, 2, 2), (), (5,)]  # the first is cut into row ranges at S=2 and S=3


class NotElementwise(Downpour):
    """DOWNPOUR declared as reducing over the tensors (as a rule clipping by the global norm would)."""

    elementwise = False


# ------------------------------------------------------------------ ps_shards
@pytest.mark.parametrize("value", [0, -1, 1.5, "2", True, [2]])
def test_ps_shards_must_be_a_positive_int_or_none(value):
    with pytest.raises(ConfigError, match=r"`ps_shards` must be a positive int or None \(decided at fit start\); "
                                          rf"received ps_shards={value!r}".replace("[", r"\[").replace("]", r"\]")):
        Settings(ps_shards=value)


@pytest.mark.parametrize("value", [None, 1, 2, np.int64(3)])
def test_ps_shards_accepts_none_and_positive_ints(value):
    assert Settings(ps_shards=value).ps_shards == (None if value is None else int(value))
    assert Settings.from_config(Settings(ps_shards=value).to_config()).ps_shards == Settings(ps_shards=value).ps_shards


@pytest.mark.parametrize("settings, match", [
    (dict(ps_shards=2, norm_guard=10.0), r"`ps_shards` must be 1 or None here: a sharded parameter server cannot "
                                         r"apply `norm_guard`.*received ps_shards=2"),
    (dict(ps_shards=3, optimizer=NotElementwise()), r"`ps_shards` must be 1 or None here: NotElementwise's server "
                                                    r"rule is not declared elementwise.*received ps_shards=3"),
])
def test_more_than_one_shard_is_refused_where_the_server_cannot_be_sharded(settings, match):
    with pytest.raises(ConfigError, match=match):
        check_requested_shards(Settings(**settings))
    check_requested_shards(Settings(**dict(settings, ps_shards=1)))  # one shard is the unsharded server
    check_requested_shards(Settings(**dict(settings, ps_shards=None)))  # decided: 1


def test_sparkmodel_refuses_shards_with_norm_guard_at_construction():
    from elephant import SparkModel

    with pytest.raises(ConfigError, match=r"`ps_shards` must be 1 or None here:.*norm_guard.*received ps_shards=2"):
        SparkModel(tiny_model(), ps_shards=2, norm_guard=10.0)


@pytest.mark.parametrize("value", ["Executors", "tasks", 1, True])
def test_ps_placement_is_checked(value):
    with pytest.raises(ConfigError, match=r"`ps_placement` must be one of \[None, 'driver', 'executors'\]; "
                                          rf"received ps_placement={value!r}"):
        Settings(ps_placement=value)


@pytest.mark.parametrize("value", [None, "driver", "executors"])
def test_ps_placement_accepts_its_values_and_travels_in_the_config(value):
    settings = Settings(ps_placement=value)
    assert settings.ps_placement == value and Settings.from_config(settings.to_config()).ps_placement == value


def test_a_connect_fit_serves_at_most_one_shard_per_worker():
    assert shard_blocker(Settings()) is None
    check_requested_shards(Settings(ps_shards=2), hosted_by=2)
    with pytest.raises(ConfigError, match=r"`ps_shards` must be at most num_workers=2 under Spark Connect.*"
                                          r"received ps_shards=3"):
        check_requested_shards(Settings(ps_shards=3), hosted_by=2)
    check_requested_shards(Settings(ps_shards=3))  # the driver hosts any number
    assert decide_shards(None, 40_000_000, 64, 2.0) == 3
    assert decide_shards(None, 40_000_000, 64, 2.0, hosted=True) == 3
    assert decide_shards(None, 40_000_000, 2, 0.05, hosted=True) == 2  # capped at the workers
    assert decide_shards(None, 40_000_000, 2, 0.05) > 2


# ------------------------------------------------------------------ decision
@pytest.mark.parametrize("requested, model_bytes, workers, interval, blocked, expected", [
    (None, 30_000, 2, 0.05, None, 1),  # the digits MLP: small models get one shard
    (None, 4_000_000, 8, 0.5, None, 1),
    (None, 40_000_000, 64, 2.0, None, 3),  # choose_shards' documented example
    (None, 40_000_000, 64, 2.0, "norm_guard=10 ...", 1),  # blocked: one shard whatever the size
    (2, 30_000, 2, 0.05, None, 2),  # the user's ps_shards wins
    (1, 40_000_000, 64, 2.0, None, 1),
])
def test_decide_shards(requested, model_bytes, workers, interval, blocked, expected):
    assert decide_shards(requested, model_bytes, workers, interval, blocked) == expected


def test_the_plan_records_the_decision_and_its_inputs():
    model = tiny_model()
    plan = plan_fit(Settings(), model, 2, 32, samples=1000)
    choice = plan.shard_choice
    assert plan.ps_shards == 1 and choice.requested is None and choice.blocked is None
    assert choice.model_bytes == 8 * 4 and choice.num_workers == 2 and choice.commit_interval > 0
    assert plan.as_dict()["ps_shards"] == 1 and plan.as_dict()["shard_choice"]["model_bytes"] == 32
    assert "decided by choose_shards" in choice.describe()
    assert plan_fit(Settings(ps_shards=2), model, 2, 32, samples=1000).ps_shards == 2
    guarded = plan_fit(Settings(norm_guard=10.0), model, 2, 32, samples=1000).shard_choice
    assert guarded.shards == 1 and "norm_guard" in guarded.blocked and "one shard: norm_guard" in guarded.describe()
    hosted = plan_fit(Settings(ps_shards=2), model, 2, 32, samples=1000, hosted=True)
    assert hosted.ps_shards == 2 and hosted.as_dict()["ps_placement"] == "executors"
    assert plan.as_dict()["ps_placement"] == "driver"
    with pytest.raises(ConfigError, match="under Spark Connect"):
        plan_fit(Settings(ps_shards=3), model, 2, 32, samples=1000, hosted=True)


def test_the_commit_interval_follows_the_window():
    model = tiny_model()
    short = plan_fit(Settings(frequency=1), model, 2, 32, samples=1000).shard_choice.commit_interval
    long = plan_fit(Settings(frequency=8), model, 2, 32, samples=1000).shard_choice.commit_interval
    per_pass = plan_fit(Settings(frequency="epoch"), model, 2, 32, samples=1000).shard_choice.commit_interval
    unknown = plan_fit(Settings(frequency="epoch"), model, 2, 32).shard_choice.commit_interval
    assert short < long < per_pass and unknown == 2.0


# ------------------------------------------------------------------- facade
def center0():
    rng = np.random.default_rng(1)
    return [rng.normal(size=s).astype(np.float64 if i == 4 else np.float32) for i, s in enumerate(SHAPES)]


def _commits(store, start, count, workers=2, run=RUN):
    """``count`` deterministic commits to ``store``, round robin over the workers, each from a fresh pull."""
    client = _client(store)
    try:
        for n in range(start, start + count):
            w = n % workers
            reply = client.pull(w, epoch=0)
            rng = np.random.default_rng(n)
            tensors = [(0.1 * rng.normal(size=c.shape)).astype(c.dtype) for c in reply.center]
            client.commit(CommitKey(run, 0, w, n), 5, Commit(tensors, 1, 4, reply.clock))
    finally:
        client.close()


def _client(store):
    """The client a task would have: a ShardedClient over the shards (in process), else one store's."""
    if isinstance(store, ShardedStore):
        return ShardedClient([InProcessClient(s) for s in store.shards], store.plan)
    return InProcessClient(store)


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


@pytest.mark.parametrize("rule", ["downpour", "delayednesterov", "dcasgd"])
@pytest.mark.parametrize("shards", [2, 3])
def test_a_sharded_store_gives_one_store_s_center_snapshot_and_rollback(rule, shards):
    one = make_store(center0(), get(rule), "asynchronous", 2, RUN)
    many = make_store(center0(), get(rule), "asynchronous", 2, RUN, shards=shards)
    assert isinstance(one, Store) and isinstance(many, ShardedStore) and many.num_shards == shards
    _same(one.template, many.template)
    start_one, start_many = one.snapshot(), many.snapshot()
    assert isinstance(start_many, ShardedSnapshot) and len(start_many.state) == shards
    for store in (one, many):
        _commits(store, 0, 6)
    _same(one.center(), many.center())
    assert one.clock == many.clock == 6 and many.ledger() == one.ledger()
    assert all(ledger == one.ledger() for ledger in many.shard_ledgers())
    assert many.samples_applied == one.samples_applied == 24
    assert one.rollback(start_one, RUN + "t1") == many.rollback(start_many, RUN + "t1") == 6
    _same(many.center(), center0())
    assert many.run == RUN + "t1" and all(s.run == RUN + "t1" for s in many.shards)
    for store in (one, many):  # the epoch trains again under the new run id, as after a failed epoch
        _commits(store, 10, 4, run=RUN + "t1")
    _same(one.center(), many.center())
    with pytest.raises(ConfigError, match="needs a ShardedSnapshot"):
        many.rollback(start_one, RUN + "t2")


def test_the_metrics_merge_shard_0_s_counters_and_sum_the_bytes():
    one = make_store(center0(), get("downpour"), "asynchronous", 2, RUN)
    many = make_store(center0(), get("downpour"), "asynchronous", 2, RUN, shards=2)
    for store in (one, many):
        _commits(store, 0, 5)
    many.shards[0].count_bytes(100, 10)
    many.shards[1].count_bytes(50, 5)
    mine, theirs = many.metrics(), one.metrics()
    for name in ("commits_applied", "samples_applied", "pulls", "replays_dropped", "staleness", "staleness_mean",
                 "clock", "run", "mode", "epochs_rolled_back"):
        assert mine[name] == theirs[name], name
    assert mine["bytes_in"] == 150 and mine["bytes_out"] == 15
    assert [m["bytes_in"] for m in mine["shards"]] == [100, 50]


@pytest.mark.parametrize("rule", ["delayednesterov", "downpour"])
def test_a_learning_rate_change_reaches_every_shard(rule):
    one = make_store(center0(), get(rule), "asynchronous", 1, RUN)
    many = make_store(center0(), get(rule), "asynchronous", 1, RUN, shards=2)
    for store in (one, many):
        _commits(store, 0, 3, workers=1)
        store.learning_rate_changed(0.5)
        _commits(store, 3, 3, workers=1)
    _same(one.center(), many.center())


def test_a_backup_of_a_sharded_fit_restores_the_full_center_and_every_shard_s_state(tmp_path):
    import keras

    model = tiny_model()
    model.optimizer.build(model.trainable_variables)
    weights = model.get_weights()  # kernel (3, 2) and bias (2,)
    rule = get("delayednesterov")
    store = make_store(weights, rule, "asynchronous", 2, RUN, shards=2)
    reference = make_store(weights, rule, "asynchronous", 2, RUN)
    for s in (store, reference):
        _commits(s, 0, 4)
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "b"))
    save_backup(model, "asynchronous", backup, store, rule, 2, 3, {"loss": [1.0, 0.5, 0.4]}, shards=2)
    saved = checkpoint.load(backup.backup_dir)
    assert saved.rule == dict(rule_identity("asynchronous", rule, 2), shards=2)
    _same(saved.center, store.center())

    fresh = tiny_model()
    resume = resume_from_backup(fresh, "asynchronous", backup, rule, 2, 0, shards=2)
    epoch, state, history = resume.initial_epoch, resume.rule_state, resume.history
    assert epoch == 3 and history["loss"] == [1.0, 0.5, 0.4] and len(state) == 2
    _same(fresh.get_weights(), store.center())
    resumed = make_store(fresh.get_weights(), rule, "asynchronous", 2, RUN + "b", shards=2, state=state)
    for a, b in zip(resumed.snapshot().state, store.snapshot().state):
        assert pickle.dumps(a) == pickle.dumps(b)
    # the resumed shards go on as the saved ones, and as one store would
    resumed_one = make_store(fresh.get_weights(), rule, "asynchronous", 2, RUN + "b",
                             state=reference.snapshot().state)
    for s in (resumed, resumed_one):
        _commits(s, 20, 4, run=RUN + "b")
    _same(resumed.center(), resumed_one.center())

    # another number of shards (or none) does not take the shards' states: the rule starts afresh
    assert resume_from_backup(tiny_model(), "asynchronous", backup, rule, 2, 0, shards=3).rule_state is None
    assert resume_from_backup(tiny_model(), "asynchronous", backup, rule, 2, 0).rule_state is None


def test_an_unsharded_backup_keeps_its_identity(tmp_path):
    import keras

    rule = get("delayednesterov")
    assert "shards" not in rule_identity("asynchronous", rule, 2)  # backups of before shards still match
    model = tiny_model()
    store = make_store(model.get_weights(), rule, "asynchronous", 2, RUN)
    _commits(store, 0, 2)
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "b"))
    save_backup(model, "asynchronous", backup, store, rule, 2, 1, {})
    state = resume_from_backup(tiny_model(), "asynchronous", backup, rule, 2, 0).rule_state
    assert pickle.dumps(state) == pickle.dumps(store.snapshot().state)


def test_make_store_keeps_one_shard_the_plain_store_and_refuses_what_cannot_shard():
    assert type(make_store(center0(), get("downpour"), "asynchronous", 2, RUN, norm_guard=5.0)) is Store
    with pytest.raises(ConfigError, match="norm_guard"):
        make_store(center0(), get("downpour"), "asynchronous", 2, RUN, shards=2, norm_guard=5.0)
    with pytest.raises(ConfigError, match="use fewer shards; received shards=9"):
        make_store([np.zeros(2, np.float32)], get("downpour"), "asynchronous", 2, RUN, shards=9)
    sharded = make_store(center0(), get("downpour"), "asynchronous", 2, RUN, shards=2)
    with pytest.raises(TypeError, match="cannot be pickled into a Spark task"):
        pickle.dumps(sharded)
    sharded.close()
    assert all(s.metrics()["run"] == RUN for s in sharded.shards)


# ------------------------------------------------------------- the task's side
def test_the_plan_travels_as_plain_data():
    plan = plan_shards(center0(), 3)
    data = plan.as_data()
    assert ShardPlan.from_data(data) == plan
    assert ShardPlan.from_data(pickle.loads(pickle.dumps(data))) == plan
    assert len(pickle.dumps(data)) < 1000
    with pytest.raises(ConfigError, match="must be a shard plan's as_data"):
        ShardPlan.from_data({"shapes": [[2]]})


def test_connect_shards_gives_today_s_client_for_one_url_and_a_sharded_one_for_more():
    one = connect_shards(["http://127.0.0.1:1"], "tok", None, read_timeout=3.0)
    assert type(one) is PSClient
    one.close()
    plan = plan_shards(center0(), 2)
    with connect_shards(["http://127.0.0.1:1", "http://127.0.0.1:2"], "tok", plan.as_data()) as many:
        assert isinstance(many, ShardedClient) and many.plan == plan
    with pytest.raises(ConfigError, match="2 shard urls need the shard plan; received plan=None"):
        connect_shards(["http://127.0.0.1:1", "http://127.0.0.1:2"], "tok")
    with pytest.raises(ConfigError, match="received none"):
        connect_shards([], "tok")


def test_a_task_spec_with_shards_stays_small_and_picklable():
    plan = plan_shards(center0(), 2)
    spec = TaskSpec(run=RUN, epoch=0, model_bytes=b"", fingerprint="", optimizer=Downpour(), window=1, batch_size=8,
                    mode="asynchronous", ps_url="http://a:1", token="t", read_timeout=1.0,
                    ps_urls=("http://a:1", "http://a:2"), shard_plan=plan.as_data())
    again = pickle.loads(pickle.dumps(spec))
    assert again.shard_urls == ("http://a:1", "http://a:2") and ShardPlan.from_data(again.shard_plan) == plan
    plain = TaskSpec(run=RUN, epoch=0, model_bytes=b"", fingerprint="", optimizer=Downpour(), window=1, batch_size=8,
                     mode="asynchronous", ps_url="http://a:1", token="t", read_timeout=1.0)
    assert plain.shard_urls == ("http://a:1",) and plain.shard_plan is None


def test_the_fit_s_decision_does_not_warn_about_a_short_window_shards_cannot_help(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="elephant.ps.shards"):
        assert decide_shards(None, 30_000, 2, 0.003) == 1  # the digits MLP committing every step: ~650 commits/s
    assert [r.levelno for r in caplog.records if "commit less often" in r.getMessage()] == [logging.INFO]


class _LostServer:
    """A sharded store whose shard died with the fit: its final metrics cannot be read."""

    def metrics(self):
        raise PSError("shard 1 of 2 (127.0.0.1:1) is gone")

    ledger = metrics


def test_a_failing_fit_keeps_its_own_error_when_the_servers_record_is_lost():
    from types import SimpleNamespace

    from elephant.fit.loop import _keep_server_record

    report = SimpleNamespace(metrics=None, ledger=None)
    _keep_server_record(report, _LostServer(), failing=True)  # logged; the fit's own error propagates
    assert report.metrics is None and report.ledger is None
    with pytest.raises(PSError, match="is gone"):  # a fit that succeeded must not hide a lost record
        _keep_server_record(report, _LostServer())
