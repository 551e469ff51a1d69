"""Finding or creating the SparkSession, and small decisions about the cluster."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from elephant.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["active", "get_or_create", "install_interrupt_handler", "task_slots", "ps_host", "check_barrier_slots"]


def active():
    """The active (or last instantiated) SparkSession, else None."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession() or SparkSession._instantiatedSession


def install_interrupt_handler(sc) -> bool:
    """On the main thread, make Ctrl-C cancel ``sc``'s jobs, as PySpark does for a session made there.

    PySpark installs that handler only when the SparkContext is created on the
    main thread; a session made by a background thread (the warm-up) gets it
    here. Python's default SIGINT handler is replaced, nobody else's.
    Returns whether it was installed.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return False

    def cancel_and_interrupt(signum, frame):
        try:
            sc.cancelAllJobs()
        finally:
            raise KeyboardInterrupt()

    signal.signal(signal.SIGINT, cancel_and_interrupt)
    return True


def get_or_create():
    """The active SparkSession, else an embedded local one.

    The embedded session runs ``local[*]`` on loopback with the UI off, and its
    Python workers run this interpreter (``PYSPARK_PYTHON`` is set to
    ``sys.executable`` when unset). Its worker daemon is :mod:`elephant.daemon`,
    which imports TensorFlow once before forking workers.
    """
    session = active()
    if session is not None:
        return session
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    log.info("no active SparkSession; starting an embedded local[*] session on 127.0.0.1")
    return local_session("local[*]", "elephant")


def local_session(master: str, app_name: str):
    """A loopback-only local SparkSession with the UI and console progress bars off."""
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.python.worker.reuse", "true")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.daemon.module", "elephant.daemon")
        .getOrCreate()
    )


def task_slots(sc) -> int:
    """How many tasks can run at once: default parallelism / cpus per task."""
    cpus = int(sc.getConf().get("spark.task.cpus", "1"))
    return max(1, sc.defaultParallelism // max(1, cpus))


def check_barrier_slots(num_workers: int, slots: int, staleness_bound: int | None = None, mode: str = "synchronous") -> None:
    """Refuse a fit whose workers must all run at once but cannot.

    Synchronous (barrier) mode needs every worker scheduled at once, and so
    does an SSP ``staleness_bound``: a running worker waits for the slowest
    partition, and one that has not started yet never catches up. Spark does
    not fail fast when a barrier stage has more tasks than free slots -- it
    keeps re-checking for minutes -- and an SSP wait would only end at the
    read timeout, so refuse up front.
    """
    if num_workers <= slots:
        return
    if mode == "synchronous":
        raise ConfigError(
            f"mode='synchronous' runs all workers at once, but num_workers={num_workers} exceeds "
            f"the {slots} task slots of this Spark cluster; lower num_workers or use mode='asynchronous'"
        )
    if staleness_bound is not None:
        raise ConfigError(
            f"staleness_bound={staleness_bound} makes every worker wait for the slowest one, so all "
            f"num_workers={num_workers} must run at once, but this Spark cluster has {slots} task slots; "
            "lower num_workers or drop the staleness bound"
        )


def ps_host(sc) -> str:
    """Address the parameter server binds to and workers connect to.

    Local masters use loopback; on a cluster it is ``spark.driver.host``, the
    address Spark itself tells executors to reach the driver on.
    """
    master = sc.master or ""
    if master.startswith("local") and not master.startswith("local-cluster"):
        return "127.0.0.1"
    return sc.getConf().get("spark.driver.host", "127.0.0.1")
