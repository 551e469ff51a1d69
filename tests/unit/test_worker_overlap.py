"""Commits in flight while the worker trains on (``TaskSpec.overlap``): the merge, the flush, retries.

A fake transport holds each reply until the test releases it, so what the worker has
done meanwhile is known exactly.
"""

import dataclasses
import os
import threading

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402

from elephant import optimizers as O  # noqa: E402
from elephant import replicas, worker  # noqa: E402
from elephant.errors import ConfigError  # noqa: E402
from elephant.model_io import fingerprint, model_to_bytes  # noqa: E402
from elephant.ps.client import InProcessClient  # noqa: E402
from elephant.ps.store import CommitKey, Store  # noqa: E402
from tests.unit.helpers import check_points_to_the_figures, tiny_model  # noqa: E402


class HeldClient(InProcessClient):
    """Applies a commit at once but returns its reply only when ``release`` is set (if ``hold``)."""

    def __init__(self, store, hold=True, delay=0.0):
        super().__init__(store)
        self.hold, self.delay = hold, delay
        self.release = threading.Event()
        self.sent, self.base_clocks = [], []

    def commit(self, key, attempt, commit, template=None):
        self.sent.append((key.step, commit.num_steps, commit.num_samples))
        self.base_clocks.append(commit.base_clock)
        reply = super().commit(key, attempt, commit, template)
        if self.hold:
            assert self.release.wait(10)
        elif self.delay:
            threading.Event().wait(self.delay)
        return reply


class ArrayModel:
    """get_weights/set_weights over numpy arrays: what _Window needs of a Keras model."""

    def __init__(self, weights):
        self.weights = [np.array(w, dtype=np.float64) for w in weights]

    def get_weights(self):
        return [w.copy() for w in self.weights]

    def set_weights(self, weights):
        self.weights = [np.array(w, dtype=np.float64) for w in weights]


def _spec(optimizer, window, overlap=True, model_bytes=b"", batch_size=32, fault=None, run="run-o"):
    return worker.TaskSpec(
        run=run, epoch=0, model_bytes=model_bytes, fingerprint=fingerprint(model_bytes) if model_bytes else "f",
        optimizer=optimizer, window=window, batch_size=batch_size, mode="asynchronous", ps_url="in-process",
        token="t", read_timeout=5.0, overlap=overlap, fault=fault,
    )


def _window(optimizer, center, client, n=320):
    model = ArrayModel(center)
    return model, worker._Window(model, client, _spec(optimizer, window=2), 0, 1, n)


def test_merge_is_the_reply_plus_the_progress_made_while_it_travelled():
    center = [np.zeros(3)]
    store = Store(center, O.Downpour(), "asynchronous", 2, "run-o")
    store.commit(CommitKey("run-o", 0, 1, 0), 1, O.Commit([np.full(3, 10.0)], 1, 1, 0))  # another worker: center 10
    client = HeldClient(store)
    model, win = _window(O.Downpour(), [np.zeros(3)], client)
    assert float(win.pulled[0][0]) == 10.0  # pulled after the other worker's commit
    model.set_weights([np.array([11.0, 12.0, 13.0])])  # two local steps from 10
    win.after_step(), win.after_step()  # window 2: the commit goes out with the delta [1, 2, 3]
    assert win._inflight is not None
    model.set_weights([np.array([11.5, 12.5, 13.5])])  # the worker trains on while the reply travels
    client.release.set()
    win.settle()
    # center after the commit: 10 + [1, 2, 3]; plus the progress since the send, [0.5, 0.5, 0.5]
    np.testing.assert_array_equal(model.weights[0], [11.5, 12.5, 13.5])
    np.testing.assert_array_equal(win.pulled[0], [11.0, 12.0, 13.0])
    win.close()


def test_the_merge_keeps_the_rules_reply_and_the_local_progress():
    """AEASGD: the rule's answer for the sent weights minus the elastic term, plus the local progress."""
    store = Store([np.zeros(2)], O.AEASGD(alpha=0.5), "asynchronous", 1, "run-o")
    client = HeldClient(store)
    model, win = _window(O.AEASGD(alpha=0.5), [np.zeros(2)], client)
    model.set_weights([np.array([2.0, 4.0])])
    win.after_step(), win.after_step()  # sends [2, 4]; the server's elastic term is 0.5·([2, 4] − 0) = [1, 2]
    model.set_weights([np.array([3.0, 4.0])])
    client.release.set()
    win.settle()
    np.testing.assert_array_equal(model.weights[0], [3.0 - 1.0, 4.0 - 2.0])
    np.testing.assert_array_equal(store.center()[0], [1.0, 2.0])
    win.close()


def test_at_most_one_commit_is_in_flight():
    store = Store([np.zeros(1)], O.Downpour(), "asynchronous", 1, "run-o")
    client = HeldClient(store)
    model, win = _window(O.Downpour(), [np.zeros(1)], client)
    model.set_weights([np.ones(1)])
    win.after_step(), win.after_step()
    timer = threading.Timer(0.2, client.release.set)
    timer.start()
    win.after_step(), win.after_step()  # the second commit point waits for the first reply
    assert client.release.is_set() and win._inflight is not None
    win.settle()
    # the second window was measured from the first reply's center (clock 1), so it was sent after that reply
    assert [s[0] for s in client.sent] == [0, 1] and client.base_clocks == [0, 1]
    win.close()




def test_the_last_partial_window_is_flushed_after_the_commit_in_flight(linear_data):
    model = tiny_model()
    archive = model_to_bytes(model)
    store = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, "run-f")
    client = HeldClient(store, hold=False, delay=0.05)
    spec = _spec(O.Downpour(), window=3, model_bytes=archive, run="run-f")
    (stats,) = worker.run_partition(spec, 0, 7, [linear_data], client)
    # 100 samples, batch 32: 4 steps; the window of 3 is in flight during step 4, then the flush of 1 step
    assert client.sent == [(0, 3, 96), (1, 1, 4)]
    assert stats["commits"] == 2 and store.metrics()["commits_applied"] == 2
    # one worker: the center holds all the progress, and so does the replica after the merges
    replica = replicas.training_model(spec)
    for got, want in zip(replica.get_weights(), store.center(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_a_task_failing_with_a_commit_in_flight_is_retried_exactly_once(linear_data, tmp_path):
    model = tiny_model()
    archive = model_to_bytes(model)
    store = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, "run-r")
    client = HeldClient(store, hold=False, delay=0.05)
    fault = f"partition=0,step=2,kind=raise,marker={tmp_path / 'fired'}"
    spec = _spec(O.Downpour(), window=1, model_bytes=archive, fault=fault, run="run-r")
    with pytest.raises(RuntimeError, match="injected fault"):
        worker.run_partition(spec, 0, 1, [linear_data], client)  # commits 0 and 1 sent, the second in flight
    assert [s[0] for s in client.sent] == [0, 1]  # the one in flight completed before the task gave up
    (stats,) = worker.run_partition(spec, 0, 2, [linear_data], client)  # Spark's retry, a newer attempt
    keys = [key for key, _ in store.ledger()]
    assert len(keys) == len(set(keys)) == 4  # steps 0-3 applied once each: the retry's 0 and 1 were replays
    assert stats["commits"] == 4 and store.metrics()["replays_dropped"] == 2


def test_spark_model_overlap_setting():
    from elephant import SparkModel

    model = tiny_model()
    assert SparkModel(model, mode="asynchronous", spark=object()).overlap is False
    assert SparkModel(model, mode="hogwild", overlap=True, spark=object()).overlap is True
    with pytest.raises(ConfigError, match="received overlap='yes'"):
        SparkModel(model, overlap="yes", spark=object())
    assert SparkModel(model, mode="synchronous", overlap=True, spark=object()).overlap is True
    with pytest.raises(ConfigError, match="received staleness_bound=2"):
        SparkModel(model, optimizer=O.Downpour(staleness_bound=2), overlap=True, spark=object())


# ------------------------------------------------------------------ the simulator plays the same merge
def test_simulated_overlap_merges_the_reply_after_the_next_step():
    from elephant.optimizers import simulate

    drift = lambda w: [np.full_like(w[0], -1.0)]  # noqa: E731  each SGD step of 0.1 adds 0.1
    schedule = [("pull", 0), ("pull", 1), ("step", 0), ("commit", 0), ("step", 1), ("commit", 1),
                ("step", 0), ("step", 1), ("commit", 0), ("commit", 1), ("finish", 0), ("finish", 1)]
    trace = simulate(O.Downpour(), [np.zeros(1)], [drift, drift], schedule, local_lr=0.1, overlap=True)
    # worker 0 sends 0.1 (center 0.1) and merges after its next step: 0.1 + 0.1 = 0.2; worker 1 sends 0.1
    # (center 0.2), merges to 0.3; their second commits measure from the replies: +0.1 each -> center 0.4
    assert float(trace.center[0][0]) == pytest.approx(0.4)
    assert [float(w.weights[0][0]) for w in trace.workers.values()] == pytest.approx([0.3, 0.4])
    assert trace.staleness == [0, 1, 1, 1]


def test_simulated_overlap_is_refused_where_the_runtime_refuses_it():
    from elephant.optimizers import simulate

    class Blocking(O.Downpour):
        overlaps = False

    with pytest.raises(ConfigError, match="Blocking cannot train on"):
        simulate(Blocking(), [np.zeros(1)], lambda w: [w[0]], [("pull", 0)], overlap=True)
    with pytest.raises(ConfigError, match="staleness_bound=1"):
        simulate(O.Downpour(staleness_bound=1), [np.zeros(1)], lambda w: [w[0]], [("pull", 0)], overlap=True)


# ------------------------------------------------------------------ synchronous rounds
def _drift(rate):
    return lambda w: [np.full_like(w[0], -rate)]  # one SGD step of 0.1 adds 0.1 * rate


def test_simulated_synchronous_overlap_trains_on_while_the_round_closes():
    from elephant.optimizers.simulate import ScheduleError, simulate

    schedule = [("pull", 0), ("pull", 1), ("step", 0), ("commit", 0), ("step", 0), ("step", 1), ("commit", 1),
                ("step", 0), ("step", 1), ("commit", 0), ("commit", 1), ("finish", 0), ("finish", 1)]
    rule = O.ModelAveraging(outer_momentum=0.0)
    trace = simulate(rule, [np.zeros(1)], [_drift(1.0), _drift(3.0)], schedule, local_lr=0.1, overlap=True,
                     mode="synchronous")
    # round 1 averages the sent 0.1 and 0.3: 0.2. Worker 0 took 2 steps since its send (0.1 -> 0.3): 0.4;
    # worker 1 one step (0.3 -> 0.6): 0.5. Round 2 averages their progress from 0.2, weighted by samples
    # (2 steps of +0.1 and 1 step of +0.3): 0.2 + (2 * 0.2 + 0.3) / 3
    assert [float(c[0][0]) for c in trace.centers] == pytest.approx([0.2, 0.2 + 0.7 / 3])
    assert [float(w.weights[0][0]) for w in trace.workers.values()] == pytest.approx([0.2 + 0.7 / 3] * 2)
    with pytest.raises(ScheduleError, match="waits for round 1"):  # at most one round in flight
        simulate(rule, [np.zeros(1)], [_drift(1.0), _drift(3.0)],
                 [("pull", 0), ("pull", 1), ("step", 0), ("commit", 0), ("step", 0), ("commit", 0)],
                 local_lr=0.1, overlap=True, mode="synchronous")


def test_a_synchronous_worker_trains_on_until_the_round_closes_then_merges():
    rule = O.ModelAveraging(outer_momentum=0.0)
    store = Store([np.zeros(2)], rule, "synchronous", 2, "run-s")
    spec = dataclasses.replace(_spec(rule, window=1, run="run-s"), mode="synchronous")
    models = [ArrayModel([np.zeros(2)]) for _ in range(2)]
    windows = [worker._Window(m, InProcessClient(store), spec, k, 1, 64) for k, m in enumerate(models)]
    models[0].set_weights([np.array([1.0, 2.0])])
    windows[0].after_step()  # sends [1, 2]; the round waits for worker 1
    models[0].set_weights([np.array([1.5, 2.5])])  # ... while worker 0 trains on
    assert not windows[0]._inflight[0].done()
    models[1].set_weights([np.array([3.0, 0.0])])
    windows[1].after_step()  # the round closes: center = mean([1, 2], [3, 0]) = [2, 1]
    for w in windows:
        w.settle()
    np.testing.assert_array_equal(models[0].weights[0], [2.5, 1.5])  # center + (now - sent)
    np.testing.assert_array_equal(models[1].weights[0], [2.0, 1.0])  # no progress since its send
    np.testing.assert_array_equal(store.center()[0], [2.0, 1.0])
    for w in windows:
        w.close()


def test_overlap_is_warned_about_where_the_benchmark_measured_a_loss():
    from elephant.fit.start_warnings import overlap_warning

    assert overlap_warning(False, "synchronous", 8, 4) is None
    assert overlap_warning(True, "synchronous", 8, 2) is None  # within a point at 2 workers
    rounds = overlap_warning(True, "synchronous", 8, 4)
    assert "with 4 workers" in rounds and "miss that round's average" in rounds  # the risk
    assert "Use overlap=False or fewer workers" in rounds  # the remedy
    assert check_points_to_the_figures(rounds) == "Commits in flight (SparkModel(overlap=True))"
    short = overlap_warning(True, "asynchronous", 1, 2)
    assert "window of 1 steps" in short and "staleness" in short and "overlap=False" in short
    assert check_points_to_the_figures(short) == "Commits in flight (SparkModel(overlap=True))"
    assert overlap_warning(True, "asynchronous", 4, 2) is not None
    assert overlap_warning(True, "asynchronous", 5, 8) is None
    assert overlap_warning(True, "synchronous", 1, 3) is not None  # a short window warns in synchronous mode too
    assert overlap_warning(True, "hogwild", 1, 1) is None  # one worker: nothing is stale
