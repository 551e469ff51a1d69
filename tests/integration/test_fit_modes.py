"""Every mode and commit frequency trains the digits MLP on local Spark."""

import numpy as np
import pytest

from elephant import SparkModel

from .helpers import accuracy, digits_model


# Whole-epoch windows use DynSGD in the asynchronous modes: DOWNPOUR sums the workers'
# epoch-long deltas, which oscillates with Adam (see docs/optimizers.md).
@pytest.mark.parametrize(
    "mode, frequency, optimizer, epochs",
    [
        ("synchronous", "epoch", None, 15),
        ("synchronous", "batch", None, 12),
        ("asynchronous", "epoch", "dynsgd", 12),
        ("asynchronous", "batch", None, 10),
        ("hogwild", "epoch", "dynsgd", 12),
        ("hogwild", "batch", None, 10),
    ],
)
def test_digits_reaches_90_percent(spark, digits, mode, frequency, optimizer, epochs):
    x_train, x_test, y_train, y_test = digits
    sm = SparkModel(digits_model(), mode=mode, frequency=frequency, optimizer=optimizer, num_workers=2, spark=spark)
    history = sm.fit(x_train, y_train, epochs=epochs, batch_size=32, verbose=0)
    acc = accuracy(sm.model, x_test, y_test)
    assert acc >= 0.90, f"{mode}/{frequency}: test accuracy {acc:.3f} after {epochs} epochs"
    assert len(history.history["loss"]) == epochs
    assert history.history["loss"][-1] < history.history["loss"][0]
    metrics = sm.last_metrics
    steps = -(-len(x_train) // 2 // 32)
    if frequency == "epoch":
        expected = epochs if mode == "synchronous" else 2 * epochs
        key = "rounds_applied" if mode == "synchronous" else "commits_applied"
        assert metrics[key] == expected
    else:
        assert metrics["commits_applied" if mode != "synchronous" else "rounds_applied"] >= steps * epochs
    if mode != "synchronous":
        assert "staleness" in history.history


def test_validation_and_callbacks_run_on_the_driver(spark, digits, tmp_path):
    import keras

    x_train, x_test, y_train, y_test = digits
    seen = []

    class Recorder(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append((epoch, dict(logs)))

    csv = tmp_path / "log.csv"
    ckpt = tmp_path / "best.keras"
    sm = SparkModel(digits_model(), mode="asynchronous", frequency="epoch", optimizer="dynsgd", num_workers=2,
                    spark=spark)
    history = sm.fit(
        x_train, y_train, epochs=4, batch_size=32, validation_data=(x_test, y_test), verbose=0,
        callbacks=[Recorder(), keras.callbacks.CSVLogger(str(csv)), keras.callbacks.ModelCheckpoint(str(ckpt)),
                   keras.callbacks.TerminateOnNaN()],
    )
    assert [e for e, _ in seen] == [0, 1, 2, 3]
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(history.history)
    assert csv.read_text().count("\n") == 5  # header + 4 epochs
    restored = keras.saving.load_model(str(ckpt))
    np.testing.assert_allclose(restored.predict(x_test[:8], verbose=0), sm.model.predict(x_test[:8], verbose=0), rtol=1e-5)
    # the driver's validation numbers are those of the center model
    assert history.history["val_accuracy"][-1] == pytest.approx(accuracy(sm.model, x_test, y_test), abs=1e-6)


def test_early_stopping_stops_the_fit(spark, digits):
    import keras

    x_train, _, y_train, _ = digits
    sm = SparkModel(digits_model(), mode="asynchronous", frequency="epoch", num_workers=2, spark=spark)
    stop = keras.callbacks.EarlyStopping(monitor="loss", min_delta=10.0, patience=1)
    history = sm.fit(x_train, y_train, epochs=10, batch_size=32, callbacks=[stop], verbose=0)
    assert len(history.epoch) == 2


@pytest.mark.parametrize("mode, one_job", [("asynchronous", True), ("synchronous", True), ("asynchronous", False)])
def test_a_fits_epochs_run_as_one_spark_job_or_one_each_over_blocks_shipped_once(spark, digits, mode, one_job,
                                                                                 monkeypatch):
    from elephant.fit import resident

    monkeypatch.setattr(resident, "ONE_JOB", one_job)
    x_train, _, y_train, _ = digits
    sc = spark.sparkContext
    sm = SparkModel(digits_model(), mode=mode, frequency="epoch", optimizer=None if mode == "synchronous" else "dynsgd",
                    num_workers=2, spark=spark)
    import keras

    persisted = sc._jsc.getPersistentRDDs().size()
    during = []
    watch = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: during.append(sc._jsc.getPersistentRDDs().size()))
    sm.fit(x_train, y_train, epochs=3, batch_size=32, verbose=0, callbacks=[watch])
    assert during == [persisted] * 3  # numpy shards travel as broadcasts, read once per Python worker: no cache
    assert sm.fit_plan.get("one_job", False) is one_job
    jobs = sc.statusTracker().getJobIdsForGroup(sm.job_group)  # every job of the fit, from its start
    assert len(jobs) == (1 if one_job else 3)  # numpy input: the driver reads its head's rows without a job
    stages = [sc.statusTracker().getJobInfo(j).stageIds for j in sorted(jobs)]
    assert all(len(s) == 1 for s in stages)  # no shuffle: each job is one stage over the shipped blocks
    assert sm.last_metrics["commits_applied" if mode == "asynchronous" else "rounds_applied"] == (6 if mode == "asynchronous" else 3)
    # each partition's optimizer state: new in the first epoch, then kept by the task (one job) or by its process
    states = [sorted(epoch.values()) for epoch in sm.last_report.optimizer_states]
    assert states[0] == ["new", "new"] and (not one_job or states[1:] == [["kept", "kept"]] * 2)
    assert sc._jsc.getPersistentRDDs().size() == persisted


def test_one_job_trains_what_a_job_per_epoch_trains_to_the_bit(spark, digits, monkeypatch):
    """Synchronous rounds are deterministic: the fit's epochs as one job end at the very weights of a job per epoch
    (same samples in the same order, the same optimizer states, the same learning rates)."""
    import keras

    from elephant.fit import resident

    x_train, _, y_train, _ = digits
    weights = {}
    for one_job in (True, False):
        monkeypatch.setattr(resident, "ONE_JOB", one_job)
        lower = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 1e-3 / (1 + epoch))
        sm = SparkModel(digits_model(), mode="synchronous", num_workers=2, spark=spark, seed=7)
        sm.fit(x_train, y_train, epochs=3, batch_size=32, verbose=0, callbacks=[lower])
        assert sm.fit_plan.get("one_job", False) is one_job
        weights[one_job] = sm.model.get_weights()
    for got, want in zip(weights[True], weights[False], strict=True):
        np.testing.assert_array_equal(got, want)


def test_validation_that_overlaps_the_next_epoch_changes_nothing_it_validates_or_trains(spark, digits, monkeypatch):
    """With no callback that could change the next epoch, the tasks train it while the driver validates the one that
    ended: the same weights to the bit, the same validation figures, in one job."""
    from elephant.fit import resident

    x_train, x_test, y_train, y_test = digits
    runs = {}
    for overlap in (True, False):
        monkeypatch.setattr(resident, "OVERLAP_VALIDATION", overlap)
        sm = SparkModel(digits_model(), mode="synchronous", num_workers=2, spark=spark, seed=11)
        history = sm.fit(x_train, y_train, epochs=3, batch_size=32, verbose=0, validation_data=(x_test, y_test))
        assert sm.fit_plan["one_job"] and sm.fit_plan["validation_overlap"] is overlap
        assert len(spark.sparkContext.statusTracker().getJobIdsForGroup(sm.job_group)) == 1
        runs[overlap] = (sm.model.get_weights(), history.history)
    for got, want in zip(runs[True][0], runs[False][0], strict=True):
        np.testing.assert_array_equal(got, want)
    assert runs[True][1] == runs[False][1]  # loss, accuracy and val_* of every epoch


def test_the_driver_reads_the_head_rows_of_numpy_input_that_its_tasks_would_read(spark, digits):
    """The head's rows of numpy shards come from the driver's broadcasts, without a Spark job: the very rows a job
    over the cached blocks gives (each partition's first batches, in the seeded order of its task's pass)."""
    from elephant.config import FitArgs, Settings
    from elephant.fit.classic import ClassicRun
    from elephant.sources import source

    x_train, _, y_train, _ = digits
    sc = spark.sparkContext
    run = ClassicRun(digits_model(), Settings(num_workers=2, seed=3), spark, source(x_train, y_train), FitArgs(),
                     "elephant-test-head-rows")
    try:
        jobs = len(sc.statusTracker().getJobIdsForGroup("elephant-test-head-rows"))
        on_driver = run.head_rows("a-key", 0, 3, 16, 64)
        assert len(sc.statusTracker().getJobIdsForGroup("elephant-test-head-rows")) == jobs
        shipped, run.rdd.elephant_broadcasts = run.rdd.elephant_broadcasts, ()  # as data in Spark: one job
        in_spark = run.head_rows("a-key", 0, 3, 16, 64)
        run.rdd.elephant_broadcasts = shipped  # destroyed by close()
    finally:
        run.close()
    assert len(on_driver) == len(in_spark) == 2 and all(len(part[0]) == 48 for part in on_driver)
    for mine, theirs in zip(on_driver, in_spark, strict=True):
        for a, b in zip(mine, theirs, strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_spark_job_run_by_a_callback_between_epochs_gets_the_slots_the_fits_tasks_held(spark, digits, caplog):
    """The fit's one job holds every task slot of local[2]: a job a callback runs between epochs would wait for them
    forever. The tasks give way (they end, and the next epoch starts a new job), and the callback's job runs."""
    import logging

    import keras

    x_train, _, y_train, _ = digits
    sc = spark.sparkContext
    counted = []
    count = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda e, logs: counted.append(sc.parallelize(range(10), 2).count()) if e == 0 else None)
    sm = SparkModel(digits_model(), mode="asynchronous", num_workers=2, spark=spark)
    with caplog.at_level(logging.INFO, logger="elephant.fit.resident"):
        sm.fit(x_train, y_train, epochs=3, batch_size=32, verbose=0, callbacks=[count])
    assert counted == [10] and sm.fit_plan["one_job"]
    assert "wait for the task slots the fit's tasks hold" in caplog.text
    fit_jobs = [j for j in sc.statusTracker().getJobIdsForGroup(sm.job_group)
                if len(sc.statusTracker().getJobInfo(j).stageIds) == 1]
    assert len(fit_jobs) == 1 + 2  # the first job, the callback's count, the job after it


def test_a_spark_model_warms_the_python_workers_its_jobs_then_use(spark, digits):
    import os

    from elephant import warmup

    sm = SparkModel(digits_model(), num_workers=2, spark=spark)
    assert sm._warm_up is not None and sm._warm_up.wait(120)
    # Earlier tests kill Python workers on purpose, so warm this context again rather than
    # rely on the first SparkModel of the session having done it.
    warmup._STARTED.pop(spark.sparkContext, None)
    warm = warmup.WarmUp.start(spark, 2)
    assert warm.wait(120) and warm.error is None and warm.pids
    alive = _daemon_workers()
    assert set(warm.pids) <= alive
    used = spark.sparkContext.parallelize(range(2), 2).mapPartitions(lambda _: [os.getpid()]).collect()
    # reused, not started again (earlier Arrow jobs may have left more idle workers than the
    # warm-up's two, and the pool may hand out any of them)
    assert set(used) <= alive


def _daemon_workers() -> set[int]:
    """Processes running elephant's worker daemon (the daemon and the workers it forked)."""
    import os

    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if b"elephant.daemon" in f.read():
                        pids.add(int(entry))
            except OSError:
                continue
    return pids


@pytest.mark.parametrize("mode", ["synchronous", "asynchronous", "hogwild"])
def test_a_learning_rate_set_to_zero_by_a_callback_stops_the_center(spark, digits, mode):
    """LearningRateScheduler's rate reaches the workers, and the rule's server velocity follows it."""
    import keras

    x_train, _, y_train, _ = digits
    sm = SparkModel(digits_model(), mode=mode, num_workers=2, spark=spark)
    centers = []
    callbacks = [keras.callbacks.LearningRateScheduler(lambda epoch, lr: 1e-3 if epoch == 0 else 0.0),
                 keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: centers.append(sm.model.get_weights()))]
    sm.fit(x_train, y_train, epochs=3, batch_size=64, verbose=0, callbacks=callbacks)
    assert len(centers) == 3
    assert not np.allclose(centers[0][0], digits_model().get_weights()[0])  # epoch 1 trained
    for later in centers[1:]:
        for got, want in zip(later, centers[0], strict=True):
            np.testing.assert_array_equal(got, want)
    assert float(sm.model.optimizer.learning_rate.numpy()) == 0.0


def test_initial_epoch_and_validation_freq_number_epochs_as_keras_does(spark, digits):
    import keras

    x_train, x_test, y_train, y_test = digits
    seen = []
    sm = SparkModel(digits_model(), mode="asynchronous", num_workers=2, spark=spark)
    history = sm.fit(x_train, y_train, epochs=5, batch_size=64, verbose=0, initial_epoch=2,
                     validation_data=(x_test, y_test), validation_freq=2, validation_batch_size=7,
                     callbacks=[keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: seen.append(e))])
    assert seen == history.epoch == [2, 3, 4]  # epochs 3 to 5 of 5, numbered as Keras numbers them
    assert len(history.history["loss"]) == 3
    assert len(history.history["val_loss"]) == 1  # validated after epoch 4 only (4 % 2 == 0)


def test_verbose_prints_keras_own_progress_lines(spark, digits, capsys):
    x_train, x_test, y_train, y_test = digits
    sm = SparkModel(digits_model(), num_workers=2, spark=spark)
    capsys.readouterr()
    sm.fit(x_train, y_train, epochs=2, batch_size=64, verbose=2, validation_data=(x_test, y_test))
    out = capsys.readouterr().out
    steps = -(-len(x_train) // 64)  # model.fit's steps per epoch at this batch size
    lines = [line for line in out.splitlines() if " - loss: " in line]
    assert "Epoch 1/2" in out and "Epoch 2/2" in out
    assert len(lines) == 2, out
    for line in lines:
        assert line.startswith(f"{steps}/{steps} ") and all(k in line for k in ("accuracy:", "val_accuracy:", "val_loss:"))
    sm.fit(x_train, y_train, epochs=1, batch_size=64, verbose=0)
    assert capsys.readouterr().out == ""
