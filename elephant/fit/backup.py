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

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from elephant import checkpoint
from elephant.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["MidEpochBackup", "Resume", "built_optimizer", "in_callback_order", "resume_from_backup",
           "rule_identity", "save_backup", "save_inside", "step_positions"]


def rule_identity(mode: str, rule, num_workers: int, shards: int = 1) -> dict[str, Any]:
    """What a saved rule state belongs to; a state is restored only into the same.

    ``shards`` is written only for a sharded server (more than 1), so that the
    identity of an unsharded fit, and its backups of before shards, stay as they were.
    """
    identity = {"name": rule.name, "config": rule.get_config(), "mode": mode, "num_workers": num_workers}
    if shards > 1:
        identity["shards"] = shards
    return identity


@dataclasses.dataclass(frozen=True)
class Resume:
    """Where a fit starts: its first epoch, the rule's server state, the history so far and, for a checkpoint
    saved inside an epoch, each partition's steps of that epoch already applied and the head's steps before them."""

    initial_epoch: int
    rule_state: Any = None
    history: dict = dataclasses.field(default_factory=dict)
    positions: dict[int, int] | None = None
    head_steps: int = 0


def resume_from_backup(model, mode: str, backup, rule, num_workers: int, initial_epoch: int,
                       shards: int = 1) -> Resume:
    """Start from ``backup``'s checkpoint, if it holds one (:class:`Resume`).

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
        return Resume(initial_epoch)
    saved = checkpoint.load(backup.backup_dir, type(rule).__module__)
    if saved is None:
        return Resume(initial_epoch)
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
    if saved.positions is None:
        log.info("resuming from the backup in %s after epoch %d", backup.backup_dir, saved.epochs_done)
        return Resume(saved.epochs_done or initial_epoch, state, saved.history)
    log.info("resuming from the backup in %s inside epoch %d, each partition after the steps it had trained: %s",
             backup.backup_dir, saved.epochs_done + 1, saved.positions)
    return Resume(saved.epochs_done, state, saved.history, saved.positions, saved.head_steps)


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


def save_inside(model, mode: str, backup, snapshot, rule, num_workers: int, epoch: int, history,
                positions: dict[int, int], head_steps: int) -> None:
    """Write the fit's state inside ``epoch`` (0-based) to ``backup``'s directory: the center and the rule's state of
    an unsharded store's ``snapshot``, and each partition's steps of the epoch applied to that center."""
    checkpoint.save(backup.backup_dir, checkpoint.Checkpoint(
        epochs_done=epoch, center=list(snapshot.center),
        optimizer_variables=[np.asarray(v) for v in built_optimizer(model).variables],
        rule_state=snapshot.state, rule=rule_identity(mode, rule, num_workers), history=history,
        positions=positions, head_steps=head_steps,
    ))


def step_positions(entries, spec, pass_steps: Sequence[int]) -> dict[int, int]:
    """Each partition's steps of ``spec``'s pass that the applied ``(key, attempt)`` ``entries`` carried (after the
    head, and after the steps a resumed fit trained before): its commits of the epoch counted, their steps
    from the pass's window schedule (:func:`~elephant.worker.committed_steps`); ``pass_steps[k]`` is partition
    ``k``'s steps in the whole pass after the head."""
    from elephant.worker import committed_steps, resumed_steps

    commits = [0] * len(pass_steps)
    for key, _ in entries:
        if key.epoch == spec.epoch:  # the epoch's applied commits (a rolled-back try's left the ledger with it)
            commits[key.partition] += 1
    positions = {}
    for k, steps in enumerate(pass_steps):
        done = resumed_steps(spec, k)
        positions[k] = done + committed_steps(spec.window, spec.warmup_window, commits[k], steps - done)
    return positions


class MidEpochBackup:
    """Saves the fit inside an epoch: once ``every`` samples more than at the last save are applied
    (``BackupAndRestore(save_freq=N)``, ``N`` global batches), the center, the rule's state and each partition's steps, read from one snapshot of the
    store so that they agree. A thread polls the store while the epoch's job runs; :meth:`stop` ends it."""

    POLL_S = 0.2

    def __init__(self, store, every: int, write: Callable[[Any, dict[int, int]], None], spec,
                 pass_steps: Sequence[int]):
        self.store, self.every, self.write, self.spec, self.pass_steps = store, every, write, spec, pass_steps
        self._stop = threading.Event()
        self._next = store.samples_applied + every
        self._thread = threading.Thread(target=self._run, name="elephant-mid-epoch-backup", daemon=True)

    def start(self) -> MidEpochBackup:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.POLL_S):
            applied = self.store.samples_applied
            if applied >= self._next:
                self._next = applied + self.every
                try:
                    self.save()
                except Exception as exc:  # the epoch goes on; its end writes the next backup
                    log.warning("a backup inside epoch %d failed: %r", self.spec.epoch + 1, exc)

    def save(self) -> None:
        """Write the store's state as it is now, with each partition's steps."""
        snapshot = self.store.snapshot()
        entries = self.store.ledger()[:snapshot.ledger_size]
        self.write(snapshot, step_positions(entries, self.spec, self.pass_steps))


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
