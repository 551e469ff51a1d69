"""SparkModel(ps_shards=2): a classic fit served by two shards trains as one server does, and fails as safely.

Every fit here records its driver-side store (``make_store`` wrapped), so the
tests read each shard's ledger and counters, not only the merged ones. The
shards serve from processes of their own (the fit's default for ``S > 1``);
one test also runs them in the driver's threads (``SHARDS_IN_PROCESSES``).
"""

import logging
from collections import Counter

import numpy as np
import pytest

from elephant import SparkModel
from elephant.fit import classic
from elephant.ps import sharded_store

from .helpers import accuracy, digits_model, worker_windows
from .test_failures import _port_is_free

EPOCHS = 6


@pytest.fixture
def stores(monkeypatch):
    """The stores the fits of a test made, in order."""
    made = []
    original = sharded_store.make_store

    def recording(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(sharded_store, "make_store", recording)
    return made


def _ports_free(sm):
    return all(_port_is_free(int(url.rsplit(":", 1)[1].split("/")[0])) for url in sm.last_report.ps_urls)


def _once_per_shard(store):
    """Every shard applied the same commits, each once, in the same order as shard 0 (one at a time here)."""
    ledgers = store.shard_ledgers()
    keys = [tuple(k) for k, _ in ledgers[0]]
    assert keys and not [k for k, c in Counter(keys).items() if c > 1]
    for ledger in ledgers[1:]:
        assert sorted(tuple(k) for k, _ in ledger) == sorted(keys)
    return keys


def _process_urls(caplog):
    """The URLs that shard processes reported ready in the log records so far (elephant.ps.shard_process)."""
    return [r.getMessage() for r in caplog.records if "shard processes ready" in r.getMessage()]


@pytest.mark.parametrize("mode", ["asynchronous", "synchronous"])
def test_two_shards_train_as_one_server(spark, digits, stores, mode, caplog):
    x_train, x_test, y_train, y_test = digits
    found = {}
    for shards in (1, 2):
        sm = SparkModel(digits_model(), mode=mode, num_workers=2, ps_shards=shards, spark=spark)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="elephant.ps.shard_process"):
            history = sm.fit(x_train, y_train, epochs=EPOCHS, batch_size=32, verbose=0)
        ready = _process_urls(caplog)
        assert len(ready) == (shards > 1) and all(url in ready[0] for url in sm.last_report.ps_urls[1:])
        assert sm.fit_plan["ps_shards"] == shards and sm.fit_plan["shard_choice"]["requested"] == shards
        assert len(sm.last_report.ps_urls) == shards and sm.ps_url == sm.last_report.ps_urls[0]
        assert history.history["loss"][-1] < history.history["loss"][0]
        assert _ports_free(sm)
        found[shards] = accuracy(sm.model, x_test, y_test), sm.last_metrics
    store = stores[-1]
    assert isinstance(store, sharded_store.ShardedStore) and store.num_shards == 2
    keys = _once_per_shard(store)
    metrics = found[2][1]
    applied = "rounds_applied" if mode == "synchronous" else "commits_applied"
    assert [m[applied] for m in metrics["shards"]] == [metrics[applied]] * 2 and len(keys) == metrics["commits_applied"]
    (one, _), (two, _) = found[1], found[2]
    assert one > 0.85 and two > 0.85, found  # the digits MLP after 6 epochs: 0.9-0.97
    assert abs(one - two) < 0.06, found


@pytest.mark.parametrize("processes", [True, False], ids=["processes", "threads"])
def test_one_worker_trains_the_same_bytes_through_two_shards(spark, digits, stores, monkeypatch, processes):
    """Deterministic: one worker, no shuffle, synchronous rounds; the shards' slices join to the same center."""
    monkeypatch.setattr(classic, "SHARDS_IN_PROCESSES", processes)
    x_train, _, y_train, _ = digits
    weights = {}
    for shards in (1, 2):
        sm = SparkModel(digits_model(), mode="synchronous", frequency=4, num_workers=1, ps_shards=shards,
                        spark=spark)
        sm.fit(x_train, y_train, epochs=2, batch_size=32, shuffle=False, verbose=0)
        weights[shards] = sm.model.get_weights()
    assert stores[-1].plan.num_shards == 2
    for a, b in zip(weights[1], weights[2], strict=True):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    assert any((a != b).any() for a, b in zip(weights[1], digits_model().get_weights()))


def test_compressed_commits_train_the_same_bytes_through_two_shards(spark, digits, stores):
    """int8 commits with error feedback: each shard decodes its slice (cut at block ends) as one server would."""
    x_train, _, y_train, _ = digits
    rule = {"name": "compressed", "config": {"inner": "modelaveraging", "codec": "int8", "block": 256}}
    weights = {}
    for shards in (1, 2):
        sm = SparkModel(digits_model(), mode="synchronous", frequency=4, num_workers=1, ps_shards=shards,
                        optimizer=rule, spark=spark)
        sm.fit(x_train, y_train, epochs=2, batch_size=32, shuffle=False, verbose=0)
        assert sm.fit_plan["ps_shards"] == shards
        weights[shards] = sm.model.get_weights()
    plan = stores[-1].plan
    assert plan.num_shards == 2 and plan.codec is not None
    assert any(p.rows is not None for pieces in plan.shards for p in pieces)  # a tensor was cut, at a block end
    for a, b in zip(weights[1], weights[2], strict=True):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    assert any((a != b).any() for a, b in zip(weights[1], digits_model().get_weights()))


def test_a_failed_synchronous_epoch_rolls_every_shard_back_and_trains_again(spark, digits, stores, tmp_path,
                                                                          monkeypatch):
    x_train, _, y_train, _ = digits
    marker = tmp_path / "fired"
    monkeypatch.setenv("ELEPHANT_FAULT", f"partition=1,step=4,kind=raise,marker={marker}")  # once, in epoch 1
    sm = SparkModel(digits_model(lr=3e-3), mode="synchronous", frequency=2, num_workers=2, ps_shards=2, spark=spark)
    history = sm.fit(x_train, y_train, epochs=2, batch_size=32, verbose=0)
    assert marker.exists(), "the fault never fired"
    store = stores[-1]
    for shard in sm.last_metrics["shards"]:
        assert shard["epochs_rolled_back"] == 1 and shard["commits_rolled_back"] >= 2
    keys = _once_per_shard(store)
    assert len(keys) == 2 * sum(worker_windows(sm, len(x_train), 2))  # every (epoch, partition, window) once
    run = sm.job_group.removeprefix("elephant-")
    assert {k[0] for k in keys if k[1] == 0} == {run + ".e0t1"}  # epoch 1 as trained again
    assert all(s.run == store.run for s in store.shards)
    assert len(history.history["loss"]) == 2 and all(np.isfinite(history.history["loss"]))
    assert _ports_free(sm)


def test_a_retried_task_applies_its_commits_once_on_every_shard(spark, digits, stores, tmp_path, monkeypatch):
    x_train, _, y_train, _ = digits
    marker = tmp_path / "fired"
    monkeypatch.setenv("ELEPHANT_FAULT", f"partition=1,step=6,kind=raise,marker={marker}")
    sm = SparkModel(digits_model(), mode="asynchronous", frequency=2, num_workers=2, ps_shards=2, spark=spark)
    sm.fit(x_train, y_train, epochs=1, batch_size=32, verbose=0)
    assert marker.exists(), "the fault never fired"
    keys = _once_per_shard(stores[-1])
    for shard in sm.last_metrics["shards"]:  # the first attempt's commits (steps 0-2) came again to every shard
        assert shard["replays_dropped"] >= 3
    attempts = {entry[1] for entry in sm.last_ledger if entry[0][2] == 1}
    assert len(attempts) == 2
    assert len(keys) == 2 * worker_windows(sm, len(x_train), 2)[0]  # every window applied once, on every shard
    assert _ports_free(sm)


def test_shards_on_the_executors_train_the_same_bytes_as_on_the_driver(spark, digits, stores):
    """One epoch of two workers' synchronous rounds: the same center wherever the server and its shards run.

    At the compiled rate (``sqrt_scaling=False``): where the workers' rate is scaled a driver-hosted fit's driver
    trains the first epoch's first steps (its head), which the executors' servers do not."""
    x_train, _, y_train, _ = digits
    weights, plans = {}, {}
    rule = {"name": "modelaveraging", "config": {"sqrt_scaling": False}}
    for where, shards in (("driver", 1), ("driver", 2), ("executors", 1), ("executors", 2)):
        sm = SparkModel(digits_model(), mode="synchronous", frequency=4, num_workers=2, ps_shards=shards,
                        ps_placement=where, optimizer=rule, spark=spark)
        sm.fit(x_train, y_train, epochs=1, batch_size=32, verbose=0)
        weights[where, shards] = sm.model.get_weights()
        plans[where, shards] = (sm.fit_plan["ps_placement"], sm.fit_plan["ps_shards"])
        assert bool(sm.last_report.ps_urls) == (where == "driver")  # the tasks' servers are not the driver's
    assert all(plan == key for key, plan in plans.items()) and len(plans) == 4
    for key, found in weights.items():
        for a, b in zip(weights["driver", 1], found, strict=True):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), key
    assert any((a != b).any() for a, b in zip(weights["driver", 1], digits_model().get_weights()))


def test_a_failed_shard_host_rolls_the_epoch_back_on_every_shard(spark, digits, stores, tmp_path, monkeypatch):
    """Asynchronous, shards in the tasks: the task hosting shard 1 fails once; the epoch is trained again."""
    x_train, x_test, y_train, y_test = digits
    marker = tmp_path / "fired"
    monkeypatch.setenv("ELEPHANT_FAULT", f"partition=1,step=4,kind=raise,marker={marker}")  # once, in epoch 1
    sm = SparkModel(digits_model(lr=3e-3), mode="asynchronous", frequency=2, num_workers=2, ps_shards=2,
                    ps_placement="executors", spark=spark)
    history = sm.fit(x_train, y_train, epochs=2, batch_size=32, verbose=0)
    assert marker.exists(), "the fault never fired"
    assert sm.last_metrics["epochs_rolled_back"] == 1
    keys = _once_per_shard(stores[-1])
    assert len(keys) == 2 * sum(worker_windows(sm, len(x_train), 2))  # every (epoch, partition, window) once
    assert len(history.history["loss"]) == 2 and history.history["loss"][1] < history.history["loss"][0]
    assert accuracy(sm.model, x_test, y_test) > 0.8


def test_shards_on_the_executors_need_every_worker_at_once_and_a_task_each(spark, digits):
    from elephant.errors import ConfigError

    x_train, _, y_train, _ = digits
    with pytest.raises(ConfigError, match=r"`ps_shards` must be at most num_workers=2.*received ps_shards=3"):
        SparkModel(digits_model(), num_workers=2, ps_shards=3, ps_placement="executors",
                   spark=spark).fit(x_train, y_train, epochs=1, verbose=0)
    with pytest.raises(ConfigError, match=r"ps_placement='executors' runs all workers at once.*num_workers=3"):
        SparkModel(digits_model(), num_workers=3, ps_placement="executors",
                   spark=spark).fit(x_train, y_train, epochs=1, verbose=0)


class _Crash(Exception):
    pass


def test_a_sharded_fit_resumes_every_shard_from_its_backup(spark, digits, stores, tmp_path, caplog):
    import logging

    import keras

    from elephant import checkpoint

    x_train, _, y_train, _ = digits
    backup_dir = str(tmp_path / "backup")

    def crash_after_second_epoch(epoch, logs):
        if epoch == 1:
            raise _Crash()  # after BackupAndRestore's place: epoch 2's backup is written

    sm = SparkModel(digits_model(), mode="synchronous", num_workers=2, ps_shards=2, spark=spark)
    with pytest.raises(_Crash):
        sm.fit(x_train, y_train, epochs=3, batch_size=32, verbose=0,
               callbacks=[keras.callbacks.BackupAndRestore(backup_dir),
                          keras.callbacks.LambdaCallback(on_epoch_end=crash_after_second_epoch)])
    saved = checkpoint.load(backup_dir)
    assert saved.epochs_done == 2 and saved.rule["shards"] == 2 and len(saved.rule_state) == 2
    crashed = stores[-1]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(saved.center, crashed.center(), strict=True))

    resumed = SparkModel(digits_model(seed=5), mode="synchronous", num_workers=2, ps_shards=2, spark=spark)
    with caplog.at_level(logging.INFO, logger="elephant.fit.backup"):
        history = resumed.fit(x_train, y_train, epochs=3, batch_size=32, verbose=0,
                              callbacks=[keras.callbacks.BackupAndRestore(backup_dir)])
    assert history.epoch == [2]
    messages = [r.getMessage() for r in caplog.records]
    assert any("resuming from the backup" in m for m in messages)
    assert not any("without the rule's saved server state" in m for m in messages)  # every shard's state restored
    store = stores[-1]
    assert store is not crashed and store.num_shards == 2
    assert store.metrics()["rounds_applied"] > 0 and _ports_free(resumed)


def test_compressed_replies_through_two_shards_survive_a_rolled_back_epoch(spark, digits, stores, tmp_path,
                                                                          monkeypatch):
    """int8 replies (each round's change of the workers' view) from two shard processes, with a failed task."""
    x_train, x_test, y_train, y_test = digits
    found = {}
    for replies in (False, True):
        rule = {"name": "compressed", "config": {"inner": "modelaveraging", "codec": "int8", "replies": replies}}
        marker = tmp_path / f"fired-{replies}"
        if replies:  # once, in the first epoch: the epoch is rolled back and every worker starts from a fresh view
            monkeypatch.setenv("ELEPHANT_FAULT", f"partition=1,step=6,kind=raise,marker={marker}")
        sm = SparkModel(digits_model(), mode="synchronous", frequency=2, num_workers=2, ps_shards=1 + replies,
                        optimizer=rule, spark=spark)
        sm.fit(x_train, y_train, epochs=3, batch_size=32, verbose=0)
        metrics = sm.last_metrics
        found[replies] = accuracy(sm.model, x_test, y_test), metrics["bytes_out"]
        if replies:
            assert marker.exists(), "the fault never fired"
            assert all(shard["epochs_rolled_back"] == 1 for shard in metrics["shards"])
            _once_per_shard(stores[-1])
    (dense, dense_bytes), (small, small_bytes) = found[False], found[True]
    assert dense > 0.85 and small > 0.85 and abs(dense - small) < 0.05, found
    assert dense_bytes / small_bytes > 2.5, found  # int8 replies: 3.9x smaller, less the rolled-back epoch's
