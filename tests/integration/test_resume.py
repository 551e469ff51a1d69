"""Resuming a fit the Keras way: BackupAndRestore and initial_epoch (T03, T15)."""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from elephant import SparkModel, checkpoint

from .helpers import accuracy, digits_model
from .test_failures import _port_is_free


class _Crash(Exception):
    pass


def test_a_fit_resumes_after_the_last_saved_epoch(spark, digits, tmp_path):
    import keras

    x_train, x_test, y_train, y_test = digits
    backup_dir = str(tmp_path / "backup")

    def crash_after_second_epoch(epoch, logs):
        if epoch == 1:
            raise _Crash()  # in epoch 2's on_epoch_end, after BackupAndRestore's place: its checkpoint is written

    rule = {"name": "modelaveraging", "config": {"outer_momentum": 0.5}}  # a server state to save and restore
    sm = SparkModel(digits_model(), mode="synchronous", num_workers=2, spark=spark, optimizer=rule)
    with pytest.raises(_Crash):
        sm.fit(x_train, y_train, epochs=4, batch_size=32, verbose=0,
               callbacks=[keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.5e-3),
                          keras.callbacks.BackupAndRestore(backup_dir),
                          keras.callbacks.LambdaCallback(on_epoch_end=crash_after_second_epoch)])
    saved = checkpoint.load(backup_dir)
    assert saved.epochs_done == 2 and len(saved.history["loss"]) == 2
    assert saved.rule["name"] == "modelaveraging" and saved.rule_state["buffer"]  # the outer momentum buffer

    seen = {}
    resumed = SparkModel(digits_model(seed=5), mode="synchronous", num_workers=2, spark=spark,  # as a fresh process
                         optimizer=rule)
    probe = keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: seen.update(weights=resumed.model.get_weights(),
                                                lr=float(resumed.model.optimizer.learning_rate.numpy())))
    history = resumed.fit(x_train, y_train, epochs=4, batch_size=32, verbose=0,
                          callbacks=[keras.callbacks.BackupAndRestore(backup_dir), probe])
    assert history.epoch == [2, 3]  # epochs 0 and 1 are not trained again, as in Keras
    for a, b in zip(seen["weights"], saved.center, strict=True):
        np.testing.assert_array_equal(a, b)
    assert seen["lr"] == pytest.approx(0.5e-3)  # the rate the scheduler set before the crash
    assert not os.path.exists(backup_dir)  # removed at the end, as Keras' delete_checkpoint=True does
    assert accuracy(resumed.model, x_test, y_test) > 0.75  # 0.84 measured (4 epochs, the rate halved)


def test_a_backup_of_another_model_is_refused_by_name(spark, digits, tmp_path):
    import keras

    x_train, _, y_train, _ = digits
    checkpoint.save(str(tmp_path), checkpoint.Checkpoint(
        epochs_done=1, center=[np.zeros((3, 3), np.float32)], optimizer_variables=[], rule_state=None,
        rule={}, history={}))
    sm = SparkModel(digits_model(), num_workers=2, spark=spark)
    with pytest.raises(Exception, match="holds weights of another model"):
        sm.fit(x_train, y_train, epochs=1, verbose=0, callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path))])


_SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["PYSPARK_PYTHON"] = sys.executable
    import keras, numpy as np
    from pyspark.sql import SparkSession
    from sklearn.datasets import load_digits
    from elephant import SparkModel

    backup_dir, kill_after = sys.argv[1], int(sys.argv[2])
    spark = (SparkSession.builder.master("local[2]").appName("elephant-resume-test")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    sm = SparkModel(model, mode="synchronous", num_workers=2, spark=spark)

    def report(epoch, logs):
        print(f"epoch {epoch} port {sm.ps_url.rsplit(':', 1)[1]}", flush=True)

    def die(epoch, logs):
        if epoch + 1 == kill_after:
            os._exit(17)  # the driver dies in a callback after BackupAndRestore's: this epoch's backup is written

    sm.fit(x, y, epochs=4, batch_size=32, verbose=0,
           callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=report), keras.callbacks.BackupAndRestore(backup_dir),
                      keras.callbacks.LambdaCallback(on_epoch_end=die)])
    print("accuracy", float(np.mean(np.argmax(sm.model.predict(x, verbose=0), axis=1) == y)), flush=True)
""")


def test_a_killed_driver_resumes_after_the_epoch_its_backup_holds(tmp_path):
    """T03/T15: the driver exits in a callback after BackupAndRestore's in epoch 3 of 4 (0-based 2), after that
    epoch's backup, as Keras writes it at its place in the list; the same script run again trains epoch 3 only."""
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    backup_dir = str(tmp_path / "backup")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.run([sys.executable, str(script), backup_dir, "3"], capture_output=True, text=True,
                           timeout=300, env=env)
    killed_at = time.monotonic()
    assert first.returncode == 17, first.stderr[-2000:]
    epochs = [line.split() for line in first.stdout.splitlines() if line.startswith("epoch")]
    assert [e[1] for e in epochs] == ["0", "1", "2"]
    port = int(epochs[-1][3])
    while not _port_is_free(port) and time.monotonic() - killed_at < 2.0:
        time.sleep(0.05)
    assert _port_is_free(port), "the dead driver's parameter server port is still taken"
    assert checkpoint.load(backup_dir).epochs_done == 3  # epoch 3's backup was written before the later callback
    deadline = time.monotonic() + 15  # the dead driver's JVM exits when its stdin closes
    while time.monotonic() < deadline and _processes_of(str(script)):
        time.sleep(0.2)
    assert not _processes_of(str(script)), "the dead driver left processes behind"

    second = subprocess.run([sys.executable, str(script), backup_dir, "0"], capture_output=True, text=True,
                            timeout=300, env=env)
    assert second.returncode == 0, second.stderr[-2000:]
    assert [line.split()[1] for line in second.stdout.splitlines() if line.startswith("epoch")] == ["3"]
    final = float(next(line.split()[1] for line in second.stdout.splitlines() if line.startswith("accuracy")))
    assert final > 0.85  # plain model.fit of this script reaches 0.885 after the same 4 epochs
    assert not os.path.exists(backup_dir)


def _processes_of(marker):
    """PIDs whose command line mentions ``marker`` or whose parent chain started from it (JVMs of the script)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline or "elephant-resume-test" in cmdline:
            out.append(int(pid))
    return out


def test_a_fit_stopped_inside_its_epoch_resumes_after_the_steps_its_last_save_holds(spark, digits, tmp_path,
                                                                                    monkeypatch):
    """BackupAndRestore(save_freq=N) inside a one-epoch fit: Ctrl-C once a save inside the epoch holds steps of both
    partitions (partition 1 held at its step 12 meanwhile); the next fit goes on after those steps, none twice."""
    import threading

    import keras

    from elephant import data as D

    from .test_failures import _send_ctrl_c_when

    x_train, x_test, y_train, y_test = digits
    backup_dir, release = str(tmp_path / "backup"), tmp_path / "release"
    monkeypatch.setenv("ELEPHANT_FAULT", f"partition=1,step=12,kind=wait,marker={tmp_path / 'held'},release={release}")

    def saved_inside():
        saved = checkpoint.load(backup_dir)  # written by atomic renames: never a torn file
        return saved is not None and saved.positions is not None and min(saved.positions.values()) >= 8

    stop = threading.Event()
    sent = _send_ctrl_c_when(saved_inside, stop)
    sm = SparkModel(digits_model(), mode="asynchronous", frequency=4, num_workers=2, spark=spark)
    try:
        with pytest.raises(KeyboardInterrupt):
            sm.fit(x_train, y_train, epochs=1, batch_size=32, verbose=0,
                   callbacks=[keras.callbacks.BackupAndRestore(backup_dir, save_freq=2)])
    finally:
        stop.set()
        release.touch()
    assert sent.is_set()
    saved = checkpoint.load(backup_dir)
    assert saved.epochs_done == 0 and saved.positions[1] <= 12  # partition 1 never passed its step 12

    monkeypatch.delenv("ELEPHANT_FAULT")
    resumed = SparkModel(digits_model(seed=5), mode="asynchronous", frequency=4, num_workers=2, spark=spark)
    history = resumed.fit(x_train, y_train, epochs=1, batch_size=32, verbose=0,
                          callbacks=[keras.callbacks.BackupAndRestore(backup_dir, save_freq=2)])
    assert history.epoch == [0] and resumed.fit_plan["resumed_steps"] == saved.positions
    batch, head = resumed.fit_plan["worker_batch_size"], saved.head_steps
    sizes = [len(block[0]) for block in D.split_numpy(x_train, y_train, 2, seed=0)]
    left = sum(max(0, n - (head + saved.positions[k]) * batch) for k, n in enumerate(sizes))
    assert 0 < left < len(x_train) and resumed.last_metrics["samples_applied"] == left  # each step once
    assert not os.path.exists(backup_dir)
    whole = SparkModel(digits_model(), mode="asynchronous", frequency=4, num_workers=2, spark=spark)
    whole.fit(x_train, y_train, epochs=1, batch_size=32, verbose=0)  # the same fit, not stopped
    assert accuracy(resumed.model, x_test, y_test) >= accuracy(whole.model, x_test, y_test) - 0.1
