"""Keras' progress bar driven by the store's sample count during an epoch (no Spark)."""

import threading
import time


from elephant.fit.progress import LiveProgress


class _Store:
    def __init__(self):
        self.samples_applied = 1000  # earlier epochs


class _Progbar:
    verbose = 1

    def __init__(self):
        self.steps, self.lock = [], threading.Lock()

    def on_train_batch_end(self, batch, logs=None):
        with self.lock:
            self.steps.append(batch + 1)


def test_the_bar_advances_with_the_samples_applied_and_never_reaches_the_end_by_itself():
    store, bar = _Store(), _Progbar()
    progress = LiveProgress(bar, store, steps=10, samples=320, interval=0.01).start()
    for trained in (32, 96, 96, 200, 320):  # the epoch's samples applied so far
        store.samples_applied = 1000 + trained
        time.sleep(0.08)
    progress.stop()
    assert bar.steps == [1, 3, 6, 9]  # 32/320 of 10 steps, then 96, 200, and 320 capped at 9
    assert bar.steps == sorted(set(bar.steps))


def test_the_bar_counts_the_samples_trained_before_the_epochs_job():
    store, bar = _Store(), _Progbar()
    progress = LiveProgress(bar, store, steps=10, samples=320, interval=0.01, done=128).start()
    time.sleep(0.08)
    store.samples_applied = 1000 + 64  # the driver's head trained 128 samples, the workers 64 since
    time.sleep(0.08)
    progress.stop()
    assert bar.steps == [4, 6]


def test_no_live_bar_for_verbose_2_or_without_a_progbar():
    store, bar = _Store(), _Progbar()
    bar.verbose = 2
    LiveProgress(bar, store, steps=10, samples=320, interval=0.01).start().stop()
    LiveProgress(None, store, steps=10, samples=320, interval=0.01).start().stop()
    assert bar.steps == []
