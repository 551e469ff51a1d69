"""elephant.fit.backup: the backup is written where the BackupAndRestore stands among the callbacks (no Spark)."""

import keras
import pytest

from elephant import checkpoint
from elephant.fit.backup import in_callback_order
from elephant.fit.progress import callback_list

from .helpers import tiny_model


def _recorder(name, events):
    return keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: events.append((name, epoch)))


@pytest.mark.parametrize("position", [0, 1, 2])
def test_the_backup_is_written_at_the_backup_and_restores_place(tmp_path, position):
    events = []
    given = [_recorder("before", events), _recorder("after", events)]
    backup = keras.callbacks.BackupAndRestore(str(tmp_path))
    given.insert(position, backup)
    found, _ = checkpoint.find_backup(given)
    assert found is backup

    callbacks = in_callback_order(given, backup, lambda epoch, logs: events.append(("backup", epoch)))
    assert backup not in callbacks and len(callbacks) == 3  # Keras' own would write its own files
    cbks, _ = callback_list(tiny_model(), callbacks, epochs=2, verbose=0, steps=1)
    cbks.on_train_begin()
    for epoch in range(2):
        cbks.on_epoch_end(epoch, {"loss": 1.0})
    expected = [("before", 0), ("after", 0)]
    expected.insert(position, ("backup", 0))
    assert events == expected + [(name, 1) for name, _ in expected]


def test_the_writer_gets_the_logs_the_callbacks_before_it_left():
    seen = {}
    backup = keras.callbacks.BackupAndRestore("unused")
    adds = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: logs.update(extra=2.0))
    callbacks = in_callback_order([adds, backup], backup, lambda epoch, logs: seen.update(logs, epoch=epoch))
    keras.callbacks.CallbackList(callbacks).on_epoch_end(4, {"loss": 0.5})
    assert seen == {"loss": 0.5, "extra": 2.0, "epoch": 4}


def test_without_a_backup_the_callbacks_are_kept_as_given():
    given = [keras.callbacks.History()]
    assert in_callback_order(given, None, lambda epoch, logs: pytest.fail("no backup")) == given
