"""elephant.replicas.limit_threads caps the running backend's threads (in a fresh process: once per process)."""

from __future__ import annotations

import os
import subprocess
import sys

import keras
import pytest

BACKEND = keras.backend.backend()

PROBE = """
import os
import sys
from elephant.replicas import limit_threads
limit_threads(1)
import keras
backend = keras.backend.backend()
if backend == "torch":
    import torch
    print(torch.get_num_threads(), torch.get_num_interop_threads())
else:
    import jax.numpy as jnp
    float(jnp.ones(2).sum())  # the flags must not stop XLA from starting
    print(os.environ.get("XLA_FLAGS"))
print("tensorflow" in sys.modules)
"""


@pytest.mark.skipif(BACKEND == "tensorflow", reason="tests/unit/test_session_and_threads.py checks TensorFlow's pools")
def test_limit_threads_caps_the_running_backend():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_NUM_") and k != "XLA_FLAGS"}
    env["KERAS_BACKEND"] = BACKEND
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300,
                         check=True)
    caps, tensorflow_imported = out.stdout.strip().splitlines()[-2:]
    assert caps == {"torch": "1 1", "jax": "--xla_cpu_multi_thread_eigen=false"}[BACKEND]
    assert tensorflow_imported == "False"


@pytest.mark.skipif(BACKEND != "jax", reason="XLA_FLAGS is JAX's")
def test_limit_threads_leaves_a_users_xla_flags_alone():
    env = dict(os.environ, KERAS_BACKEND=BACKEND, XLA_FLAGS="--xla_cpu_multi_thread_eigen=true")
    code = "from elephant.replicas import limit_threads; limit_threads(1); import os; print(os.environ['XLA_FLAGS'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "--xla_cpu_multi_thread_eigen=true"
