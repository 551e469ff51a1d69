"""Finding or creating the SparkSession, Ctrl-C during its jobs, and small decisions about the cluster."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping

from elephant import framework, launch
from elephant.console import TF_LOG_ENV, TF_LOG_QUIET
from elephant.errors import ConfigError
from elephant.launch import is_local

log = logging.getLogger(__name__)

__all__ = [
    "active", "get_or_create", "make_active", "install_interrupt_handler", "task_slots", "ps_host", "check_barrier_slots",
    "configured_master", "session_settings", "job_description", "ps_ports",
    "is_connect", "require_classic",
]

#: What ``spark-submit`` fills in when PySpark starts the JVM for a plain ``python`` process
#: (a "pyspark-shell" launch): there a value equal to one of these is Spark's, not the user's.
SHELL_DEFAULTS = {"spark.master": "local[*]", "spark.app.name": "pyspark-shell", "spark.ui.showConsoleProgress": "true"}


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect client session: no SparkContext, no RDDs, no broadcasts."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def require_classic(spark, what: str) -> None:
    """Raise at once, saying what works instead, when ``what`` needs a SparkContext and ``spark`` is Connect.

    Raises:
        ConfigError: ``spark`` is a Spark Connect session.
    """
    if is_connect(spark):
        raise ConfigError(
            f"{what} needs a classic SparkSession (one with a SparkContext); this session is a Spark Connect "
            "client, which has neither a SparkContext nor RDDs. Under Spark Connect elephant predicts on and "
            "evaluates DataFrames (SparkModel.predict(df), SparkModel.evaluate(df)); to train, run the script "
            "with a classic session on the same cluster (spark-submit, or SparkSession.builder.master(...)). "
            "See docs/cluster.md, 'Spark Connect'."
        )


def active():
    """The active (or last instantiated) SparkSession, else None."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession() or SparkSession._instantiatedSession


def make_active(spark) -> bool:
    """Make the classic session ``spark`` the active one of the calling thread too; whether that was needed.

    PySpark's active session is per thread: one made by another thread (the
    warm-up makes the embedded session) is not what
    ``SparkSession.getActiveSession()`` returns in the user's thread. A
    thread that already has an active session keeps it; a Connect session
    is left as it is.
    """
    from pyspark.sql import SparkSession

    if not isinstance(spark, SparkSession) or is_connect(spark) or SparkSession.getActiveSession() is not None:
        return False
    jvm = spark.sparkContext._jvm
    find_class = getattr(SparkSession, "_get_j_spark_session_class", None)  # PySpark 4: the classic class
    (find_class(jvm) if find_class is not None else jvm.SparkSession).setActiveSession(spark._jsparkSession)
    SparkSession._activeSession = spark
    log.debug("the SparkSession made in another thread is now active in thread %s", threading.current_thread().name)
    return True


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


@contextlib.contextmanager
def interrupt_cancels(sc, group: str) -> Iterator[threading.Event]:
    """Inside the block, Ctrl-C cancels the job group ``group`` and sets the yielded event.

    The cancel runs on a thread of its own: a Py4J call from the signal handler
    would re-enter the connection that is waiting for the job (PySpark 3.5's own
    handler does, and the interrupted job then fails with a ``Py4JError`` instead
    of ``KeyboardInterrupt``). The code waiting for the job sees it fail,
    finds the event set, and raises ``KeyboardInterrupt``. A second Ctrl-C
    interrupts at once. Off the main thread the block runs unchanged.
    """
    interrupted = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return

    def cancel(signum, frame):
        if interrupted.is_set():
            raise KeyboardInterrupt()
        interrupted.set()
        threading.Thread(target=sc.cancelJobGroup, args=(group,), name="elephant-cancel", daemon=True).start()

    previous = signal.signal(signal.SIGINT, cancel)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)
        if interrupted.is_set():
            raise KeyboardInterrupt()


# ---------------------------------------------------------------- the session elephant makes


def configured_master(conf: Mapping[str, str], env: Mapping[str, str]) -> str | None:
    """The master URL the user configured, else None.

    Args:
        conf: the Spark conf a new session starts from (:func:`launch_conf`): what
            ``spark-submit --master``/``--conf``, ``spark-defaults.conf``,
            ``PYSPARK_SUBMIT_ARGS`` and the ``MASTER`` variable set.
        env: the environment (``os.environ``).

    When PySpark starts the JVM for a plain ``python`` process (no
    ``PYSPARK_GATEWAY_PORT``), ``spark-submit`` fills in ``local[*]`` when nothing
    is configured; that value is taken as "none" (a user who configured
    ``local[*]`` gets the same session either way).
    """
    master = conf.get("spark.master") or env.get("MASTER") or None
    if master is not None and _shell_launch(env) and master == SHELL_DEFAULTS["spark.master"]:
        return None
    return master


def session_settings(conf: Mapping[str, str], env: Mapping[str, str], backend: str | None = None) -> dict[str, str]:
    """The settings elephant adds to the session it makes; never one the user configured.

    With no master configured: the embedded ``local[*]`` session on loopback, with
    the UI, console progress bars and Spark's routine WARN lines off, Python
    workers reused and forked from :mod:`elephant.daemon`, TensorFlow's C++
    start-up lines off in them, and the driver's Keras backend given to them
    (``spark.executorEnv.KERAS_BACKEND``). A configured local master (``local[4]``) gets
    the same settings and keeps its value. Any other master (``spark://``,
    ``yarn``, ``k8s://``, ``local-cluster``) keeps the user's configuration:
    only the console progress bars are turned off (and the application named,
    when nothing named it). Loopback driver addresses are never forced there:
    executors elsewhere must reach the driver.

    Args:
        conf: the Spark conf a new session starts from (:func:`launch_conf`).
        env: the environment (``os.environ``).
        backend: the driver's Keras backend; None: the one ``env`` configures
            (:func:`elephant.framework.configured_backend`).
    """
    master = configured_master(conf, env)
    wanted = {"spark.app.name": "elephant"}
    if master is None or is_local(master):
        if master is None:
            wanted["spark.master"] = "local[*]"
        wanted.update({
            "spark.ui.enabled": "false",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.python.worker.reuse": "true",
            "spark.ui.showConsoleProgress": "false",
            "spark.log.level": "ERROR",
            "spark.python.daemon.module": "elephant.daemon",
            f"spark.executorEnv.{TF_LOG_ENV}": env.get(TF_LOG_ENV) or TF_LOG_QUIET,
            f"spark.executorEnv.{framework.BACKEND_ENV}": backend or framework.configured_backend(env),
        })
    else:
        wanted["spark.ui.showConsoleProgress"] = "false"
    shell = _shell_launch(env)
    return {key: value for key, value in wanted.items()
            if key not in conf or (shell and conf[key] == SHELL_DEFAULTS.get(key))}


def _shell_launch(env: Mapping[str, str]) -> bool:
    """Whether PySpark starts (or started) the JVM itself, as ``spark-submit pyspark-shell``."""
    return "PYSPARK_GATEWAY_PORT" not in env


def launch_conf() -> dict[str, str]:
    """The Spark conf a new session starts from, read from the driver's JVM.

    Under ``spark-submit`` that JVM is already running with the submit's
    configuration; from plain ``python`` PySpark starts it here (as building the
    session would a moment later), with ``spark-defaults.conf``,
    ``PYSPARK_SUBMIT_ARGS`` and ``MASTER`` applied, and with elephant's logging
    configuration and loopback address where the user configured none
    (:mod:`elephant.launch`).
    """
    from pyspark import SparkConf, SparkContext

    settings: dict[str, str] = {}
    if SparkContext._gateway is None:
        settings, variables = launch.launch_settings(os.environ, *spark_conf_directory())
        for name, value in variables.items():
            os.environ.setdefault(name, value)
        log.debug("starting the driver's JVM with %s and environment %s", settings, variables)
    SparkContext._ensure_initialized(conf=SparkConf(loadDefaults=False).setAll(settings.items()) if settings else None)
    return dict(SparkConf().getAll())


def spark_conf_directory() -> tuple[dict[str, str], list[str]]:
    """The settings of ``$SPARK_HOME/conf/spark-defaults.conf`` and the names of the files there."""
    try:
        from pyspark.find_spark_home import _find_spark_home

        home = _find_spark_home()
    except Exception:  # PySpark prints and exits when it finds none; the launch will say so again
        home = os.environ.get("SPARK_HOME")
    directory = os.path.join(home, "conf") if home else None
    if directory is None or not os.path.isdir(directory):
        return {}, []
    defaults = os.path.join(directory, "spark-defaults.conf")
    text = ""
    if os.path.isfile(defaults):
        with open(defaults, encoding="utf-8", errors="replace") as f:
            text = f.read()
    return launch.read_defaults(text), sorted(os.listdir(directory))


def get_or_create():
    """The active SparkSession, else a new one: on the configured master, or embedded.

    A master configured anywhere (``spark-submit --master``, ``spark.master`` in
    ``spark-defaults.conf`` or ``PYSPARK_SUBMIT_ARGS``, the ``MASTER`` variable)
    is used with the user's configuration, console progress bars off unless
    configured. Without one the embedded session runs ``local[*]`` on loopback
    (:func:`session_settings`), and its Python workers run this interpreter
    (``PYSPARK_PYTHON`` is set to ``sys.executable`` when unset). Its worker
    daemon is :mod:`elephant.daemon`, which imports Keras' framework once before
    forking workers.
    """
    session = active()
    if session is not None:
        return session
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is not None:  # a context without a session: wrap it as it is
        return SparkSession.builder.getOrCreate()
    conf = launch_conf()
    master = configured_master(conf, os.environ)
    settings = session_settings(conf, os.environ, framework.current_backend())
    if master is None or is_local(master):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        log.info("no active SparkSession; starting an embedded %s session on 127.0.0.1", master or "local[*]")
    else:
        log.info("no active SparkSession; starting one on the configured master %s", master)
    builder = SparkSession.builder
    if "spark.master" in settings:
        builder = builder.master(settings.pop("spark.master"))
    if "spark.app.name" in settings:
        builder = builder.appName(settings.pop("spark.app.name"))
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def local_session(master: str, app_name: str):
    """A loopback-only local SparkSession with the UI, console progress bars and routine logs off, and the heap
    an embedded session gets (:func:`elephant.launch.launch_settings`: none where the user configured one)."""
    from pyspark.sql import SparkSession

    heap = launch.launch_settings(os.environ, *spark_conf_directory())[0].get("spark.driver.memory")
    builder = SparkSession.builder if heap is None else SparkSession.builder.config("spark.driver.memory", heap)
    return (
        builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.python.worker.reuse", "true")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "ERROR")
        .config("spark.python.daemon.module", "elephant.daemon")
        .config(f"spark.executorEnv.{TF_LOG_ENV}", os.environ.get(TF_LOG_ENV) or TF_LOG_QUIET)
        .config(f"spark.executorEnv.{framework.BACKEND_ENV}", framework.current_backend())
        .getOrCreate()
    )


# ---------------------------------------------------------------- the console


@contextlib.contextmanager
def job_description(sc, text: str) -> Iterator[None]:
    """Name the Spark jobs this thread submits inside the block (the Spark UI's Description).

    The previous description (e.g. the one ``setJobGroup`` gave the fit's job
    group) is restored on the way out, also when the block raises.
    """
    previous = sc.getLocalProperty("spark.job.description")
    sc.setJobDescription(text)
    try:
        yield
    finally:
        sc.setLocalProperty("spark.job.description", previous)  # None removes it


# ---------------------------------------------------------------- decisions about the cluster


def task_slots(sc, conf: Mapping[str, str] | None = None) -> int:
    """How many tasks can run at once: default parallelism / cpus per task.

    ``conf``: the session's Spark conf as a mapping, if the caller has read it
    already (None: read from ``sc``; each ``sc.getConf()`` is dozens of Py4J calls).
    """
    cpus = int((conf if conf is not None else sc.getConf()).get("spark.task.cpus", "1"))
    return max(1, sc.defaultParallelism // max(1, cpus))


def check_barrier_slots(num_workers: int, slots: int, staleness_bound: int | None = None, mode: str = "synchronous",
                        hosted: bool = False) -> None:
    """Refuse a fit whose workers must all run at once but cannot.

    Synchronous (barrier) mode needs every worker scheduled at once, and so
    does an SSP ``staleness_bound``: a running worker waits for the slowest
    partition, and one that has not started yet never catches up. So does a
    server ``hosted`` in the epoch's tasks (``ps_placement='executors'``): its
    hosts serve until every partition is done. Spark does not fail fast when a
    barrier stage has more tasks than free slots -- it keeps re-checking for
    minutes -- and an SSP wait would only end at the read timeout, so refuse up
    front.
    """
    if num_workers <= slots:
        return
    if hosted:
        raise ConfigError(
            f"ps_placement='executors' runs all workers at once (the first of them serve the parameter "
            f"server), but num_workers={num_workers} exceeds the {slots} task slots of this Spark "
            "cluster; lower num_workers or use ps_placement='driver'")
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


#: Spark conf key pinning the parameter server's port: ``"50000"`` or a range ``"50000-50100"``
#: (the first free one is taken); unset or ``"0"``: a free port chosen by the system.
PS_PORTS_KEY = "spark.elephant.ps.ports"


def parse_ports(value: str | None) -> list[int]:
    """The ports :data:`PS_PORTS_KEY` allows, in order (``[0]``: any free port).

    Raises:
        ConfigError: not a port or an ascending ``low-high`` range within 1-65535.
    """
    if value is None or not value.strip() or value.strip() == "0":
        return [0]
    low, _, high = value.strip().partition("-")
    try:
        first, last = int(low), int(high or low)
    except ValueError:
        first = last = -1
    if not 1 <= first <= last <= 65535:
        raise ConfigError(f"`{PS_PORTS_KEY}` must be a port or a range like '50000-50100' within 1-65535; "
                          f"received {value!r}")
    return list(range(first, last + 1))


def ps_ports(sc) -> list[int]:
    """The parameter server's allowed ports from the session's conf (:data:`PS_PORTS_KEY`)."""
    return parse_ports(sc.getConf().get(PS_PORTS_KEY, None))


def ps_host(sc) -> str:
    """Address the parameter server binds to and workers connect to.

    Local masters use loopback; on a cluster it is ``spark.driver.host``, the
    address Spark itself tells executors to reach the driver on (Spark sets it
    when the context starts: the ``--conf`` value, else ``SPARK_LOCAL_IP`` or
    the host's address), so a standalone master on 127.0.0.1 with
    ``spark.driver.host=127.0.0.1`` keeps the server on loopback.
    """
    master = sc.master or ""
    if is_local(master):
        return "127.0.0.1"
    return sc.getConf().get("spark.driver.host", "127.0.0.1")
