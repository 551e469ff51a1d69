"""GPU placement: the GPUs Spark assigns a task become the only ones its framework sees.

Spark schedules GPUs as a task resource (``spark.task.resource.gpu.amount``)
and tells a task the *addresses* it was given
(``TaskContext.get().resources()["gpu"].addresses``); it never sets
``CUDA_VISIBLE_DEVICES`` itself. Before the framework starts, each elephant
task therefore:

1. maps its addresses to CUDA device ids (:func:`owned_devices`): integer
   addresses without zero padding; when the executor already had
   ``CUDA_VISIBLE_DEVICES`` (a container or YARN limiting the executor to some
   GPUs), the addresses index into that list, as Spark's TorchDistributor reads them;
2. sets ``CUDA_VISIBLE_DEVICES`` to them, and ``TF_FORCE_GPU_ALLOW_GROWTH=true``
   and ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` unless the user set those
   (:func:`gpu_environment`): TensorFlow and JAX would otherwise take most of
   the GPU's memory at their first operation, whatever the task needs;
3. remembers, per Python worker process, the GPUs it was bound to. Spark
   reuses Python workers, and elephant keeps Keras replicas in them, but a
   framework reads ``CUDA_VISIBLE_DEVICES`` once, when it starts its devices:
   a later task in the same process assigned another GPU would silently run
   on the first. Such a task fails with a :class:`ConfigError` instead
   (:func:`check_binding`); one GPU per executor, or
   ``spark.python.worker.reuse=false``, avoids it.

The task reports its device (``"gpu:<ids>"`` or ``"cpu"``) in its statistics.
On the driver :func:`check_request` refuses GPU requests that cannot work.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence

from elephant.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["GPU_DEFAULTS", "TASK_AMOUNT_KEY", "VISIBLE_DEVICES", "check_binding", "check_request", "describe_request",
           "device_name", "gpu_environment", "owned_devices", "place", "place_task"]

#: The variable CUDA reads (once, when it starts) to choose the devices a process sees.
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"

#: Set in a GPU task unless the user set them: allocate GPU memory as needed, not up front.
GPU_DEFAULTS = {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}

#: The Spark conf key of the GPUs each task is given.
TASK_AMOUNT_KEY = "spark.task.resource.gpu.amount"

_ADDRESS = re.compile(r"0|[1-9][0-9]*")



class _Placement:
    """This Python worker's placement, kept across its tasks."""

    captured = False  # whether ``original`` was read (by the process's first GPU task)
    original: str | None = None  # the executor's own CUDA_VISIBLE_DEVICES, before a task changed it (None: unset)
    bound: tuple[str, ...] | None = None  # the device ids the process is bound to (None: none yet)


_PROCESS = _Placement()


def owned_devices(addresses: Sequence[str], visible: str | None) -> list[str]:
    """The CUDA device ids of a task's GPU ``addresses``.

    Args:
        addresses: the addresses Spark assigned the task (``ResourceInformation.addresses``).
        visible: the executor's ``CUDA_VISIBLE_DEVICES`` before any task changed it (None: unset);
            when set, the addresses are indices into its comma-separated list.

    Raises:
        ConfigError: an address that is not a non-negative integer without zero padding, or an
            index beyond the executor's ``CUDA_VISIBLE_DEVICES``.
    """
    addresses = [str(a).strip() for a in addresses]
    bad = [a for a in addresses if not _ADDRESS.fullmatch(a)]
    if bad:
        raise ConfigError(
            f"GPU addresses must be integers without zero padding (CUDA device numbers, as the discovery script "
            f"prints them); received the task's addresses {addresses}, of which {bad} are not")
    if visible is None:
        return addresses
    listed = [d.strip() for d in visible.split(",") if d.strip()]
    beyond = [a for a in addresses if int(a) >= len(listed)]
    if beyond:
        raise ConfigError(
            f"the executor's CUDA_VISIBLE_DEVICES={visible!r} lists {len(listed)} devices, so GPU addresses index "
            f"into it; received addresses {addresses}, of which {beyond} are beyond it. Make the discovery script "
            "print indices into CUDA_VISIBLE_DEVICES (0 to n-1), or unset CUDA_VISIBLE_DEVICES for the executors")
    return [listed[int(a)] for a in addresses]


def gpu_environment(devices: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """The variables a task on CUDA ``devices`` sets: the devices, and the lazy allocators the user did not set."""
    variables = {VISIBLE_DEVICES: ",".join(devices)}
    variables.update({name: value for name, value in GPU_DEFAULTS.items() if name not in env})
    return variables


def device_name(devices: Sequence[str] | None) -> str:
    """``"gpu:1"``, ``"gpu:0,1"``, or ``"cpu"`` for no GPUs."""
    return f"gpu:{','.join(devices)}" if devices else "cpu"


def check_binding(bound: Sequence[str] | None, devices: Sequence[str], started: bool, where: str) -> None:
    """Refuse a task on ``devices`` in a process whose framework already started on ``bound``.

    Args:
        bound: the device ids an earlier task bound this process to (None: none did).
        devices: this task's device ids.
        started: whether the framework may have read ``CUDA_VISIBLE_DEVICES`` in this process.
        where: the task, for the message.

    Raises:
        ConfigError: ``bound`` differs from ``devices`` and ``started``.
    """
    if bound is None or not started or tuple(bound) == tuple(devices):
        return
    raise ConfigError(
        f"{where} was assigned {device_name(devices)}, but it runs in a reused Python worker (pid {os.getpid()}) "
        f"whose framework already started on {device_name(bound)}; CUDA reads CUDA_VISIBLE_DEVICES once per "
        "process, so the task would run on the wrong GPU. Give each executor one GPU "
        "(spark.executor.resource.gpu.amount=1 with spark.task.resource.gpu.amount=1), or set "
        "spark.python.worker.reuse=false so that every task starts a new Python worker")


def place(addresses: Sequence[str] | None, env: Mapping[str, str], original: str | None,
          bound: Sequence[str] | None, started: bool, where: str) -> tuple[list[str], dict[str, str]]:
    """A task's device ids and the variables to set: :func:`owned_devices`, :func:`check_binding`, :func:`gpu_environment`.

    ``addresses`` None or empty (no GPU assigned): ``([], {})``, nothing changes.
    """
    if not addresses:
        return [], {}
    devices = owned_devices(addresses, original)
    check_binding(bound, devices, started, where)
    return devices, gpu_environment(devices, env)


def _task_addresses() -> list[str] | None:
    """The GPU addresses Spark assigned the running task, or None (no task, or no GPU)."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return None
    ctx = TaskContext.get()
    if ctx is None:
        return None
    info = ctx.resources().get("gpu")
    return list(info.addresses) if info is not None else None


def _framework_started() -> bool:
    """Whether a framework may have read CUDA_VISIBLE_DEVICES here: Keras is imported (a task ran before)."""
    return "keras" in sys.modules


def place_task(where: str = "this Spark task") -> str:
    """Place the running Spark task on its GPUs (see the module's docstring); returns its device name.

    Call it in the task before Keras or the framework is first used. Without
    assigned GPUs nothing changes and ``"cpu"`` is returned (a framework that
    finds GPUs by itself may still use them).

    Raises:
        ConfigError: bad addresses, or this process is bound to other GPUs (:func:`check_binding`).
    """
    addresses = _task_addresses()
    if not addresses:
        return "cpu"
    if not _PROCESS.captured:
        _PROCESS.original, _PROCESS.captured = os.environ.get(VISIBLE_DEVICES), True
    devices, variables = place(addresses, os.environ, _PROCESS.original, _PROCESS.bound, _framework_started(), where)
    os.environ.update(variables)
    if _PROCESS.bound != tuple(devices):
        log.debug("%s: Python worker %d placed on %s (%s)", where, os.getpid(), device_name(devices), variables)
    _PROCESS.bound = tuple(devices)
    return device_name(devices)


def _amount(conf: Mapping[str, str | None]) -> float:
    value = conf.get(TASK_AMOUNT_KEY)
    try:
        return float(value) if value not in (None, "") else 0.0
    except ValueError:
        raise ConfigError(f"`{TASK_AMOUNT_KEY}` must be a number; received {value!r}") from None


def check_request(conf: Mapping[str, str | None], master: str, backend: str, env: Mapping[str, str]) -> None:
    """Refuse, on the driver, a GPU request that cannot work.

    Args:
        conf: the session's Spark conf (``spark.task.resource.gpu.amount`` is read).
        master: the session's master URL.
        backend: the fit's Keras backend.
        env: the variables the executors' Python workers get (``sc.environment``).

    Raises:
        ConfigError: GPUs requested on a local master (Spark schedules no resources there), or a
            fractional amount (GPUs shared between tasks) with JAX preallocation on.
    """
    amount = _amount(conf)
    if amount <= 0:
        return
    if master.startswith("local") and not master.startswith("local-cluster"):  # as elephant.launch.is_local
        raise ConfigError(
            f"`{TASK_AMOUNT_KEY}`={conf.get(TASK_AMOUNT_KEY)} asks Spark for GPUs, but the master is {master!r}, and "
            "Spark assigns no resources in local mode, so no task would get one. Use a cluster manager (standalone, "
            "YARN, Kubernetes) with GPU executors, or remove the setting: local tasks use the devices the "
            "framework finds itself")
    preallocate = str(env.get("XLA_PYTHON_CLIENT_PREALLOCATE", "false")).strip().lower()
    if backend == "jax" and amount < 1 and preallocate not in ("false", "0"):
        raise ConfigError(
            f"`{TASK_AMOUNT_KEY}`={conf.get(TASK_AMOUNT_KEY)} shares each GPU between {int(1 / amount)} tasks, but "
            f"XLA_PYTHON_CLIENT_PREALLOCATE={env.get('XLA_PYTHON_CLIENT_PREALLOCATE')} makes every JAX process take "
            "75% of its GPU's memory at its first operation, so the second task runs out of memory. Set "
            "spark.executorEnv.XLA_PYTHON_CLIENT_PREALLOCATE=false (elephant's default) or give each task a whole GPU")


def describe_request(conf: Mapping[str, str | None]) -> str:
    """The devices the fit's tasks ask Spark for, for the fit's first log line."""
    amount = _amount(conf)
    if amount <= 0:
        return "CPU (no GPUs requested from Spark)"
    per = f"{amount:g} GPU per task" if amount >= 1 else f"1/{round(1 / amount)} of a GPU per task"
    return f"{per} ({TASK_AMOUNT_KEY}={conf.get(TASK_AMOUNT_KEY)})"
