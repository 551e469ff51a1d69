"""The defaults train like plain Keras at equal epochs, and say what they add on top of the user's optimizer.

A robust check, not a benchmark (benchmarks/convergence.py has the figures): the digits MLP
compiled with ``Adam(1e-3)``, batch 32, 2 workers, 10 epochs, against ``model.fit`` of the
same model from the same weights on the same data.
"""

import logging
from collections import Counter

import pytest

from elephant import SparkModel

from elephant.fit.window import WARMUP_ROUND_STEPS
from elephant.optimizers.local import asynchrony_lag, lag_window

from .helpers import accuracy, digits_model, plain_keras_accuracy

EPOCHS = 10


@pytest.fixture(scope="module")
def plain_accuracy(digits):
    return plain_keras_accuracy(digits, EPOCHS)


@pytest.mark.parametrize("mode", ["synchronous", "asynchronous"])
def test_default_reaches_plain_keras_accuracy_and_logs_what_it_adds(spark, digits, plain_accuracy, mode, caplog):
    x_train, x_test, y_train, y_test = digits
    sm = SparkModel(digits_model(), mode=mode, num_workers=2, spark=spark)
    with caplog.at_level(logging.INFO, logger="elephant.fit.loop"):
        sm.fit(x_train, y_train, epochs=EPOCHS, batch_size=32, verbose=0)
    acc = accuracy(sm.model, x_test, y_test)
    assert acc >= plain_accuracy - 0.03, f"{mode} default: {acc:.3f} against plain Keras {plain_accuracy:.3f}"
    assert sm.fit_plan["worker_batch_size"] == 16
    assert sm.fit_plan["learning_rate_scale"] == pytest.approx(2 ** 0.5)
    assert all(rate == pytest.approx(1e-3 * 2 ** 0.5, rel=1e-5)  # the tasks trained at it
               for rates in sm.last_report.learning_rates for rate in rates.values())
    assert len(sm.last_report.learning_rates) == EPOCHS
    assert float(sm.model.optimizer.learning_rate) == pytest.approx(1e-3)  # the user's model keeps its rate
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("elephant fit:")]
    assert len(lines) == 1
    assert "plain averaging (no outer step)" in lines[0]
    assert "sqrt(2) = 1.41 times the compiled learning rate" in lines[0] and "sqrt_scaling=False" in lines[0]
    assert "batch_size=32 is the global batch: each worker trains batches of 16" in lines[0]
    assert "batch_split=False" in lines[0]
    # the workers' Adam averages its second moment over as many samples as plain Keras' (beta_2 1 - 0.001/2)
    assert sm.fit_plan["local_moment"] == {"name": "beta_2", "decay": pytest.approx(0.9995), "compiled": 0.999,
                                           "corrects_bias": True}
    assert "with beta_2 0.9995 instead of 0.999" in lines[0] and "decay_scaling=False" in lines[0]
    assert sm.model.optimizer.beta_2 == pytest.approx(0.999)  # the user's model keeps its own


def test_beyond_four_workers_the_driver_trains_the_first_epochs_first_steps_and_the_workers_the_rest(spark, digits,
                                                                                                     caplog):
    x_train, _, y_train, _ = digits
    sm = SparkModel(digits_model(), mode="asynchronous", num_workers=8, spark=spark)  # 8 tasks, 2 at a time
    with caplog.at_level(logging.INFO, logger="elephant.fit"):
        sm.fit(x_train, y_train, epochs=2, batch_size=64, verbose=0)
    plan = sm.fit_plan
    steps = -(-len(x_train) // 64)
    assert plan["head_steps"] == steps // 2 and not plan["learning_rate_warmup"]
    assert (plan["warmup_window"], plan["window"]) == (WARMUP_ROUND_STEPS // 8, lag_window(8))  # 13 steps
    assert any(f"the first {steps // 2} steps of the first epoch trained on the driver" in r.getMessage()
               for r in caplog.records)
    # the rest of each pass of 21 or 22 steps of 8 samples, at sqrt(8) times the rate from its first step:
    # commits after 4, 8 and its last step, then after 13 and the last in the second epoch
    commits = Counter((key.epoch, key.partition) for key, _ in sm.last_ledger)
    assert commits == {(epoch, p): n for epoch, n in ((0, 3), (1, 2)) for p in range(8)}
    assert all(rate == pytest.approx(1e-3 * 8 ** 0.5, rel=1e-5) for rate in sm.last_report.learning_rates[0].values())
    assert int(sm.model.optimizer.iterations) == steps // 2  # the user's optimizer took the head's steps
    # the workers' Adam keeps a running mean 7/8 of half a window younger (momentum_scaling): 9 - 5.6875 steps old
    lag = asynchrony_lag(lag_window(8), 8)  # 7/8 * 13/2
    assert plan["local_momentum"]["lag"] == pytest.approx(lag)
    assert plan["local_momentum"]["decay"] == pytest.approx((9 - lag) / (10 - lag), abs=1e-5)  # 0.768116
    assert float(sm.model.optimizer.beta_1) == pytest.approx(0.9)  # the user's optimizer keeps its own
    assert any("beta_1 0.768116 instead of 0.9" in r.getMessage() for r in caplog.records)


def test_what_the_defaults_add_can_be_switched_off(spark, digits, caplog):
    x_train, _, y_train, _ = digits
    sm = SparkModel(digits_model(), mode="synchronous", frequency="epoch", num_workers=2, spark=spark,
                    optimizer={"name": "modelaveraging", "config": {"outer_momentum": 0.0}}, batch_split=False)
    with caplog.at_level(logging.INFO, logger="elephant"):
        sm.fit(x_train, y_train, epochs=1, batch_size=32, verbose=0)
    assert sm.fit_plan["worker_batch_size"] == 32
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("elephant fit:"))
    assert "plain averaging (no outer step)" in line and "each worker trains batches of 32" in line
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("batch_split=False" in w and "falls behind model.fit" in w for w in warnings)


def test_square_root_scaling_is_decided_at_fit_start_and_logged(spark, digits, caplog):
    """AGN with the model's Adam and the batch split: each delta gets √K on the server, said in the fit-start log."""
    x_train, _, y_train, _ = digits
    sm = SparkModel(digits_model(), mode="asynchronous", optimizer="agn", num_workers=2, spark=spark)
    with caplog.at_level(logging.INFO, logger="elephant.fit.loop"):
        sm.fit(x_train[:256], y_train[:256], epochs=1, batch_size=32, verbose=0)
    assert sm.fit_plan["optimizer"]["sqrt_scaling"] is True
    assert sm.optimizer.sqrt_scaling is None  # the user's rule is left as given, for the next fit
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("elephant fit:"))
    assert "sqrt(2) = 1.41" in line and "sqrt_scaling=False turns it off" in line


@pytest.fixture(scope="module")
def wide_task():
    """A 10-class task drawn by a random teacher network, and a 1.2M-parameter MLP (4.8 MB) for it."""
    import numpy as np

    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, (12_000, 64)).astype("float32")
    teacher = rng.normal(0, 1 / 8, (64, 10)).astype("float32")
    y = np.argmax(np.tanh(x @ teacher) + 0.1 * rng.normal(0, 1, (12_000, 10)), axis=1)

    def model():
        import keras

        keras.utils.set_random_seed(3)
        wide = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1024, activation="relu"),
                                 keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10, activation="softmax")])
        wide.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
        return wide

    plain = model()
    plain.fit(x[:10_000], y[:10_000], epochs=2, batch_size=64, verbose=0)
    return x, y, model, accuracy(plain, x[10_000:], y[10_000:])


@pytest.mark.parametrize("mode", ["synchronous", "asynchronous"])
def test_a_megabyte_model_trains_like_plain_keras_in_two_epochs(spark, wide_task, mode, caplog):
    """The defaults on a 4.8 MB model: windows decided from its size, logged, and plain Keras' accuracy in 2 epochs."""
    x, y, model, plain_accuracy = wide_task
    sm = SparkModel(model(), mode=mode, num_workers=2, spark=spark)
    with caplog.at_level(logging.INFO, logger="elephant.fit.loop"):
        sm.fit(x[:10_000], y[:10_000], epochs=2, batch_size=64, verbose=0)
    acc = accuracy(sm.model, x[10_000:], y[10_000:])
    assert acc >= plain_accuracy - 0.03, f"{mode} default: {acc:.3f} against plain Keras {plain_accuracy:.3f}"
    choice = sm.fit_plan["window_choice"]
    assert choice["model_bytes"] > 4_000_000 and choice["steps_per_pass"] == -(-5_000 // 32)
    assert sm.fit_plan["window"] == choice["window"]
    if mode == "synchronous":
        assert choice["window"] >= choice["floor"] == 8
    else:  # 157 steps per pass, no room for 8 windows of 32: one commit per pass, as measured on small data
        assert choice["window"] is None and choice["per_pass"]
    decisions = [r.getMessage() for r in caplog.records if r.getMessage().startswith("window decision")]
    assert decisions and "MB of weights" in decisions[0] and "ms per commit" in decisions[0]


@pytest.mark.parametrize("one_job", [False, True], ids=["job-per-epoch", "one-job"])
def test_one_worker_trains_as_model_fit_while_its_epochs_move_between_python_workers(spark, digits, one_job,
                                                                                     monkeypatch):
    """Spark gives a task to the Python worker idle longest: a one-task epoch of a job per epoch alternates between
    them, and the worker's Adam moments must follow the partition (elephant.replicas.training_replica): with a fresh
    or an older state every other epoch, the weights drift away from ``model.fit``'s. A fit as one job keeps them in
    its task.
    """
    import numpy as np

    from elephant.fit import resident

    monkeypatch.setattr(resident, "ONE_JOB", one_job)

    x_train, _, y_train, _ = digits
    x, y = x_train[:640], y_train[:640]
    spark.sparkContext.parallelize(range(4), 4).count()  # at least two Python workers idle from here on
    order = np.random.default_rng(0).permutation(len(x))  # the fit's one shuffle of the rows (data.split_numpy)
    reference = digits_model(lr=1e-2)
    reference.fit(x[order], y[order], epochs=4, batch_size=32, shuffle=False, verbose=0)
    sm = SparkModel(digits_model(lr=1e-2), num_workers=1, frequency="epoch", spark=spark)
    sm.fit(x, y, epochs=4, batch_size=32, shuffle=False, verbose=0)
    sources = [states[0] for states in sm.last_report.optimizer_states]
    assert sources[0] == "new" and set(sources[1:]) <= {"kept", "shared"}, sources
    if one_job:
        assert sources[1:] == ["kept"] * 3, sources
    else:
        assert "shared" in sources, sources  # the epochs did move between processes (else this checks nothing)
    for got, want in zip(sm.model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
