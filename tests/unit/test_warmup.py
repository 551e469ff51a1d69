"""The background warm-up of Spark's Python workers (elephant.warmup), against a fake SparkContext."""

import os
import threading

import pytest

from elephant import warmup


class _Conf(dict):
    def get(self, key, default=None):
        return super().get(key, default)


class _FakeContext:
    """Records the jobs submitted; ``defaultParallelism`` task slots."""

    def __init__(self, slots=2, conf=None, fail=False, release=None):
        self.defaultParallelism = slots
        self._conf = _Conf(conf or {})
        self.jobs = []  # number of tasks of each job
        self.descriptions = []
        self._fail = fail
        self._release = release

    def getConf(self):
        return self._conf

    def setJobDescription(self, text):
        self.descriptions.append(text)

    def parallelize(self, data, slices):
        context = self

        class _RDD:
            def mapPartitions(self, fn):
                self.fn = fn
                return self

            def collect(self):
                if context._release is not None:
                    context._release.wait(5)
                if context._fail:
                    raise RuntimeError("executor lost")
                context.jobs.append(slices)
                return [os.getpid()] * slices

        assert len(list(data)) == slices
        return _RDD()


class _FakeSession:
    def __init__(self, sc):
        self.sparkContext = sc


def _run(sc, num_workers):
    warm = warmup.WarmUp(_FakeSession(sc), num_workers)
    warm._run()  # synchronously, in this thread
    return warm


def test_one_task_per_slot_at_most_num_workers_and_once_per_context():
    sc = _FakeContext(slots=4)
    first = _run(sc, 3)
    assert sc.jobs == [3] and first.pids == [os.getpid()] * 3 and first.error is None
    assert sc.descriptions == ["elephant: start Python workers and Keras (tensorflow)"]
    second = _run(sc, None)  # a second SparkModel of the same context submits nothing
    assert sc.jobs == [3] and second.pids == []
    other = _FakeContext(slots=2)
    _run(other, None)  # every slot when num_workers is None, capped by the slots otherwise
    capped = _FakeContext(slots=2)
    _run(capped, 8)
    assert other.jobs == [2] and capped.jobs == [2]


@pytest.mark.parametrize("conf", [{warmup.CONF_KEY: "False"}, {"spark.python.worker.reuse": "false"}])
def test_the_conf_turns_it_off_and_so_do_workers_that_are_not_reused(conf):
    sc = _FakeContext(conf=conf)
    warm = _run(sc, 2)
    assert sc.jobs == [] and warm.pids == [] and warm.error is None


def test_a_failure_is_recorded_and_never_raised(caplog):
    sc = _FakeContext(fail=True)
    with caplog.at_level("INFO", logger="elephant.warmup"):
        warm = _run(sc, 2)
    assert isinstance(warm.error, RuntimeError) and sc.jobs == []
    assert "the first fit will start them" in caplog.text


def test_a_second_warm_up_of_a_context_waits_for_the_first():
    release = threading.Event()
    sc = _FakeContext(release=release)
    first = warmup.WarmUp(_FakeSession(sc), 2)
    first._thread.start()
    while sc not in warmup._STARTED:  # the first one owns the context, its job is held
        threading.Event().wait(0.01)
    second = warmup.WarmUp(_FakeSession(sc), 2)
    second._thread.start()
    assert not second.wait(0.2)  # blocked behind the first one's job
    release.set()
    assert second.wait(5) and first.wait(5)
    assert sc.jobs == [2]


def test_only_classic_sessions_are_warmed():
    assert warmup.WarmUp.start(object(), 2) is None
    assert warmup.WarmUp.start(_FakeSession(_FakeContext()), 2) is None


def test_the_task_imports_tensorflow_and_names_its_process():
    import sys

    assert list(warmup._warm_task(0)) == [os.getpid()]
    assert "tensorflow" in sys.modules and "keras" in sys.modules


def test_the_interrupt_handler_cancels_jobs_then_interrupts_and_replaces_only_the_default():
    import signal

    from elephant import session

    class _Cancellable:
        cancelled = 0

        def cancelAllJobs(self):
            self.cancelled += 1

    sc = _Cancellable()
    previous = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        assert session.install_interrupt_handler(sc)
        handler = signal.getsignal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGINT, None)
        assert sc.cancelled == 1
        assert not session.install_interrupt_handler(sc)  # someone's handler (here: ours) is kept
        assert signal.getsignal(signal.SIGINT) is handler
        results = []
        signal.signal(signal.SIGINT, signal.default_int_handler)
        thread = threading.Thread(target=lambda: results.append(session.install_interrupt_handler(sc)))
        thread.start(), thread.join()
        assert results == [False] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
