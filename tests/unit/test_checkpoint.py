"""elephant.checkpoint: what a BackupAndRestore file holds, and that a kill never leaves a torn one."""

import json
import os

import numpy as np
import pytest

from elephant import checkpoint
from elephant.errors import ConfigError
from elephant.optimizers.dcasgd import DCASGDState


def _checkpoint(epochs_done=3, state=None, value=1.0):
    return checkpoint.Checkpoint(
        epochs_done=epochs_done,
        center=[np.full((2, 3), value, np.float32), np.arange(3, dtype=np.float32)],
        optimizer_variables=[np.array(7, np.int64), np.array(0.01, np.float32)],
        rule_state=state,
        rule={"name": "downpour", "config": {"window": 4}, "mode": "asynchronous", "num_workers": 2},
        history={"loss": [1.0, 0.5, 0.25]},
    )


def _same(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, DCASGDState):
        return _same(a.mean_square, b.mean_square) and _same(a.backups, b.backups)
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("state", [
    None,
    0.05,  # EASGD's resolved alpha
    {"workers": 2, "gain": 1.5},  # AGN
    {"momentum": 0.75, "buffer": [np.ones(3), np.zeros((2, 2), np.float32)]},  # outer momentum
    {"workers": 2, "gain": 1.0, 0: [np.ones(2)], 1: [np.zeros(2)]},  # ADAG: int keys for the workers' pulls
    DCASGDState(mean_square=[np.ones(2)], backups={1: [np.full(2, 3.0)]}),  # a frozen dataclass
    {"nested": ({"a": [1, 2.5, None, True, "x"]},)},
])
def test_a_checkpoint_round_trips_every_rule_state(tmp_path, state):
    checkpoint.save(str(tmp_path), _checkpoint(state=state))
    loaded = checkpoint.load(str(tmp_path))
    assert loaded.epochs_done == 3 and loaded.state_saved
    assert _same(loaded.rule_state, state)
    assert _same(loaded.center, _checkpoint().center)
    assert _same(loaded.optimizer_variables, _checkpoint().optimizer_variables)
    assert loaded.history == {"loss": [1.0, 0.5, 0.25]} and loaded.rule["config"] == {"window": 4}


def test_no_backup_is_none(tmp_path):
    assert checkpoint.load(str(tmp_path / "missing")) is None


def test_a_kill_during_the_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    checkpoint.save(str(tmp_path), _checkpoint(epochs_done=1, value=1.0))

    def killed(src, dst):
        raise KeyboardInterrupt  # the moment between the written temporary file and the rename

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(str(tmp_path), _checkpoint(epochs_done=2, value=2.0))
    monkeypatch.undo()
    assert os.listdir(tmp_path) == [checkpoint.FILENAME]  # the temporary file is gone too
    loaded = checkpoint.load(str(tmp_path))
    assert loaded.epochs_done == 1 and loaded.center[0][0, 0] == 1.0
    # a SIGKILL leaves the temporary file behind: it is never read
    (tmp_path / f"{checkpoint.FILENAME}.tmp-999").write_bytes(b"torn")
    assert checkpoint.load(str(tmp_path)).epochs_done == 1
    checkpoint.save(str(tmp_path), _checkpoint(epochs_done=2, value=2.0))
    assert checkpoint.load(str(tmp_path)).epochs_done == 2


def test_a_state_that_cannot_be_encoded_is_left_out_and_said(tmp_path, caplog):
    checkpoint.save(str(tmp_path), _checkpoint(state={"fn": lambda x: x}))
    loaded = checkpoint.load(str(tmp_path))
    assert not loaded.state_saved and loaded.rule_state is None and loaded.epochs_done == 3
    assert "cannot be saved (a value of type function)" in caplog.text


def _forged(tmp_path, metadata):
    from safetensors.numpy import save_file

    save_file({"center/0": np.zeros(2, np.float32)}, str(tmp_path / checkpoint.FILENAME), metadata=metadata)


def test_a_file_never_makes_elephant_import_a_foreign_module(tmp_path):
    state = json.dumps({"dataclass": "antigravity:Thing", "fields": {}})
    _forged(tmp_path, {"format": "elephant-backup/1", "epochs_done": "1", "num_center": "1", "num_optimizer": "0",
                       "rule": "{}", "rule_state": state, "state_saved": "true", "history": "{}"})
    with pytest.raises(ConfigError, match="module 'antigravity', which is neither elephant's nor the rule's"):
        checkpoint.load(str(tmp_path))


def test_other_files_are_refused_by_name(tmp_path):
    _forged(tmp_path, {"format": "something-else"})
    with pytest.raises(ConfigError, match="is not an elephant backup \\(format 'something-else'\\)"):
        checkpoint.load(str(tmp_path))
    (tmp_path / checkpoint.FILENAME).write_bytes(b"\x00" * 10)
    with pytest.raises(ConfigError, match="cannot read the backup"):
        checkpoint.load(str(tmp_path))


def test_remove_keeps_the_users_own_files(tmp_path):
    checkpoint.save(str(tmp_path / "a"), _checkpoint())
    checkpoint.remove(str(tmp_path / "a"))
    assert not (tmp_path / "a").exists()
    checkpoint.save(str(tmp_path / "b"), _checkpoint())
    (tmp_path / "b" / "notes.txt").write_text("mine")
    checkpoint.remove(str(tmp_path / "b"))
    assert os.listdir(tmp_path / "b") == ["notes.txt"]
