"""How elephant starts the driver's JVM when it makes the session: without Spark's start-up lines.

From a plain ``python`` process PySpark starts the JVM itself (``spark-submit
pyspark-shell``). With no logging configuration of the user's, Spark then
prints, before anything the script prints: ``Using Spark's default log4j
profile``, ``Setting default log level to "WARN"`` and its hint, Hadoop's
``Unable to load native-hadoop library``, and, on a machine whose hostname
resolves to a loopback address, ``Your hostname ... resolves to a loopback
address``. When elephant makes the session it starts that JVM
(:func:`elephant.session.launch_conf`), and it starts it:

- with the log4j2 configuration shipped in the package (``log4j2.properties``:
  Spark's defaults at the WARN level Spark gives a shell, Hadoop's native-library
  line at ERROR), passed as the driver's Java option
  ``-Dlog4j2.configurationFile``, so Spark prints neither which profile it uses
  nor that it set a level. Spark's warnings and errors still reach stderr.
- for a local master, with ``SPARK_LOCAL_IP=127.0.0.1`` in its environment: the
  address is given, so the hostname check has nothing to say (and the
  embedded session is on loopback anyway).
- for a local master, with a heap of a quarter of the machine's memory (at
  least Spark's default of 1 GiB; :func:`local_driver_memory`): in local mode
  that one JVM holds every executor's share of the data, and a fit of numpy
  arrays keeps each worker's block there (shipped once as a broadcast, then
  cached), so Spark's 1 GiB ran out on 300 MB of training data.

The user's configuration wins. No logging configuration is passed when the
JVM is not elephant's to start (``spark-submit``, a running context), or when
the user configured Spark's logging or the driver's Java options anywhere:
``SPARK_CONF_DIR``, a ``log4j2`` file in ``$SPARK_HOME/conf``,
``spark.driver.extraJavaOptions`` or ``spark.driver.defaultJavaOptions`` in
``spark-defaults.conf`` or ``PYSPARK_SUBMIT_ARGS`` (``--driver-java-options``
too), a ``--properties-file``, or ``log4j`` in ``SPARK_SUBMIT_OPTS``,
``JAVA_TOOL_OPTIONS``, ``JDK_JAVA_OPTIONS`` or ``_JAVA_OPTIONS``.
``SPARK_LOCAL_IP`` is set only when neither it nor ``SPARK_LOCAL_HOSTNAME`` is,
no ``spark.driver.host`` is configured, and the configured master (``MASTER``,
``--master``, ``spark.master``) is local or absent; the heap only when that master
is local or absent and no driver memory is configured (``spark.driver.memory``,
``--driver-memory``, ``SPARK_DRIVER_MEMORY``, a ``--properties-file`` or
``SPARK_CONF_DIR``, whose settings may hold it).
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import shlex
from collections.abc import Iterable, Mapping

log = logging.getLogger(__name__)

__all__ = ["LOG_CONFIG", "is_local", "launch_settings", "local_driver_memory", "logging_configured", "read_defaults",
           "submit_conf"]

#: The log4j2 configuration elephant starts the driver's JVM with (shipped as package data).
LOG_CONFIG = pathlib.Path(__file__).with_name("log4j2.properties")

#: The driver's Java options: where the log configuration is passed, and where a user's would be.
JAVA_OPTIONS = ("spark.driver.extraJavaOptions", "spark.driver.defaultJavaOptions")

#: Variables whose Java options reach the driver's JVM: ``log4j`` in one is the user's logging.
JAVA_OPTION_VARIABLES = ("SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")


def local_driver_memory(physical_bytes: int | None = None) -> str:
    """The heap elephant gives a local master's JVM: a quarter of ``physical_bytes``, at least 1 GiB, as ``"<MiB>m"``.

    Args:
        physical_bytes: the machine's memory; None: read from the operating system
            (1 GiB, Spark's own default, where it cannot be read).
    """
    if physical_bytes is None:
        try:
            physical_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, OSError, ValueError):  # no sysconf (Windows) or no such name
            physical_bytes = 0
    return f"{max(1024, physical_bytes // 4 // 2**20)}m"


def is_local(master: str) -> bool:
    """Whether ``master`` runs executors inside the driver's JVM (``local``, ``local[N]``, ``local[N,F]``)."""
    return master.startswith("local") and not master.startswith("local-cluster")


def submit_conf(submit_args: str) -> dict[str, str]:
    """The settings ``PYSPARK_SUBMIT_ARGS`` gives ``spark-submit``, as Spark conf keys.

    ``--conf k=v``, ``--master``, ``--driver-java-options`` (as
    ``spark.driver.extraJavaOptions``), ``--driver-memory`` (as
    ``spark.driver.memory``) and ``--properties-file`` (kept under its
    option's name). A later value wins, as in ``spark-submit``.
    """
    try:
        words = shlex.split(submit_args)
    except ValueError:  # unbalanced quotes: spark-submit will say so itself
        words = submit_args.split()
    options = {"--master": "spark.master", "--driver-java-options": "spark.driver.extraJavaOptions",
               "--driver-memory": "spark.driver.memory", "--properties-file": "--properties-file"}
    conf: dict[str, str] = {}
    for i, word in enumerate(words):
        name, eq, inline = word.partition("=")
        value = inline if eq else (words[i + 1] if i + 1 < len(words) else "")
        if name in options:
            conf[options[name]] = value
        elif word in ("--conf", "-c") and i + 1 < len(words):
            key, _, setting = words[i + 1].partition("=")
            conf[key] = setting
    return conf


def read_defaults(text: str) -> dict[str, str]:
    """The settings of a ``spark-defaults.conf`` (``key value`` or ``key=value`` lines, ``#`` comments)."""
    conf = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")):
            key, value = re.match(r"([^\s=:]+)\s*[=:\s]?\s*(.*)", line).groups()
            conf[key] = value.strip()
    return conf


def logging_configured(env: Mapping[str, str], conf: Mapping[str, str], conf_files: Iterable[str]) -> str | None:
    """Where the user configured the driver's logging or Java options (a phrase for the log), else None.

    Args:
        env: the environment the JVM would start with.
        conf: the settings ``spark-submit`` would read (``spark-defaults.conf``, then ``PYSPARK_SUBMIT_ARGS``).
        conf_files: the names of the files in Spark's conf directory (``$SPARK_HOME/conf``).
    """
    if env.get("SPARK_CONF_DIR"):
        return f"SPARK_CONF_DIR={env['SPARK_CONF_DIR']!r}"
    logs = sorted(name for name in conf_files if name.startswith("log4j"))
    if logs:
        return f"{logs[0]} in Spark's conf directory"
    for key in (*JAVA_OPTIONS, "--properties-file"):
        if conf.get(key):
            return f"{key}={conf[key]!r}"
    for name in JAVA_OPTION_VARIABLES:
        if "log4j" in env.get(name, ""):
            return f"log4j in {name}"
    return None


def launch_settings(env: Mapping[str, str], defaults: Mapping[str, str] | None = None,
                    conf_files: Iterable[str] = ()) -> tuple[dict[str, str], dict[str, str]]:
    """The Spark conf and the environment variables elephant adds when it starts the driver's JVM.

    Returns ``({}, {})`` when the JVM is not elephant's to start (``PYSPARK_GATEWAY_PORT``
    set: ``spark-submit`` started it). See the module's docstring for what is added, and when.

    Args:
        env: the environment (``os.environ``).
        defaults: the settings of ``$SPARK_HOME/conf/spark-defaults.conf`` (:func:`read_defaults`).
        conf_files: the names of the files in ``$SPARK_HOME/conf``.
    """
    if "PYSPARK_GATEWAY_PORT" in env:
        return {}, {}
    conf = {**(defaults or {}), **submit_conf(env.get("PYSPARK_SUBMIT_ARGS", ""))}
    settings: dict[str, str] = {}
    variables: dict[str, str] = {}
    users = logging_configured(env, conf, conf_files)
    if users is None:
        settings[JAVA_OPTIONS[0]] = f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}"
    else:
        log.debug("Spark's logging is the user's (%s): the driver's JVM starts without elephant's", users)
    master = conf.get("spark.master") or env.get("MASTER")
    own_address = {"SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME"} & set(env) or "spark.driver.host" in conf
    local = (master is None or is_local(master)) and "--properties-file" not in conf
    if local and not own_address:
        variables["SPARK_LOCAL_IP"] = "127.0.0.1"
    if local and "spark.driver.memory" not in conf and not {"SPARK_DRIVER_MEMORY", "SPARK_CONF_DIR"} & set(env):
        settings["spark.driver.memory"] = local_driver_memory()
    return settings, variables
