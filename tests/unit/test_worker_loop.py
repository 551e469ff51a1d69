"""The partition training loop against an in-process store (TF, no Spark, no sockets)."""

import dataclasses
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402

from elephant import optimizers as O  # noqa: E402
from elephant import faults, replicas, stream, worker  # noqa: E402
from elephant.model_io import fingerprint, model_to_bytes  # noqa: E402
from elephant.optimizers.schedules import timed  # noqa: E402
from elephant.ps.store import Store  # noqa: E402
from tests.unit.helpers import tiny_model  # noqa: E402


class RecordingClient:
    """Calls the store directly and records what the worker sent."""

    def __init__(self, store):
        self.store = store
        self.commits = []
        self.pulls = 0
        self.finished = []

    def pull(self, worker_index, epoch=None):
        self.pulls += 1
        return self.store.pull(worker_index, epoch=epoch)

    def commit(self, key, attempt, commit):
        self.commits.append((key, commit.num_steps, commit.num_samples))
        return self.store.commit(key, attempt, commit)

    def finish(self, run, epoch, partition, attempt, stats=None):  # stats: a task's report in a fit run as one job
        self.finished.append((run, epoch, partition, attempt))
        self.store.finish(run, epoch, partition, attempt)



def _spec(model_bytes, run, window, optimizer=None, epoch=0, batch_size=32):
    return worker.TaskSpec(
        run=run, epoch=epoch, model_bytes=model_bytes, fingerprint=fingerprint(model_bytes),
        optimizer=optimizer or O.Downpour(), window=window, batch_size=batch_size, mode="asynchronous",
        ps_url="in-process", token="t", read_timeout=5.0,
    )



def test_partial_last_window_is_flushed_with_true_counts(linear_data):
    model = tiny_model()
    data_bytes = model_to_bytes(model)
    store = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, "run-a")
    client = RecordingClient(store)
    (stats,) = worker.run_partition(_spec(data_bytes, "run-a", window=3), 0, 11, [linear_data], client)
    # 100 samples, batch 32 -> 4 steps (32, 32, 32, 4); window 3 -> commits of 3 and 1 steps
    assert [(c[1], c[2]) for c in client.commits] == [(3, 96), (1, 4)]
    assert [c[0].step for c in client.commits] == [0, 1]
    assert stats["steps"] == 4 and stats["commits"] == 2 and stats["samples"] == 100
    assert client.finished == [("run-a", 0, 0, 11)]
    assert client.pulls == 1  # the commit reply carries the center: no extra pulls
    assert store.metrics()["commits_applied"] == 2
    assert np.isfinite(stats["logs"]["loss"])


def test_a_pass_commits_in_its_warmup_windows_while_its_rate_ramps_as_the_simulator_schedules(linear_data,
                                                                                            monkeypatch):
    monkeypatch.setattr(worker, "RAMP_STEPS", 5)  # the ramp's steps, short enough for a pass of 25
    model = tiny_model()
    model_bytes = model_to_bytes(model)
    store = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, "run-warm")
    client = RecordingClient(store)
    spec = dataclasses.replace(_spec(model_bytes, "run-warm", window=5, batch_size=4), warmup_window=2)
    (stats,) = worker.run_partition(spec, 0, 1, [linear_data], client)
    events = timed([1.0], window=5, num_steps=25, warmup=(2, 5))
    scheduled = [events[:i].count(("step", 0)) for i, e in enumerate(events) if e == ("commit", 0)]
    sent = [c[1] for c in client.commits]
    assert sent == [b - a for a, b in zip([0, *scheduled], scheduled)] == [2, 2, 5, 5, 5, 5, 1]
    assert stats["commits"] == 7


def test_single_worker_downpour_equals_local_training(linear_data):
    """n = 1: the center after the fit equals the worker's own weights (T2.1 at model scale)."""
    model = tiny_model()
    model_bytes = model_to_bytes(model)
    store = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, "run-b")
    worker.run_partition(_spec(model_bytes, "run-b", window=2), 0, 1, [linear_data], RecordingClient(store))
    local = replicas.training_model(_spec(model_bytes, "run-b", window=2))
    for c, w in zip(store.center(), local.get_weights(), strict=True):
        np.testing.assert_allclose(c, w, rtol=1e-6, atol=1e-7)
    assert not np.allclose(store.center()[0], model.get_weights()[0])  # it did train


def test_model_is_built_once_per_process_and_run(linear_data):
    model = tiny_model()
    model_bytes = model_to_bytes(model)
    store = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, "run-c")
    client = RecordingClient(store)
    worker.run_partition(_spec(model_bytes, "run-c", window=None, epoch=0), 0, 1, [linear_data], client)
    first = replicas.training_model(_spec(model_bytes, "run-c", window=None))
    iterations = int(first.optimizer.iterations.numpy())
    worker.run_partition(_spec(model_bytes, "run-c", window=None, epoch=1), 0, 2, [linear_data], client)
    again = replicas.training_model(_spec(model_bytes, "run-c", window=None))
    assert again is first
    # the local Keras optimizer state persists across epochs within a process
    assert int(again.optimizer.iterations.numpy()) == 2 * iterations == 8
    assert [c[1] for c in client.commits] == [4, 4]  # frequency="epoch": one commit per pass


def _adam_model(seed):
    """A model as the driver archives it: its optimizer built (fit.loop), so the archive holds its whole state."""
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
    m.compile(keras.optimizers.Adam(0.01), "mse")
    m.optimizer.build(m.trainable_variables)
    return m


def _fit_epochs(model, store, run, epochs, data, structure):
    """Epochs of a one-worker fit of ``model`` against ``store`` through run_partition, unshuffled."""
    model_bytes = model_to_bytes(model)
    for epoch in epochs:
        spec = dataclasses.replace(_spec(model_bytes, run, window=2, epoch=epoch), shuffle=False, structure=structure)
        worker.run_partition(spec, 0, epoch, [data], RecordingClient(store))
    return store.center()


def _store(model, run):
    return Store(model.get_weights(), O.Downpour(), "asynchronous", 1, run)


def test_fits_of_one_structure_share_a_replica_but_never_its_optimizer_state(linear_data):
    from elephant.model_io import structure_fingerprint

    first, second = _adam_model(1), _adam_model(2)
    structure = structure_fingerprint(first)
    assert structure == structure_fingerprint(second)  # other weights, other auto names: same structure
    assert structure != structure_fingerprint(tiny_model())

    def replica(model, run):
        return replicas.training_model(dataclasses.replace(_spec(model_to_bytes(model), run, window=2), structure=structure))

    _fit_epochs(first, _store(first, "share-a"), "share-a", [0], linear_data, structure)
    shared = replica(first, "share-a")
    assert int(shared.optimizer.iterations.numpy()) == 4
    moments_a = [np.array(v) for v in shared.optimizer.variables]

    # a second fit gets the same replica with the optimizer state it was built with
    assert replica(second, "share-b") is shared
    assert int(shared.optimizer.iterations.numpy()) == 0
    assert all(not np.any(np.array(v)) for v in shared.optimizer.variables if "iteration" not in v.path
               and "learning_rate" not in v.path)
    assert float(shared.optimizer.learning_rate.numpy()) == pytest.approx(0.01)
    _fit_epochs(second, _store(second, "share-b"), "share-b", [0], linear_data, structure)

    # the first fit comes back to its own moments
    assert replica(first, "share-a") is shared
    for v, want in zip(shared.optimizer.variables, moments_a, strict=True):
        np.testing.assert_array_equal(np.array(v), want)


def test_a_fit_whose_optimizer_has_trained_takes_a_shared_replica_with_its_own_state(linear_data):
    """The driver's head (or a model trained before) leaves the optimizer with moments and a step count: the fit still
    shares the replica traced for another, starting from the state its archive holds, and trains as if alone."""
    from elephant.model_io import structure_fingerprint

    first, trained = _adam_model(7), _adam_model(8)
    trained.fit(*linear_data, epochs=1, batch_size=25, verbose=0)  # 4 steps of Adam
    structure = structure_fingerprint(first)
    assert structure_fingerprint(trained) == structure
    alone = _fit_epochs(trained, _store(trained, "trained-alone"), "trained-alone", [0, 1], linear_data, structure="")
    _new_process()
    _fit_epochs(first, _store(first, "first"), "first", [0], linear_data, structure)
    shared = replicas.training_model(dataclasses.replace(_spec(model_to_bytes(first), "first", window=2),
                                                         structure=structure))
    state = [np.array(v) for v in trained.optimizer.variables]
    taken = _store(trained, "taken")
    _fit_epochs(trained, taken, "taken", [0, 1], linear_data, structure)
    assert replicas.training_model(dataclasses.replace(_spec(model_to_bytes(trained), "taken", window=2),
                                                       structure=structure)) is shared
    assert int(shared.optimizer.iterations.numpy()) == int(state[0]) + 2 * 4  # it went on from the archive's count
    for got, want in zip(taken.center(), alone, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_an_archive_without_the_optimizers_variables_gets_a_replica_of_its_own(linear_data):
    from elephant.model_io import structure_fingerprint

    built, unbuilt = _adam_model(9), _adam_model(10)
    structure = structure_fingerprint(built)
    _new_process()
    _fit_epochs(built, _store(built, "built"), "built", [0], linear_data, structure)
    keras.utils.set_random_seed(10)
    unbuilt = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
    unbuilt.compile(keras.optimizers.Adam(0.01), "mse")  # its archive holds no moments to start a shared replica from
    spec = dataclasses.replace(_spec(model_to_bytes(unbuilt), "unbuilt", window=2), structure=structure)
    own = replicas.training_model(spec)
    assert int(own.optimizer.iterations.numpy()) == 0
    assert all(not np.any(np.array(v)) for v in own.optimizer.variables if "iteration" not in v.path
               and "learning_rate" not in v.path)


def test_a_fit_interleaved_with_another_on_its_replica_trains_as_if_alone(linear_data):
    from elephant.model_io import structure_fingerprint

    model, other = _adam_model(3), _adam_model(4)
    alone = _fit_epochs(model, _store(model, "alone"), "alone", [0, 1], linear_data, structure="")  # a replica of its own
    structure = structure_fingerprint(model)
    mixed = _store(model, "mixed")
    _fit_epochs(model, mixed, "mixed", [0], linear_data, structure)
    _fit_epochs(other, _store(other, "intruder"), "intruder", [0, 1], linear_data, structure)
    _fit_epochs(model, mixed, "mixed", [1], linear_data, structure)
    assert not np.allclose(alone[0], model.get_weights()[0])  # it trained
    for got, want in zip(mixed.center(), alone, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _new_process():
    """What a task sees in another Python worker of the executor: no replica cached yet."""
    replicas._REPLICAS.clear()


def _one_epoch(model_bytes, store, run, epoch, data, partition=0):
    spec = dataclasses.replace(_spec(model_bytes, run, window=2, epoch=epoch), shuffle=False)
    (stats,) = worker.run_partition(spec, partition, epoch, [data], RecordingClient(store))
    return stats, replicas.training_model(spec)


def test_a_partitions_next_epoch_in_another_python_worker_continues_its_optimizer_state(linear_data):
    model = _adam_model(5)
    model_bytes = model_to_bytes(model)
    same, moved = _store(model, "same-process"), _store(model, "moved")
    for epoch in range(3):
        _one_epoch(model_bytes, same, "same-process", epoch, linear_data)
    sources = []
    for epoch in range(3):  # every epoch in a new process, as when tasks alternate between idle Python workers
        _new_process()
        stats, replica = _one_epoch(model_bytes, moved, "moved", epoch, linear_data)
        sources.append(stats["optimizer_state"])
    assert sources == ["new", "shared", "shared"]
    assert int(replica.optimizer.iterations.numpy()) == 3 * 4  # Adam's step count went on: no restart
    for got, want in zip(moved.center(), same.center(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_a_task_that_trains_its_next_epoch_itself_writes_its_state_in_the_background(linear_data, monkeypatch):
    """A fit run as one job: the task's state is copied at the epoch's end and written while it goes on; a reader in
    the same process waits for the write, and a retried job's task in another process reads it as usual."""
    import threading

    model = _adam_model(6)
    spec = dataclasses.replace(_spec(model_to_bytes(model), "background", window=2, epoch=0), shuffle=False)
    release, written = threading.Event(), []
    write = replicas._write_state

    def slow_write(run, partition, epoch, values):
        assert release.wait(10)
        write(run, partition, epoch, values)
        written.append(epoch)

    monkeypatch.setattr(replicas, "_write_state", slow_write)
    worker.run_partition(spec, 0, 0, [linear_data], RecordingClient(_store(model, "background")), report=True)
    assert written == []  # the task returned with its write in flight
    at_end = [np.array(v) for v in replicas.training_model(spec).optimizer.variables]
    release.set()
    _new_process()  # a retried job's task of epoch 1 in another Python worker
    replicas._wait_for_write()
    assert written == [0]
    stats, replica = _one_epoch(spec.model_bytes, _store(model, "background"), "background", 1, linear_data)
    assert stats["optimizer_state"] == "shared"
    assert int(replica.optimizer.iterations.numpy()) == int(at_end[0]) + 4


def test_without_the_executors_copy_a_moved_task_restarts_its_moments(linear_data, tmp_path, monkeypatch):
    model = _adam_model(5)
    model_bytes = model_to_bytes(model)
    store = _store(model, "no-copy")
    _one_epoch(model_bytes, store, "no-copy", 0, linear_data)
    monkeypatch.setattr(replicas, "_state_root", lambda: str(tmp_path / "elsewhere"))  # another executor's folder
    _new_process()
    stats, replica = _one_epoch(model_bytes, store, "no-copy", 1, linear_data)
    assert stats["optimizer_state"] == "new" and int(replica.optimizer.iterations.numpy()) == 4


def test_a_retried_epoch_reads_the_state_before_it_and_a_foreign_partition_is_stale(linear_data):
    model = _adam_model(6)
    model_bytes = model_to_bytes(model)
    store = _store(model, "retry")
    _one_epoch(model_bytes, store, "retry", 0, linear_data)
    after_0 = [np.array(v) for v in replicas.training_model(_spec(model_bytes, "retry", 2)).optimizer.variables]
    _one_epoch(model_bytes, store, "retry", 1, linear_data)  # succeeded, then its epoch was rolled back
    _new_process()
    spec = dataclasses.replace(_spec(model_bytes, "retry", window=2, epoch=1), shuffle=False)
    replica, source = replicas.training_replica(spec, 0)
    assert source == "shared"  # epoch 0's state, which the retry of epoch 1 starts from
    for got, want in zip(replica.optimizer.variables, after_0, strict=True):
        np.testing.assert_array_equal(np.array(got), want)
    # this process now holds partition 0's state; partition 1 of epoch 1 has none of its own left anywhere
    assert replicas.training_replica(spec, 1)[1] == "stale"


def test_the_fits_last_epoch_leaves_no_state_behind(linear_data):
    model = _adam_model(8)
    model_bytes = model_to_bytes(model)
    spec = dataclasses.replace(_spec(model_bytes, "last", window=2, epoch=0), shuffle=False, last_epoch=True)
    (stats,) = worker.run_partition(spec, 0, 1, [linear_data], RecordingClient(_store(model, "last")))
    assert stats["steps"] == 4 and not os.path.exists(replicas._state_path("last", 0, 0))
    follow = dataclasses.replace(spec, epoch=1, last_epoch=False)
    assert replicas.training_replica(follow, 0)[1] == "kept"  # this process still knows what it holds


def test_a_damaged_or_foreign_state_file_is_not_read(linear_data):
    import shutil

    model = _adam_model(7)
    model_bytes = model_to_bytes(model)
    _one_epoch(model_bytes, _store(model, "whole"), "whole", 0, linear_data)
    _new_process()
    spec = dataclasses.replace(_spec(model_bytes, "foreign", window=2, epoch=1), shuffle=False)
    os.makedirs(os.path.dirname(replicas._state_path("foreign", 0, 0)), exist_ok=True)
    shutil.copy(replicas._state_path("whole", 0, 0), replicas._state_path("foreign", 0, 0))  # another fit's
    assert replicas.training_replica(spec, 0)[1] == "new"
    path = replicas._state_path("whole", 0, 0)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)  # a task killed while writing (os.replace makes this unlikely)
    _new_process()
    spec = dataclasses.replace(_spec(model_bytes, "whole", window=2, epoch=1), shuffle=False)
    assert replicas.training_replica(spec, 0)[1] == "new"


def test_empty_partition_only_finishes(linear_data):
    model = tiny_model()
    model_bytes = model_to_bytes(model)
    store = Store(model.get_weights(), O.Downpour(), "asynchronous", 2, "run-d")
    client = RecordingClient(store)
    (stats,) = worker.run_partition(_spec(model_bytes, "run-d", window=1), 1, 5, [], client)
    assert stats["samples"] == 0 and client.commits == [] and client.finished == [("run-d", 0, 1, 5)]


@pytest.mark.parametrize(
    "fault, partition, step, fires",
    [("partition=1,step=2,kind=raise", 1, 2, True), ("partition=1,step=2", 0, 2, False), ("partition=1,step=2", 1, 3, False)],
)
def test_fault_injection_parsing(fault, partition, step, fires):
    if fires:
        with pytest.raises(RuntimeError, match="injected fault in partition 1 at step 2"):
            faults.inject_fault(fault, partition, step)
    else:
        faults.inject_fault(fault, partition, step)


def test_fault_marker_fires_once(tmp_path):
    fault = f"partition=0,step=0,marker={tmp_path / 'm'}"
    with pytest.raises(RuntimeError):
        faults.inject_fault(fault, 0, 0)
    faults.inject_fault(fault, 0, 0)  # marker exists: no second failure


@pytest.mark.parametrize("window", [1, 2, None])
def test_a_diverging_worker_stops_its_pass_and_never_commits_non_finite_weights(linear_data, window):
    x, y = linear_data
    y_bad = y.copy()
    y_bad[40:] = np.inf  # the loss turns non-finite at the second batch (batch size 32)
    model = tiny_model()
    store = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, f"run-nan-{window}")
    client = RecordingClient(store)
    spec = dataclasses.replace(_spec(model_to_bytes(model), f"run-nan-{window}", window=window), shuffle=False)
    (stats,) = worker.run_partition(spec, 0, 1, [(x, y_bad)], client)
    assert stats["diverged_at"] == 1  # the second local step
    assert stats["steps"] == 1 and not np.isfinite(stats["logs"]["loss"])
    # only the finite first step may reach the center (window 1); nothing else was sent
    assert [c[1] for c in client.commits] == ([1] if window == 1 else [])
    assert all(np.isfinite(w).all() for w in store.center())
    assert client.finished == [(f"run-nan-{window}", 0, 0, 1)]  # it still leaves rounds and SSP


def test_the_worker_pass_equals_keras_fit(linear_data):
    """Canary for Keras upgrades: the pass drives Keras' compiled train step directly
    (``make_train_function``/``train_function``); one pass must equal ``model.fit`` for
    one unshuffled epoch (weights, optimizer steps and the reported loss)."""
    x, y = linear_data
    model = tiny_model()
    model_bytes = model_to_bytes(model)
    reference = replicas.cached_model(model_bytes, fingerprint(model_bytes), "fit-reference")
    fitted = reference.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    store = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, "run-canary")
    spec = dataclasses.replace(_spec(model_bytes, "run-canary", window=None), shuffle=False)
    (stats,) = worker.run_partition(spec, 0, 1, [linear_data], RecordingClient(store))
    mine = replicas.training_model(spec)
    assert mine is not reference
    for a, b in zip(mine.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert int(mine.optimizer.iterations.numpy()) == int(reference.optimizer.iterations.numpy()) == 4
    assert stats["logs"]["loss"] == pytest.approx(fitted.history["loss"][0], rel=1e-5)


def test_structure_fingerprint_ignores_weights_names_and_optimizer_values(linear_data):
    from elephant.model_io import structure_fingerprint

    def functional(seed, units=2, optimizer="adam"):
        keras.utils.set_random_seed(seed)
        inputs = keras.Input((3,))
        outputs = keras.layers.Dense(units)(keras.layers.Dense(4)(inputs))
        model = keras.Model(inputs, outputs)  # auto names: dense_7, functional_3, ... differ per build
        model.compile(optimizer, "mse")
        return model

    a, b = functional(0), functional(1)
    assert structure_fingerprint(a) == structure_fingerprint(b)
    assert structure_fingerprint(a) != structure_fingerprint(functional(0, units=3))
    assert structure_fingerprint(a) != structure_fingerprint(functional(0, optimizer="sgd"))
    assert structure_fingerprint(a) != structure_fingerprint(functional(0, optimizer=keras.optimizers.Adam(2e-3)))
    b.fit(*linear_data, epochs=1, verbose=0)  # a trained optimizer's values travel in the archive, not in the key
    a.optimizer.build(a.trainable_variables)
    assert structure_fingerprint(a) == structure_fingerprint(b)


def test_models_with_custom_objects_never_share_a_replica():
    from elephant.fit.loop import replica_structure
    from elephant.model_io import structure_fingerprint

    class Scale(keras.layers.Layer):
        def call(self, x):
            return 2.0 * x

    model = tiny_model()
    assert replica_structure(model, None) == structure_fingerprint(model, settable_rate=True)  # its rate is a number
    assert replica_structure(model, {"Scale": Scale}) == ""  # a replica of the fit's own, as before


def test_weight_access_reads_and_writes_what_keras_would():
    class Mixed(keras.layers.Layer):
        def build(self, shape):
            self.w64 = self.add_weight(shape=(shape[-1],), dtype="float64", initializer="ones")
            self.count = self.add_weight(shape=(), dtype="int32", initializer="zeros", trainable=False)

        def call(self, x):
            return x * keras.ops.cast(self.w64, x.dtype)

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.BatchNormalization(), Mixed(),
                              keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(), "mse")
    access = replicas.weight_access(model)
    assert replicas.weight_access(model) is access
    for got, want in zip(access.get(), model.get_weights(), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    rng = np.random.default_rng(1)
    new = [rng.normal(size=w.shape).astype(w.dtype) if w.dtype.kind == "f" else np.full(w.shape, 7, w.dtype)
           for w in model.get_weights()]
    access.set(new)
    for got, want in zip(model.get_weights(), new, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_weighted_pass_equals_keras_fit_with_sample_weight(linear_data):
    """Sample weights reach Keras' train step: the same weights and logs as ``model.fit(sample_weight=)``,
    and the partition reports its weight sum and which log keys are means over the weights."""
    x, y = linear_data
    w = np.random.default_rng(3).uniform(0.0, 4.0, len(x)).astype("float32")
    model = tiny_model()
    model.compile(keras.optimizers.SGD(0.05), "mse", metrics=["mae"], weighted_metrics=["mae"])
    model_bytes = model_to_bytes(model)
    reference = replicas.cached_model(model_bytes, fingerprint(model_bytes), "fit-reference-weighted")
    fitted = reference.fit(x, y, sample_weight=w, batch_size=32, epochs=1, shuffle=False, verbose=0)
    store = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, "run-weighted")
    spec = dataclasses.replace(_spec(model_bytes, "run-weighted", window=None), shuffle=False)
    (stats,) = worker.run_partition(spec, 0, 1, [(x, y, w)], RecordingClient(store))
    for a, b in zip(replicas.training_model(spec).get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    for key in ("loss", "mae", "weighted_mae"):
        assert stats["logs"][key] == pytest.approx(fitted.history[key][0], rel=1e-5), key
    assert stats["logs"]["mae"] != pytest.approx(stats["logs"]["weighted_mae"], rel=1e-3)  # the weights mattered
    assert stats["weight_sum"] == pytest.approx(float(w.sum()), rel=1e-6)
    assert stats["weighted_keys"] == ["weighted_mae"]


def test_a_shuffled_pass_keeps_each_sample_with_its_weight(linear_data):
    # every other sample has weight 0 and a wild label: a shuffle that separated samples from their
    # weights would give some of those labels weight 1 and throw the weights far away
    x, y = linear_data
    w = np.zeros(len(x), dtype="float32")
    w[::2] = 1.0
    y_wild = y.copy()
    y_wild[1::2] = 1e4
    model = tiny_model()
    model_bytes = model_to_bytes(model)
    store = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, "run-zero-weights")
    spec = dataclasses.replace(_spec(model_bytes, "run-zero-weights", window=None), shuffle=True)
    (stats,) = worker.run_partition(spec, 0, 1, [(x, y_wild, w)], RecordingClient(store))
    assert max(np.abs(v).max() for v in store.center()) < 10
    assert stats["weight_sum"] == len(x) // 2


def test_a_retried_task_replays_the_same_shuffled_order(linear_data):
    """A retry's acknowledged replays must stand for the samples the first attempt trained on."""
    model = tiny_model()
    model_bytes = model_to_bytes(model)

    def centers(epoch, attempt):
        store = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, "run-seeded")
        spec = dataclasses.replace(_spec(model_bytes, "run-seeded", window=1, epoch=epoch), shuffle=True)
        worker.run_partition(spec, 0, attempt, [linear_data], RecordingClient(store))
        return store.center()

    first, retry, next_epoch = centers(0, 1), centers(0, 2), centers(1, 3)
    for a, b in zip(first, retry, strict=True):
        np.testing.assert_array_equal(a, b)
    assert any((a != b).any() for a, b in zip(first, next_epoch, strict=True))  # another epoch, another order
    assert stream.shuffle_seed("r", 0, 1) != stream.shuffle_seed("r", 0, 0) != stream.shuffle_seed("r", 1, 0)


def test_the_shuffle_follows_the_fits_seed_not_its_run_id(linear_data):
    """Two fits with the same seed from the same weights train the same orders; the run id no longer matters."""
    model = tiny_model()
    model_bytes = model_to_bytes(model)

    def center(run, key):
        store = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, run)
        spec = dataclasses.replace(_spec(model_bytes, run, window=1), shuffle=True, shuffle_key=key)
        worker.run_partition(spec, 0, 1, [linear_data], RecordingClient(store))
        return store.center()

    key = stream.shuffle_key(0, model.get_weights())
    for a, b in zip(center("run-a", key), center("run-b", key), strict=True):
        np.testing.assert_array_equal(a, b)
    other = center("run-a", stream.shuffle_key(1, model.get_weights()))
    assert any((a != b).any() for a, b in zip(center("run-a", key), other, strict=True))
    assert stream.shuffle_key(0, tiny_model().get_weights()) == key  # built again, other layer names: the same orders
    trained = [w + 1 for w in model.get_weights()]
    assert stream.shuffle_key(0, trained) != key  # a later fit starts from other weights and shuffles anew
    assert stream.shuffle_key(None, model.get_weights()) == ""  # no seed: the run id, new every fit


def test_the_simulator_trains_the_orders_of_a_spark_fit_with_the_same_seed(linear_data):
    """simulate_fit shards and shuffles as SparkModel(seed=).fit does from the same weights: the same centers."""
    from elephant.data import split_numpy
    from elephant.optimizers import simulate_fit

    x, y = linear_data
    model = tiny_model()
    store = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, "run-a")
    spec = dataclasses.replace(_spec(model_to_bytes(model), "run-a", window=1, batch_size=16), shuffle=True,
                               shuffle_key=stream.shuffle_key(3, model.get_weights()))
    worker.run_partition(spec, 0, 1, split_numpy(x, y, 1, seed=3), RecordingClient(store))

    def simulated(seed):
        return simulate_fit(tiny_model(), x, y, epochs=1, batch_size=16, optimizer=O.Downpour(window=1),
                            num_workers=1, seed=seed).centers[-1]

    for got, want in zip(simulated(3), store.center(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert any(not np.allclose(a, b) for a, b in zip(simulated(4), store.center(), strict=True))


def _adam_at(seed, rate):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
    m.compile(keras.optimizers.Adam(rate), "mse")
    return m


def test_a_replica_key_without_the_settable_rate_ignores_only_the_rate():
    from elephant.fit.loop import replica_structure
    from elephant.model_io import structure_fingerprint

    key = structure_fingerprint(_adam_at(0, 0.01), settable_rate=True)
    assert key == structure_fingerprint(_adam_at(1, 0.05), settable_rate=True)
    assert key != structure_fingerprint(_adam_at(0, 0.01))  # the default keeps the rate
    keras.utils.set_random_seed(0)
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
    other.compile(keras.optimizers.Adam(0.01, beta_1=0.8), "mse")
    assert key != structure_fingerprint(other, settable_rate=True)  # any other optimizer setting still counts
    assert replica_structure(_adam_at(0, 0.01), None) == replica_structure(_adam_at(2, 0.05), None)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, 10, 0.5)
    scheduled = _adam_at(0, 0.01)
    scheduled.compile(keras.optimizers.Adam(schedule), "mse")
    assert replica_structure(scheduled, None) != replica_structure(_adam_at(0, 0.01), None)  # a schedule: never
    assert replica_structure(_adam_at(0, 0.01), {"x": object}) == ""


def test_fits_at_other_rates_on_one_replica_train_as_if_alone(linear_data):
    from elephant.fit.loop import replica_structure, settable_learning_rate

    def fit(model, run, epochs, structure, store):
        model_bytes = model_to_bytes(model)
        for epoch in epochs:
            spec = dataclasses.replace(_spec(model_bytes, run, window=2, epoch=epoch), shuffle=False,
                                       structure=structure, learning_rate=settable_learning_rate(model.optimizer))
            worker.run_partition(spec, 0, epoch, [linear_data], RecordingClient(store))
        return store.center()

    slow, fast = _adam_at(5, 0.003), _adam_at(6, 0.05)
    alone = {name: fit(m, f"{name}-alone", [0, 1], "", _store(m, f"{name}-alone"))
             for name, m in (("slow", slow), ("fast", fast))}
    structure = replica_structure(slow, None)
    assert structure == replica_structure(fast, None)
    stores = {"slow": _store(slow, "slow-shared"), "fast": _store(fast, "fast-shared")}
    fit(slow, "slow-shared", [0], structure, stores["slow"])
    fit(fast, "fast-shared", [0, 1], structure, stores["fast"])  # the slow fit's replica, at the fast rate
    fit(slow, "slow-shared", [1], structure, stores["slow"])
    assert not np.allclose(alone["slow"][0], alone["fast"][0])  # the rates made a difference
    for name in ("slow", "fast"):
        for got, want in zip(stores[name].center(), alone[name], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
