"""A task trains its partition as a stream of blocks through the shuffle buffer (elephant.worker, elephant.stream)."""

import dataclasses
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from elephant import backends, stream, worker  # noqa: E402
from elephant import data as D  # noqa: E402
from elephant.config import FitArgs  # noqa: E402
from elephant.errors import ConfigError, DataError  # noqa: E402
from elephant.fit import head as H  # noqa: E402
from tests.unit.test_fit_head import _data  # noqa: E402
from tests.unit.test_fit_head import _task as _head_task  # noqa: E402


def _task(run, skip_steps=2, **given):
    """A first-epoch task (batches of 4, windows of 2; after a head of ``skip_steps``) and its recording client."""
    spec, client = _head_task(run, **given)
    return dataclasses.replace(spec, skip_steps=skip_steps), client


def _blocks(x, y, sizes):
    bounds = np.cumsum([0, *sizes])
    return [(x[a:b], y[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _trained(monkeypatch):
    """The features of every batch the stepper trains, in order."""
    seen = []
    step = backends.Stepper.step
    monkeypatch.setattr(backends.Stepper, "step", lambda self, batch: (seen.append(np.array(batch[0])),
                                                                       step(self, batch))[1])
    return seen


class _Counted:
    """An iterable of blocks that records how many of them have been read."""

    def __init__(self, blocks):
        self.blocks, self.read = blocks, 0

    def __iter__(self):
        for block in self.blocks:
            self.read += 1
            yield block


def test_a_task_trains_its_blocks_in_the_stream_order_of_its_buffer_and_a_retry_replays_it(monkeypatch):
    x, y = _data(60)
    sizes = [7, 13, 5, 11, 9, 15]
    spec, client = _task("stream", shuffle_key="key", skip_steps=0, shuffle_buffer=16, partition_samples=(0, 60))
    order = stream.stream_order(sizes, 16, stream.shuffle_seed("key", 0, 1))
    assert sorted(order) == list(range(60)) and not np.array_equal(order, np.arange(60))
    trained = _trained(monkeypatch)
    (stats,) = worker.run_partition(spec, 1, 1, _blocks(x, y, sizes), client)
    np.testing.assert_array_equal(np.concatenate(trained), x[order])
    assert stats["samples"] == 60 and stats["steps"] == 15 and stats["weight_sum"] == 60
    assert stats["peak_rss"] > 0
    first = np.concatenate(trained)
    trained.clear()
    spec, client = _task("stream", shuffle_key="key", skip_steps=0, shuffle_buffer=16, partition_samples=(0, 60))
    worker.run_partition(spec, 1, 2, _blocks(x, y, sizes), client)  # a retry reads the same blocks
    np.testing.assert_array_equal(np.concatenate(trained), first)


def test_a_small_buffer_starts_training_before_the_partition_is_read(monkeypatch):
    x, y = _data(80)
    blocks = _Counted(_blocks(x, y, [10] * 8))
    read_at_first_step = []
    step = backends.Stepper.step
    monkeypatch.setattr(backends.Stepper, "step", lambda self, batch: (read_at_first_step.append(blocks.read),
                                                                       step(self, batch))[1])
    spec, client = _task("lazy", shuffle_key="key", skip_steps=0, shuffle_buffer=20, partition_samples=(80,))
    worker.run_partition(spec, 0, 1, blocks, client)
    assert read_at_first_step[0] == 2 and blocks.read == 8  # two blocks fill the buffer; all are read in the end


def test_a_whole_partition_buffer_trains_the_full_shuffle_of_todays_order(monkeypatch):
    x, y = _data(30)
    trained = _trained(monkeypatch)
    spec, client = _task("whole", shuffle_key="key", skip_steps=0, partition_samples=(30,))
    worker.run_partition(spec, 0, 1, _blocks(x, y, [4, 20, 6]), client)
    np.testing.assert_array_equal(np.concatenate(trained), x[stream.shuffle_order("key", 0, 0, 30)])


def test_unshuffled_blocks_are_trained_as_read_in_batches_across_blocks(monkeypatch):
    x, y = _data(23)
    trained = _trained(monkeypatch)
    spec, client = _task("plain", shuffle=False, skip_steps=0, shuffle_buffer=5, partition_samples=(23,))
    (stats,) = worker.run_partition(spec, 0, 1, _blocks(x, y, [3, 9, 11]), client)
    assert [len(b) for b in trained] == [4, 4, 4, 4, 4, 3]
    np.testing.assert_array_equal(np.concatenate(trained), x)
    assert stats["steps"] == 6


@pytest.mark.parametrize("sizes, found", [([10, 10, 5], "25"), ([10, 10, 10, 10], "more than 30")])
def test_a_partition_that_changed_since_it_was_counted_fails_its_task(sizes, found):
    x, y = _data(40)
    spec, client = _task("changed", shuffle_key="key", skip_steps=0, shuffle_buffer=8, partition_samples=(30,))
    with pytest.raises(DataError, match=f"partition 0 holds {found} rows in epoch 1, but held 30 when the fit "
                                        "counted them: its source is not deterministic"):
        worker.run_partition(spec, 0, 1, _blocks(x, y, sizes), client)


def test_without_counts_a_task_counts_its_partition_itself(monkeypatch):
    x, y = _data(21)
    trained = _trained(monkeypatch)
    spec, client = _task("uncounted", shuffle_key="key", skip_steps=0)
    (stats,) = worker.run_partition(spec, 0, 1, iter(_blocks(x, y, [9, 12])), client)
    assert stats["samples"] == 21 and len(np.concatenate(trained)) == 21


def test_the_heads_rows_and_the_tasks_rows_split_the_stream_of_a_small_buffer(monkeypatch):
    x, y = _data(50)
    sizes = [12, 6, 14, 8, 10]
    order = stream.stream_order(sizes, 10, stream.shuffle_seed("key", 0, 2))
    ((partition, head),) = H.partition_head("key", 0, 2, 4, buffer=10)(2, iter(_blocks(x, y, sizes)))
    assert partition == 2
    np.testing.assert_array_equal(head[0], x[order[:8]])
    trained = _trained(monkeypatch)
    spec, client = _task("split", shuffle_key="key", shuffle_buffer=10, partition_samples=(0, 0, 50))
    (stats,) = worker.run_partition(spec, 2, 1, _blocks(x, y, sizes), client)
    np.testing.assert_array_equal(np.concatenate(trained), x[order[8:]])
    assert stats["steps"] == 11 and stats["samples"] == 50


def test_the_head_reads_no_block_past_its_rows():
    x, y = _data(40)
    blocks = _Counted(_blocks(x, y, [10] * 4))
    ((_, head),) = H.partition_head(None, 0, 2, 4)(0, blocks)
    np.testing.assert_array_equal(head[0], x[:8])
    assert blocks.read == 1


def test_one_block_shuffled_through_a_small_buffer_is_the_simulators_order():
    x = np.arange(37)
    seed = stream.shuffle_seed("key", 3, 1)
    (streamed,) = [np.concatenate([b[0] for b in stream.pass_blocks([(x, x)], "key", 3, 1, 10)])]
    np.testing.assert_array_equal(streamed, stream.pass_order("key", 3, 1, 37, buffer=10))
    np.testing.assert_array_equal(stream.pass_order("key", 3, 1, 37, buffer=37), stream.shuffle_order("key", 3, 1, 37))
    np.testing.assert_array_equal(stream.pass_order("key", 3, 1, 37, buffer=10), stream.stream_order([37], 10, seed))


def test_the_default_buffer_holds_the_default_bytes_of_samples():
    assert stream.buffer_samples(None, 512.0) == stream.BUFFER_BYTES // 512
    assert stream.buffer_samples(None, 4 * stream.BUFFER_BYTES) == 1  # a sample bigger than the buffer: one
    assert stream.buffer_samples(1000, 512.0) == 1000
    assert "shuffled whole" in stream.describe_buffer(100, (40, 60), 512.0)
    line = stream.describe_buffer(50, (40, 60), 512.0)
    assert "streamed through a shuffle buffer of 50 samples" in line and "docs/data.md" in line


@pytest.mark.parametrize("bad", [0, -5, 2.5, "1MB", True])
def test_a_bad_shuffle_buffer_is_refused_by_name(bad):
    with pytest.raises(ConfigError, match=f"`shuffle_buffer` must be a positive int; received shuffle_buffer={bad!r}"):
        FitArgs(shuffle_buffer=bad)


def test_blocks_stream_as_they_are_and_a_summary_reads_them_once():
    x, y = _data(12)
    blocks = [(x[:5], y[:5]), (x[5:5], y[5:5]), (x[5:], y[5:])]
    assert [len(b[0]) for b in D.checked_blocks(blocks)] == [5, 7]  # empty blocks are dropped
    with pytest.raises(DataError, match="mixes blocks with and without sample weights"):
        list(D.checked_blocks([(x, y), (x, y, np.ones(12))]))
    rows, shapes, size = D.stream_summary(iter(blocks))
    assert rows == 12 and shapes == [(3,)] and size == D.row_bytes((x, y)) == 3 * 4 + 2 * 4
    assert D.stream_summary(iter([])) == (0, [], 0.0)


def test_skip_and_first_rows_cut_a_stream_across_blocks():
    x, y = _data(10)
    blocks = _blocks(x, y, [3, 4, 3])
    np.testing.assert_array_equal(np.concatenate([b[0] for b in stream.skip_rows(blocks, 5)]), x[5:])
    np.testing.assert_array_equal(stream.first_rows(blocks, 5)[0], x[:5])
    assert stream.first_rows(blocks, 0) is None and len(stream.first_rows(blocks, 50)[0]) == 10


def test_the_training_data_are_cached_memory_first_unless_told():
    from pyspark import StorageLevel

    from elephant.fit.classic import cache_level

    assert cache_level(None) == StorageLevel.MEMORY_AND_DISK
    assert cache_level(False) is None and cache_level(StorageLevel.DISK_ONLY) == StorageLevel.DISK_ONLY
    assert FitArgs(cache=StorageLevel.MEMORY_ONLY).cache == StorageLevel.MEMORY_ONLY
    with pytest.raises(ConfigError, match=r"`cache` must be a pyspark StorageLevel, None \(the default, "
                                          r"StorageLevel.MEMORY_AND_DISK\) or False .*received cache='memory'"):
        FitArgs(cache="memory")


@pytest.mark.parametrize("window, warmup", [(2, None), (3, 1), (None, None), (5, 2)])
def test_committed_steps_follow_the_windows_a_task_commits(window, warmup):
    x, y = _data(50)
    spec, client = _task("windows", skip_steps=0, shuffle=False, partition_samples=(50,))
    spec = dataclasses.replace(spec, window=window, warmup_window=warmup)
    worker.run_partition(spec, 0, 1, [(x, y)], client)
    carried = np.cumsum([c[1] for c in client.commits])  # each commit's steps, as the task sent them
    for c, steps in enumerate(carried, start=1):
        assert worker.committed_steps(window, warmup, c, 13) == steps
    assert worker.committed_steps(window, warmup, 0, 13) == 0 and carried[-1] == 13


def test_a_resumed_task_trains_the_rest_of_its_pass_in_order(monkeypatch):
    x, y = _data(40)
    order = stream.pass_order("key", 0, 1, 40)
    trained = _trained(monkeypatch)
    spec, client = _task("resumed", shuffle_key="key", skip_steps=2, resume_steps=(0, 3), partition_samples=(0, 40))
    (stats,) = worker.run_partition(spec, 1, 1, [(x, y)], client)
    np.testing.assert_array_equal(np.concatenate(trained), x[order[(2 + 3) * 4:]])
    assert stats["steps"] == 5 and worker.resumed_steps(spec, 0) == 0


def test_positions_count_each_partitions_applied_commits_of_the_epoch():
    from elephant.fit.backup import step_positions
    from elephant.protocol import CommitKey

    spec, _ = _task("pos", skip_steps=0, resume_steps=(0, 4))
    spec = dataclasses.replace(spec, window=3, warmup_window=None, epoch=2)
    entries = [(CommitKey("pos", 2, 0, 0), 1), (CommitKey("pos", 2, 1, 0), 1), (CommitKey("pos", 1, 1, 5), 1),
               (CommitKey("retry", 2, 0, 1), 2)]  # another epoch's commit is not counted; a retried try's is
    assert step_positions(entries, spec, [10, 10]) == {0: 6, 1: 4 + 3}
    assert step_positions([], spec, [10, 10]) == {0: 0, 1: 4}


def test_a_save_inside_an_epoch_round_trips_with_its_positions(tmp_path):
    from elephant import checkpoint

    saved = checkpoint.Checkpoint(epochs_done=3, center=[np.ones(2)], optimizer_variables=[], rule_state=None,
                                  rule={"name": "x"}, history={}, positions={0: 5, 1: 7}, head_steps=2)
    checkpoint.save(str(tmp_path), saved)
    loaded = checkpoint.load(str(tmp_path))
    assert loaded.positions == {0: 5, 1: 7} and loaded.head_steps == 2 and loaded.epochs_done == 3
    checkpoint.save(str(tmp_path), dataclasses.replace(saved, positions=None, head_steps=0))
    assert checkpoint.load(str(tmp_path)).positions is None  # saved at an epoch's end


def test_a_mid_epoch_backup_saves_a_center_and_positions_that_agree():
    from elephant import optimizers as O
    from elephant.fit.backup import MidEpochBackup
    from elephant.protocol import Commit, CommitKey
    from elephant.ps.store import Store

    store = Store([np.zeros(2)], O.Downpour(), "asynchronous", 2, "mid")
    spec, _ = _task("mid", skip_steps=0)
    spec = dataclasses.replace(spec, window=2, warmup_window=None)
    written = []
    saver = MidEpochBackup(store, 8, lambda snapshot, positions: written.append((snapshot, positions)), spec, [5, 5])
    store.commit(CommitKey("mid", 0, 1, 0), 1, Commit([np.ones(2)], 2, 8, 0))
    saver.save()
    store.commit(CommitKey("mid", 0, 1, 1), 1, Commit([np.ones(2)], 2, 8, 1))
    (snapshot, positions), = written
    np.testing.assert_array_equal(snapshot.center[0], np.ones(2))  # the center as the first commit left it
    assert positions == {0: 0, 1: 2}
    saver.start()
    saver.stop()  # stops its thread at once


def test_saves_inside_an_epoch_need_one_store_on_the_driver(caplog):
    import keras

    from elephant.fit.loop import _inside_epochs

    backup = keras.callbacks.BackupAndRestore("unused", save_freq=5)
    assert _inside_epochs(backup, 1, False) == 5 and _inside_epochs(None, 1, False) is None
    assert _inside_epochs(keras.callbacks.BackupAndRestore("unused"), 1, False) is None  # save_freq="epoch"
    with caplog.at_level("WARNING", logger="elephant.fit.loop"):
        assert _inside_epochs(backup, 2, False) is None
    assert "saves at the end of each epoch only: the parameter server is sharded" in caplog.text


def test_the_simulator_shuffles_each_shard_through_the_buffer_a_spark_fit_would():
    from elephant.optimizers import simulate_fit
    from tests.unit.test_fit_head import _model

    x, y = _data(96)
    ends = []
    for buffer in (None, 48):  # 48 holds a shard: the same order as None
        model = _model()
        simulate_fit(model, x, y, epochs=1, batch_size=8, optimizer="downpour", frequency=2, shuffle_buffer=buffer)
        ends.append(model.get_weights())
    assert all(np.array_equal(a, b) for a, b in zip(ends[0], ends[1], strict=True))
    with pytest.raises(ConfigError, match="`shuffle_buffer` must be a positive int; received shuffle_buffer=0"):
        simulate_fit(_model(), x, y, shuffle_buffer=0)
