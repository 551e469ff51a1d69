"""Start Spark's Python workers, with Keras and its framework in them, before the first fit needs them.

The first Spark job of a session pays for starting its Python workers and for
importing Keras and its framework (TensorFlow, JAX or torch) in them. A
:class:`SparkModel <elephant.SparkModel>` therefore starts a tiny job in a
background thread when it is created: one task per task slot (at most
``num_workers``) that does what a fit's task does first (the driver's Keras
backend set, the task's GPUs placed: :func:`elephant.framework.enter_task`)
and imports Keras and the driver's framework; it runs no train step, which
gained nothing. Spark reuses those Python workers for the fit's tasks
(``spark.python.worker.reuse``, on by default; the driver's backend is in
``sc.environment`` before the job, so they are the fit's pool), so the time the
user spends preparing data between ``SparkModel(...)`` and ``fit`` is taken off
the first fit. Without an active session the thread also makes the embedded one (and
the first ``fit``, on the main thread, installs the Ctrl-C handler PySpark
installs only when a session is made there: cancel all jobs, then raise
``KeyboardInterrupt``).

It runs once per SparkContext. ``fit``, ``evaluate`` and ``predict`` do not wait
for it: their jobs queue behind it in Spark's scheduler and run in the workers
it started, while the driver prepares the fit meanwhile (waiting for it first
was slower). A failure is logged and otherwise ignored: the fit then starts the
workers itself (and raises what was wrong, such as a GPU request on a local
master). Set ``spark.elephant.warmUp=false`` in the session's conf to turn it off.

What it takes off a first fit, and what waiting for it or a train step in it
cost: ``benchmarks/README.md``, "First fit (benchmarks/first_fit.py)".
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from typing import Any

from elephant import framework, gpu

log = logging.getLogger(__name__)

__all__ = ["WarmUp", "CONF_KEY"]

#: Spark conf key that turns the warm-up off when set to ``false``.
CONF_KEY = "spark.elephant.warmUp"

_STARTED: weakref.WeakKeyDictionary[Any, WarmUp] = weakref.WeakKeyDictionary()  # SparkContext -> its warm-up
_LOCK = threading.Lock()


#: Seconds a warm-up task lingers when Keras was already imported (a worker forked from
#: :mod:`elephant.daemon`, or reused), so that the tasks overlap and each starts its own
#: worker instead of the next one reusing the first.
LINGER = 0.3


def _warm_task(_: Any, backend: str = ""):
    """In a Python worker: a task's start, and Keras with its ``backend`` imported (the slow part of a first task).

    ``backend`` ``""``: the one the worker's environment configures.
    """
    import os
    import sys
    import time

    from elephant.console import TF_LOG_ENV, TF_LOG_QUIET

    preloaded = "keras" in sys.modules
    framework.enter_task(backend, "the warm-up task")  # before Keras: the backend and the task's GPUs
    os.environ.setdefault(TF_LOG_ENV, TF_LOG_QUIET)
    framework.preload(backend or framework.configured_backend())
    import keras  # noqa: F401  (after preload: under torch, preload leaves Keras to the task)

    if preloaded:
        time.sleep(LINGER)
    yield os.getpid()


class WarmUp:
    """A background thread that runs the warm-up job once per SparkContext.

    Args:
        spark: the session to warm, or None for the active (else embedded) one.
        num_workers: tasks to start, at most the cluster's task slots; None for
            every slot.
        backend: the Keras backend the workers get; None (default): the driver's
            (:func:`elephant.framework.current_backend`).
    """

    def __init__(self, spark: Any, num_workers: int | None, backend: str | None = None):
        self._spark = spark
        self._num_workers = num_workers
        self.backend = backend or framework.current_backend()
        self.pids: list[int] = []  # Python worker processes that ran a warm-up task
        self.session: Any = spark  # the session warmed (made here when ``spark`` is None and none is active)
        self.made_session = False
        self.ready = threading.Event()  # set once ``session`` is known (or the warm-up failed)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="elephant-warm-up", daemon=True)

    @classmethod
    def start(cls, spark: Any, num_workers: int | None, backend: str | None = None) -> WarmUp | None:
        """Start warming ``spark`` (None: the active or embedded session) unless it is not a classic session."""
        if spark is not None and not _is_classic_session(spark):
            return None  # Spark Connect or a stand-in: nothing to warm here
        warm = cls(spark, num_workers, backend)
        warm._thread.start()
        return warm

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the warm-up has ended (True) or ``timeout`` seconds passed (False)."""
        if self._thread is threading.current_thread():
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            from elephant import session

            spark = self._spark
            if spark is None:
                before = session.active()
                spark = session.get_or_create()
                self.session, self.made_session = spark, before is None
            self.ready.set()
            sc = spark.sparkContext
            conf = sc.getConf()
            if conf.get(CONF_KEY, "true").strip().lower() == "false":
                return
            if conf.get("spark.python.worker.reuse", "true").strip().lower() == "false":
                return  # every task starts a new Python worker: nothing to warm
            with _LOCK:
                if sc in _STARTED:
                    other = _STARTED[sc]
                else:
                    _STARTED[sc], other = self, None
            if other is not None:  # another SparkModel of this context warms it: wait for that one
                other.wait()
                return
            framework.ship(sc, self.backend)  # the fit's pool of Python workers, not another
            gpu.check_request({gpu.TASK_AMOUNT_KEY: conf.get(gpu.TASK_AMOUNT_KEY, None)}, getattr(sc, "master", ""),
                              self.backend, getattr(sc, "environment", {}))
            import elephant.ps.app  # noqa: F401 - the driver's parameter server stack (Flask), imported meanwhile

            tasks = session.task_slots(sc)
            if self._num_workers is not None:
                tasks = min(tasks, self._num_workers)
            sc.setJobDescription(f"elephant: start Python workers and Keras ({self.backend})")
            task = functools.partial(_warm_task, backend=self.backend)
            self.pids = sc.parallelize(range(tasks), tasks).mapPartitions(task).collect()
            log.debug("warm-up ran in Python workers %s", self.pids)
        except Exception as exc:  # best effort: the fit starts the workers itself
            self.error = exc
            log.info("warming up Spark's Python workers failed (%s: %s); the first fit will start them",
                     type(exc).__name__, exc)
        finally:
            self.ready.set()


def _is_classic_session(spark: Any) -> bool:
    try:
        from pyspark.sql import SparkSession
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return False
    return isinstance(spark, SparkSession) and "connect" not in type(spark).__module__
