"""What the driver shows and calls during a fit: Keras' callbacks, its progress bar, the epoch's logs.

The batches run in Spark tasks, so the driver sees epochs: the callbacks get
their epoch hooks with the logs the partitions reported (:func:`aggregate_logs`),
and :class:`LiveProgress` moves Keras' own progress bar as the commits arrive.
"""

from __future__ import annotations

import threading
from typing import Any

from elephant.inference import mean_logs

__all__ = ["LiveProgress", "aggregate_logs", "batch_hook_warning", "callback_list", "staleness_mean", "task_devices",
           "validates_after"]


def aggregate_logs(results: list[dict[str, Any]]) -> dict[str, float]:
    """The epoch's training logs from the partitions' own (see :func:`elephant.inference.mean_logs`)."""
    return mean_logs([(r["samples"], r.get("logs"), r.get("weight_sum", r["samples"]), r.get("weighted_keys", ()))
                      for r in results])


def task_devices(results: list[dict[str, Any]]) -> str:
    """The devices the partitions reported, for a log line: ``"partition 0: gpu:0, partition 1: gpu:1"``."""
    return ", ".join(f"partition {r['partition']}: {r.get('device', 'cpu')}"
                     for r in sorted(results, key=lambda r: r["partition"]))


def staleness_mean(before: dict, after: dict) -> float | None:
    hist_a = {int(k): v for k, v in (after.get("staleness") or {}).items()}
    hist_b = {int(k): v for k, v in (before.get("staleness") or {}).items()}
    diff = {k: hist_a.get(k, 0) - hist_b.get(k, 0) for k in hist_a}
    count = sum(diff.values())
    return (sum(k * v for k, v in diff.items()) / count) if count else None


def callback_list(model, callbacks, epochs, verbose, steps):
    """The fit's callbacks with History, and Keras' own ProgbarLogger unless ``verbose`` is 0."""
    import keras

    level = 1 if verbose in ("auto", True) else int(verbose)
    cbks = keras.callbacks.CallbackList(
        list(callbacks or []), add_history=True, add_progbar=level != 0, model=model, epochs=epochs,
        verbose=level, steps=steps,
    )
    history = next(c for c in cbks.callbacks if isinstance(c, keras.callbacks.History))
    return cbks, history


class LiveProgress:
    """Moves Keras' progress bar within an epoch as the workers' commits arrive.

    The epoch's Spark job blocks the driver, so a thread polls the store's
    ``samples_applied`` every ``interval`` seconds and shows the samples trained
    as Keras' steps of the global batch (``steps`` per epoch for ``samples``
    samples), never the last one: :meth:`stop`, then the epoch's end, finish the
    line with the epoch's logs, as ``model.fit`` does. Only ``verbose=1`` shows it.
    ``done``: samples of the epoch trained before its job (the driver's head,
    :mod:`elephant.fit.head`), counted from the start; ``since``: the store's
    ``samples_applied`` where the epoch began, if it began before :meth:`start`
    (None: at the start).
    """

    def __init__(self, progbar, store, steps: int, samples: int, interval: float = 0.5, done: int = 0,
                 since: int | None = None):
        self._progbar, self._store, self._steps, self._samples = progbar, store, steps, max(samples, 1)
        self._interval, self._done_before, self._since = interval, done, since
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> LiveProgress:
        if self._progbar is not None and self._progbar.verbose == 1 and self._steps > 1:
            self._start_samples = self._store.samples_applied if self._since is None else self._since
            self._thread = threading.Thread(target=self._run, name="elephant-progress", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        shown = 0
        while not self._done.wait(self._interval):
            trained = self._store.samples_applied - self._start_samples + self._done_before
            step = min(self._steps - 1, trained * self._steps // self._samples)
            if step > shown:
                self._progbar.on_train_batch_end(step - 1)  # the step count, one-indexed by Keras
                shown = step

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()


_BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end")


def _acts_per_batch(callback) -> bool:
    """Whether ``callback`` would do something in a batch hook (Keras' own ones only when set to)."""
    import keras

    base = keras.callbacks.Callback
    if not any(getattr(type(callback), h, None) is not getattr(base, h) for h in _BATCH_HOOKS):
        return False
    if isinstance(callback, (keras.callbacks.ProgbarLogger, keras.callbacks.TerminateOnNaN)):
        return False  # elephant shows its own progress and stops a diverging fit itself
    if isinstance(callback, keras.callbacks.TensorBoard):
        return getattr(callback, "update_freq", "epoch") != "epoch"
    if isinstance(callback, (keras.callbacks.ModelCheckpoint, keras.callbacks.BackupAndRestore)):
        return getattr(callback, "save_freq", "epoch") != "epoch"
    return True


def batch_hook_warning(callbacks) -> str | None:
    """The fit-start warning for callbacks that act in batch hooks, which a distributed fit never calls."""
    names = [type(c).__name__ for c in callbacks or [] if _acts_per_batch(c)]
    if not names:
        return None
    return (
        f"callbacks {names} act on training batches, but the batches run in Spark tasks and the driver sees "
        "epochs only: on_train_batch_begin/end (and on_batch_*) are not called. Their epoch hooks run as usual; "
        "use epoch-level settings (e.g. save_freq='epoch', update_freq='epoch')."
    )


def validates_after(epoch: int, freq: int | tuple[int, ...]) -> bool:
    """Whether Keras would validate after ``epoch`` (0-based) with ``validation_freq=freq``."""
    return (epoch + 1) % freq == 0 if isinstance(freq, int) else epoch + 1 in freq
