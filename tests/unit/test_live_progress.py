"""Keras' progress bar driven by the store's sample count during an epoch (no Spark)."""

import threading
import time


from elephant.fit.progress import LiveProgress


class _Store:
    def __init__(self):
        self.applied, self.reads = 1000, 0  # earlier epochs' samples; the poller's reads of them

    @property
    def samples_applied(self):
        self.reads += 1
        return self.applied

    @samples_applied.setter
    def samples_applied(self, value):
        self.applied = value


class _Progbar:
    verbose = 1

    def __init__(self):
        self.steps, self.lock = [], threading.Lock()

    def on_train_batch_end(self, batch, logs=None):
        with self.lock:
            self.steps.append(batch + 1)


def _shown(bar, step, timeout=30.0):
    """Wait until the bar's last step is ``step`` (the poller's thread runs when the machine lets it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with bar.lock:
            if bar.steps and bar.steps[-1] == step:
                return
        time.sleep(0.005)
    raise AssertionError(f"the bar never showed step {step}; it showed {bar.steps}")


def test_the_bar_advances_with_the_samples_applied_and_never_reaches_the_end_by_itself():
    store, bar = _Store(), _Progbar()
    progress = LiveProgress(bar, store, steps=10, samples=320, interval=0.01).start()
    for trained, step in ((32, 1), (96, 3), (96, 3), (200, 6), (320, 9)):  # the epoch's samples applied so far
        store.samples_applied = 1000 + trained
        _shown(bar, step)
    reads, deadline = store.reads, time.monotonic() + 30.0
    while store.reads < reads + 3 and time.monotonic() < deadline:  # three more polls of the epoch's samples
        time.sleep(0.005)
    progress.stop()
    assert bar.steps == [1, 3, 6, 9]  # 32/320 of 10 steps, then 96, 200, and 320 capped at 9
    assert bar.steps == sorted(set(bar.steps))


def test_the_bar_counts_the_samples_trained_before_the_epochs_job():
    store, bar = _Store(), _Progbar()
    progress = LiveProgress(bar, store, steps=10, samples=320, interval=0.01, done=128).start()
    _shown(bar, 4)  # the driver's head trained 128 samples
    store.samples_applied = 1000 + 64  # and the workers 64 since
    _shown(bar, 6)
    progress.stop()
    assert bar.steps == [4, 6]


def test_no_live_bar_for_verbose_2_or_without_a_progbar():
    store, bar = _Store(), _Progbar()
    bar.verbose = 2
    LiveProgress(bar, store, steps=10, samples=320, interval=0.01).start().stop()
    LiveProgress(None, store, steps=10, samples=320, interval=0.01).start().stop()
    assert bar.steps == []
