"""Backups of a fit: Keras' ``BackupAndRestore`` honoured with elephant's own checkpoint.

After each epoch the center, the compiled optimizer's variables, the rule's
server state and the history are saved (:mod:`elephant.checkpoint`); a fit
given the same backup directory resumes after the last saved epoch. The save
runs where the ``BackupAndRestore`` stands in the callback list
(:func:`in_callback_order`), as Keras' own does: a driver that dies in a later
callback's ``on_epoch_end`` resumes after that epoch, and one that dies in an
earlier callback's trains it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from elephant import checkpoint
from elephant.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["built_optimizer", "in_callback_order", "resume_from_backup", "rule_identity", "save_backup"]


def rule_identity(mode: str, rule, num_workers: int, shards: int = 1) -> dict[str, Any]:
    """What a saved rule state belongs to; a state is restored only into the same.

    ``shards`` is written only for a sharded server (more than 1), so that the
    identity of an unsharded fit, and its backups of before shards, stay as they were.
    """
    identity = {"name": rule.name, "config": rule.get_config(), "mode": mode, "num_workers": num_workers}
    if shards > 1:
        identity["shards"] = shards
    return identity


def resume_from_backup(model, mode: str, backup, rule, num_workers: int, initial_epoch: int, shards: int = 1):
    """Start from ``backup``'s checkpoint, if it holds one: ``(initial_epoch, rule_state, history)``.

    ``model`` takes the checkpoint's center and optimizer variables; the
    fit starts after the last saved epoch (as Keras' own ``BackupAndRestore``
    sets it), and the rule's server state is restored when the rule, mode,
    number of workers and of parameter-server shards are those it was saved
    with (a sharded server's state is the list of its shards' states, one per
    shard of the same plan: the plan follows from the weights' shapes and the
    number of shards).

    Raises:
        ConfigError: the checkpoint's weights do not fit the model.
    """
    if backup is None:
        return initial_epoch, None, {}
    saved = checkpoint.load(backup.backup_dir, type(rule).__module__)
    if saved is None:
        return initial_epoch, None, {}
    weights = model.get_weights()
    if [w.shape for w in weights] != [c.shape for c in saved.center]:
        raise ConfigError(f"the backup in {backup.backup_dir!r} holds weights of another model (shapes "
                          f"{[c.shape for c in saved.center][:4]}..., the model's {[w.shape for w in weights][:4]}...); "
                          "remove it or pass another backup_dir")
    model.set_weights(saved.center)
    optimizer = built_optimizer(model)
    variables = optimizer.variables
    if [tuple(v.shape) for v in variables] == [a.shape for a in saved.optimizer_variables]:
        for v, a in zip(variables, saved.optimizer_variables):
            v.assign(a)
    else:
        log.warning("the backup's optimizer variables do not fit %s; it keeps its own", type(optimizer).__name__)
    identity = rule_identity(mode, rule, num_workers, shards)
    state = saved.rule_state if saved.state_saved and saved.rule == identity else None
    if state is None:
        log.warning("resuming without the rule's saved server state (saved for %s); the rule starts afresh",
                    saved.rule)
    log.info("resuming from the backup in %s after epoch %d", backup.backup_dir, saved.epochs_done)
    return saved.epochs_done or initial_epoch, state, saved.history


def built_optimizer(model):
    """The model's optimizer with its variables made (as Keras' own BackupAndRestore builds it to load them)."""
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    return model.optimizer


def save_backup(model, mode: str, backup, store, rule, num_workers: int, epochs_done: int, history,
                shards: int = 1) -> None:
    """Write the fit's state after ``epochs_done`` epochs to ``backup``'s directory.

    The center is the full one (a sharded store's joined); the rule's state is the
    store's (a sharded store's: the list of its shards' states).
    """
    checkpoint.save(backup.backup_dir, checkpoint.Checkpoint(
        epochs_done=epochs_done, center=store.center(),
        optimizer_variables=[np.asarray(v) for v in built_optimizer(model).variables],
        rule_state=store.snapshot().state, rule=rule_identity(mode, rule, num_workers, shards), history=history,
    ))


def in_callback_order(callbacks, backup, write: Callable[[int, dict], None]) -> list:
    """``callbacks`` with ``backup`` replaced, at its place, by a callback whose ``on_epoch_end`` calls ``write``.

    ``write(epoch, logs)`` gets the 0-based epoch and the epoch's logs as the
    callbacks before it left them. Callbacks after it run once the backup is on
    disk, as with Keras' ``BackupAndRestore``.
    """
    import keras

    class WriteBackup(keras.callbacks.Callback):
        """Writes elephant's backup where the user's ``BackupAndRestore`` stood."""

        def on_epoch_end(self, epoch, logs=None):
            write(epoch, logs if logs is not None else {})

    return [WriteBackup() if c is backup else c for c in callbacks or []]
