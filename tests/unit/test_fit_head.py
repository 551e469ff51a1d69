"""The head of the first epoch: its first steps trained on the driver on the global batch (elephant.fit.head)."""

import dataclasses
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402

from elephant import backends, stream, worker  # noqa: E402
from elephant import optimizers as O  # noqa: E402
from elephant.config import Settings  # noqa: E402
from elephant.fit import head as H  # noqa: E402
from elephant.fit import simulated  # noqa: E402
from elephant.fit.plan import plan_fit  # noqa: E402
from elephant.model_io import fingerprint, model_to_bytes  # noqa: E402
from elephant.ps.store import Store  # noqa: E402
from tests.unit.test_worker_loop import RecordingClient  # noqa: E402


def _model(seed=0, optimizer=None):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)])
    m.compile(optimizer or keras.optimizers.Adam(1e-2), "mse")
    return m


def _data(n, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype("float32")
    return x, (x @ np.array([[2.0, -1.0], [0.5, 1.0], [-1.5, 0.3]], "float32")).astype("float32")


def _task(run, **given):
    """A first-epoch task after a head of 2 steps (batches of 4, windows of 2) and a client recording its commits."""
    m = _model()
    model_bytes = model_to_bytes(m)
    client = RecordingClient(Store(m.get_weights(), O.Downpour(), "asynchronous", 4, run))
    spec = worker.TaskSpec(run=run, epoch=0, model_bytes=model_bytes, fingerprint=fingerprint(model_bytes),
                           optimizer=O.Downpour(), window=2, batch_size=4, mode="asynchronous", ps_url="in-process",
                           token="t", read_timeout=5.0, skip_steps=2, **given)
    return spec, client


@pytest.mark.parametrize("pass_steps, steps", [
    (None, 0), (0, 0), (1, 0),                  # a pass of one step, or unknown: no head
    (2, 1), (200, 100), (201, 100),             # half the pass
    (157, 78), (15_625, H.HEAD_STEPS),          # at most HEAD_STEPS
])
def test_the_head_is_at_most_half_a_workers_pass_and_head_steps(pass_steps, steps):
    assert H.head_steps(pass_steps) == steps


@pytest.mark.parametrize("workers, batch, samples, head", [
    (8, 64, 200 * 64, 100),    # the batch split evenly: a pass has the epoch's steps
    (24, 64, 200 * 64, 89),    # batches of ceil(64/24) = 3: passes of 178 steps
    (64, 64, 3_200, 25),       # batches of one sample: passes of 50 steps
    (64, 32, 3_200, 0),        # more workers than the batch has samples: no head, the ramp
])
def test_the_plans_head_is_half_a_workers_pass_and_none_where_the_batch_splits_below_a_sample(workers, batch,
                                                                                               samples, head):
    plan = plan_fit(Settings(mode="synchronous"), _model(), workers, batch, samples=samples)
    assert (plan.head_steps, plan.learning_rate_warmup) == (head, not head)
    assert plan.head_steps * plan.worker_batch_size * workers <= samples / 2 + workers  # the workers train the rest


def test_global_batches_join_each_partitions_batch_of_the_step_in_partition_order():
    a = (np.arange(10).reshape(5, 2), np.arange(5), np.ones(5))
    b = (np.arange(100, 106).reshape(3, 2), np.arange(100, 103), np.full(3, 2.0))
    batches = list(H.global_batches([a, b], steps=4, batch_size=2))
    assert [list(y) for _, y, _ in batches] == [[0, 1, 100, 101], [2, 3, 102], [4]]  # step 4: no rows left
    assert batches[1][2].tolist() == [1.0, 1.0, 2.0]  # the weights follow their rows
    assert batches[0][0].tolist() == [[0, 1], [2, 3], [100, 101], [102, 103]]


def test_global_batches_are_cut_at_the_users_batch_where_the_workers_batches_hold_more():
    a = (np.arange(10).reshape(5, 2), np.arange(5), np.ones(5))
    b = (np.arange(100, 106).reshape(3, 2), np.arange(100, 103), np.full(3, 2.0))
    batches = list(H.global_batches([a, b], steps=4, batch_size=2, global_batch=3))
    assert [list(y) for _, y, _ in batches] == [[0, 1, 100], [101, 2, 3], [102, 4]]  # the steps' rows, in order
    assert batches[1][2].tolist() == [2.0, 1.0, 1.0]


def test_the_head_of_more_workers_than_the_batch_has_samples_trains_plain_keras_batches():
    x, y = _data(24)
    parts = [(x[6 * k: 6 * k + 6], y[6 * k: 6 * k + 6]) for k in range(4)]  # 4 workers, a batch of 2: one row each
    head, plain = _model(), _model()
    assert H.train_head(head, parts, steps=3, batch_size=1, global_batch=2) == 6  # 12 rows in batches of 2
    order = np.array([6 * k + i for i in range(3) for k in range(4)])
    plain.fit(x[order], y[order], batch_size=2, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(head.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_head_trains_what_plain_keras_trains_on_the_global_batches():
    x, y = _data(48)
    parts = [(x[:24], y[:24]), (x[24:], y[24:])]  # two partitions, batches of 4 each: global batches of 8
    head, plain = _model(), _model()
    assert H.train_head(head, parts, steps=3, batch_size=4) == 3
    order = np.concatenate([np.r_[4 * i: 4 * i + 4, 24 + 4 * i: 28 + 4 * i] for i in range(3)])
    plain.fit(x[order], y[order], batch_size=8, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(head.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert int(head.optimizer.iterations) == 3  # the workers start from this optimizer state (in the archive)


def test_heads_of_one_structure_train_on_one_kept_copy_as_each_model_itself_would():
    """A sweep's trials and a notebook's new models: the head trains a copy kept for the structure, traced once,
    and each model ends with the very weights and optimizer state it would have trained itself."""
    from elephant.fit import copies
    from elephant.fit.loop import replica_structure

    x, y = _data(48)
    parts = [(x[:24], y[:24]), (x[24:], y[24:])]
    copies._KEPT.clear()
    taken = []
    for seed, rate in ((0, 1e-2), (1, 3e-2)):
        model, itself = _model(seed, keras.optimizers.Adam(rate)), _model(seed, keras.optimizers.Adam(rate))
        structure = replica_structure(model, None)
        copy = copies.take(model, structure)
        H.train_head(model, parts, steps=3, batch_size=4, trainer=copy)
        copies.give_back(structure, copy)
        H.train_head(itself, parts, steps=3, batch_size=4)
        taken.append(copy)
        for a, b in zip(model.get_weights(), itself.get_weights(), strict=True):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(model.optimizer.variables, itself.optimizer.variables, strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert model.train_function is None  # the model itself was never traced
    assert taken[0] is taken[1] and len(copies._KEPT) == 1  # the second fit's head trained the first's copy


def test_fits_that_run_at_once_take_copies_of_their_own():
    from elephant.fit import copies
    from elephant.fit.loop import replica_structure

    model = _model(2)
    structure = replica_structure(model, None)
    copies._KEPT.clear()
    first, second = copies.take(model, structure), copies.take(model, structure)
    assert first is not second and first is not model
    copies.give_back(structure, first)
    assert copies.take(_model(3), structure) is first


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_task_trains_the_rows_the_head_left_of_its_pass(shuffle, monkeypatch):
    """The head's rows of a partition (partition_head) and the rows its task trains after skip_steps are the
    pass's order, split: disjoint, together all of it, and the task's steps and commits count only its own."""
    x, y = _data(22)
    block = (x, y)
    rows = H.partition_head("key" if shuffle else None, 0, 2, 4)(3, iter([block]))
    assert [p for p, _ in rows] == [3]
    order = stream.pass_order("key" if shuffle else None, 0, 3, 22)
    np.testing.assert_array_equal(rows[0][1][0], x[order[:8]])
    trained = []
    step = backends.Stepper.step
    monkeypatch.setattr(backends.Stepper, "step", lambda self, batch: (trained.append(np.array(batch[0])),
                                                                       step(self, batch))[1])
    spec, client = _task("head", shuffle=shuffle, shuffle_key="key")
    (stats,) = worker.run_partition(spec, 3, 1, [block], client)
    np.testing.assert_array_equal(np.concatenate(trained), x[order[8:]])
    assert stats["steps"] == 4 and [c[1:] for c in client.commits] == [(2, 8), (2, 6)]  # 14 rows, batches of 4
    assert stats["weight_sum"] == 14
    later = dataclasses.replace(spec, epoch=1, skip_steps=0)
    (rows,) = worker.task_blocks(later, 3, [block], 22)  # later epochs: every row, in the epoch's order
    np.testing.assert_array_equal(rows[0], x[stream.pass_order("key" if shuffle else None, 1, 3, 22)])


def test_a_task_whose_rows_the_head_took_all_trains_nothing_and_finishes():
    x, y = _data(6)
    spec, client = _task("all")
    (stats,) = worker.run_partition(spec, 0, 1, [(x, y)], client)
    assert stats["steps"] == 0 and stats["samples"] == 6 and client.commits == []
    assert client.finished == [("all", 0, 0, 1)]


def test_the_simulator_trains_the_head_then_the_workers_at_the_factor_from_their_first_step(monkeypatch):
    x, y = _data(512)
    heads, rates, steps = [], [], []
    train_head = simulated.train_head
    monkeypatch.setattr(simulated, "train_head", lambda model, parts, n, batch, global_batch: (
        heads.append(([len(p[0]) for p in parts], n, batch, global_batch)),
        train_head(model, parts, n, batch, global_batch))[1])
    set_rate = backends.Stepper.set_learning_rate
    monkeypatch.setattr(backends.Stepper, "set_learning_rate", lambda self, rate: (rates.append(rate),
                                                                                    set_rate(self, rate)))
    step = backends.Stepper.step
    monkeypatch.setattr(backends.Stepper, "step", lambda self, batch: (steps.append(len(batch[0])),
                                                                       step(self, batch))[1])
    m = _model(optimizer=keras.optimizers.Adam(1e-3))
    fit = O.simulate_fit(m, x, y, epochs=2, batch_size=64, num_workers=16, mode="synchronous")
    # 8 global steps an epoch: a head of 4 on the driver, 4 rows (one batch) of each of 16 shards of 32 per step
    assert heads == [([16] * 16, 4, 4, 64)]
    assert rates == []  # no ramp: every replica trains at sqrt(16) times the rate from its first step
    assert len(steps) == 16 * 4 + 16 * 8 and set(steps) == {4}  # the first epoch's other half, then a whole one
    assert fit.history["updates"] == [2.0, 1.0]  # the warm-up's windows of 2 while the first 128 steps last
    assert int(m.optimizer.iterations) == 4  # the user's model: the head's steps


@pytest.mark.parametrize("optimizer", [lambda: keras.optimizers.Adam(1e-2),
                                       lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-2))])
@pytest.mark.parametrize("trained_before", [False, True])
def test_the_held_state_gives_back_the_weights_and_optimizer_the_head_changed(optimizer, trained_before):
    """What a fit whose first epoch fails after the head gives back: the weights and every optimizer variable as
    held before it (a fresh optimizer's too: step 0, empty moments, the loss scale's start)."""
    m = _model(optimizer=optimizer())
    x, y = _data(64)
    if trained_before:  # an earlier fit: the held optimizer has steps and moments of its own
        m.train_on_batch(x[:16], y[:16])
    held = H.HeldState(m)
    weights = [np.array(w) for w in m.get_weights()]
    variables = [np.array(v) for v in m.optimizer.variables]
    for i in range(3):  # the head's steps
        m.train_on_batch(x[16 * i:16 * i + 16], y[16 * i:16 * i + 16])
    assert any(not np.array_equal(a, np.array(b)) for a, b in zip(variables, m.optimizer.variables, strict=True))
    held.restore()
    for a, b in zip(weights, m.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(variables, m.optimizer.variables, strict=True):
        np.testing.assert_array_equal(a, np.array(b))
    assert int(m.optimizer.iterations) == (1 if trained_before else 0)
