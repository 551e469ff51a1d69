"""Which Keras backend a fit runs on, and getting that backend into Spark's Python workers.

Keras reads its backend once, when ``keras`` is first imported in a process
(``KERAS_BACKEND``, else ``~/.keras/keras.json``, else TensorFlow). The
driver's backend is the fit's: it travels to the executors three ways.

- In the session elephant makes, as ``spark.executorEnv.KERAS_BACKEND``
  (:func:`elephant.session.session_settings`).
- In any classic session, as ``sc.environment["KERAS_BACKEND"]`` before the
  fit's, the warm-up's or an inference job's tasks are built
  (:func:`ship`). PySpark copies ``spark.executorEnv.*`` into that dict when
  the context starts and sends it with every Python function (PySpark 3.5 and
  4); executors keep one pool of Python workers (and one daemon) per set of
  variables, so workers of another backend are never reused.
- In the task itself, before Keras is first imported there
  (:func:`enter_task`): the only way under Spark Connect, which has no
  SparkContext.

A Python worker whose Keras already runs another backend cannot switch (Keras'
``set_backend`` re-imports every Keras module, and the cached replicas would
keep the old one's objects), so its task fails with a :class:`ConfigError`
that says what to do.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping

from elephant.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["BACKEND_ENV", "SUPPORTED", "check_supported", "configured_backend", "current_backend", "enter_task",
           "preload", "require_backend", "ship"]

#: The variable Keras reads its backend from.
BACKEND_ENV = "KERAS_BACKEND"

#: The Keras backends elephant trains on, and the framework module each one imports.
SUPPORTED = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}

#: Backends Keras has that cannot train a model (``fit`` raises or is missing), with why.
_REFUSED = {
    "numpy": "Keras' numpy backend runs inference only (its trainer's fit raises NotImplementedError)",
    "openvino": "Keras' openvino backend runs inference only (it has no trainer)",
}


def check_supported(backend: str) -> str:
    """``backend`` if elephant can train on it.

    Raises:
        ConfigError: an inference-only backend (numpy, openvino) or one elephant does not know.
    """
    if backend in SUPPORTED:
        return backend
    why = _REFUSED.get(backend, "elephant does not know this backend")
    raise ConfigError(
        f"elephant trains on the Keras backends {', '.join(map(repr, SUPPORTED))}; received the Keras backend "
        f"{backend!r} ({why}). Set KERAS_BACKEND to one of those before keras is first imported")


def configured_backend(env: Mapping[str, str] | None = None) -> str:
    """The backend ``import keras`` would choose in a process with ``env``, without importing Keras.

    ``KERAS_BACKEND``, else the ``backend`` of ``keras.json`` in ``KERAS_HOME``
    (default ``~/.keras``), else ``"tensorflow"``, as Keras decides.
    """
    env = os.environ if env is None else env
    if env.get(BACKEND_ENV):
        return env[BACKEND_ENV]
    home = env.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json"), encoding="utf-8") as f:
            backend = json.load(f).get("backend")
    except (OSError, ValueError, AttributeError):
        backend = None
    return backend if isinstance(backend, str) and backend else "tensorflow"


def current_backend() -> str:
    """The backend of this process's Keras: the running one once Keras is imported, else the configured one."""
    keras = sys.modules.get("keras")
    if keras is not None and hasattr(keras, "config"):
        return keras.config.backend()
    return configured_backend()


def ship(sc, backend: str) -> None:
    """Send ``backend`` to the Python workers of ``sc``'s later jobs (``sc.environment``)."""
    environment = getattr(sc, "environment", None)
    if environment is None or environment.get(BACKEND_ENV) == backend:
        return
    if BACKEND_ENV in environment:
        log.info("Spark's Python workers get KERAS_BACKEND=%s (was %s): the driver's Keras runs %s",
                 backend, environment[BACKEND_ENV], backend)
    environment[BACKEND_ENV] = backend


def require_backend(backend: str, where: str = "this Spark task") -> None:
    """Make this process's Keras run ``backend``, or fail: call before Keras is imported in a task.

    Before Keras' first import in the process ``KERAS_BACKEND`` is set, so the
    import picks ``backend``. After it, the running backend must be ``backend``.

    Raises:
        ConfigError: Keras already runs another backend in this process.
    """
    keras = sys.modules.get("keras")
    if keras is None or not hasattr(keras, "config"):
        os.environ[BACKEND_ENV] = backend
        return
    running = keras.config.backend()
    if running == backend:
        return
    raise ConfigError(
        f"{where} runs in a Python worker (pid {os.getpid()}) whose Keras already runs the {running!r} backend, "
        f"but the driver's Keras runs {backend!r}, and a process cannot switch. Give the executors "
        f"KERAS_BACKEND={backend} (spark.executorEnv.KERAS_BACKEND={backend}, or the same keras.json as the "
        f"driver), or start Python workers afresh for this job (spark.python.worker.reuse=false); do not call "
        "keras.config.set_backend on the driver between fits of one session")


def enter_task(backend: str, where: str = "this Spark task") -> str:
    """The start of every elephant task: the backend set or checked, and the task's GPUs placed.

    ``backend`` ``""`` leaves the process's Keras as it is. Returns the task's
    device (:func:`elephant.gpu.place_task`): ``"gpu:<ids>"`` or ``"cpu"``.

    Raises:
        ConfigError: Keras already runs another backend here, or this process
            was bound to other GPUs by an earlier task.
    """
    from elephant import gpu

    if backend:
        require_backend(backend, where)
    return gpu.place_task(where)


def preload(backend: str) -> None:
    """Import Keras and ``backend``'s framework without starting any device (Spark's worker daemon, the warm-up).

    TensorFlow and JAX start their devices at their first operation, not at
    import, so importing both is safe before ``fork`` and before a task sets
    ``CUDA_VISIBLE_DEVICES``. Keras' torch backend asks CUDA for its devices
    when it is imported (unless ``KERAS_TORCH_DEVICE`` is set), which fixes the
    visible GPUs and makes CUDA unusable in forked children: for torch only
    ``torch`` itself is imported, and Keras is left to the task.
    Unknown backends import nothing. A missing framework is logged and ignored.
    """
    module = SUPPORTED.get(backend)
    if module is None:
        return
    os.environ.setdefault(BACKEND_ENV, backend)
    try:
        if backend == "tensorflow":
            from elephant.console import quiet_tensorflow_import

            with quiet_tensorflow_import():  # TensorFlow's start-up lines ignore TF_CPP_MIN_LOG_LEVEL
                import keras  # noqa: F401
                import tensorflow  # noqa: F401
        elif backend == "torch":
            import torch  # noqa: F401

            if os.environ.get("KERAS_TORCH_DEVICE"):  # then Keras' import does not ask CUDA
                import keras  # noqa: F401
        else:
            import keras  # noqa: F401
            import jax  # noqa: F401
    except ImportError as exc:
        log.info("could not preload the %s backend (%s); tasks will import it", backend, exc)
