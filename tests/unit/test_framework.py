"""The Keras backend of a fit (elephant.framework): chosen on the driver, shipped, set or checked in each task."""

import json
import os
import subprocess
import sys

import keras
import pytest

from elephant import framework
from elephant.errors import ConfigError


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_the_training_backends_are_supported(backend):
    assert framework.check_supported(backend) == backend


@pytest.mark.parametrize("backend, why", [("numpy", "inference only"), ("openvino", "inference only"),
                                          ("mlx", "does not know")])
def test_other_backends_are_refused_by_name(backend, why):
    with pytest.raises(ConfigError, match=rf"received the Keras backend '{backend}' \(.*{why}.*KERAS_BACKEND"):
        framework.check_supported(backend)


def test_spark_model_refuses_an_inference_only_backend(monkeypatch):
    from elephant import SparkModel

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    monkeypatch.setattr(keras.config, "backend", lambda: "numpy")
    with pytest.raises(ConfigError, match="received the Keras backend 'numpy'"):
        SparkModel(model, spark=object())


@pytest.mark.parametrize("env, keras_json, expected", [
    ({"KERAS_BACKEND": "jax"}, {"backend": "torch"}, "jax"),  # the variable wins
    ({}, {"backend": "torch"}, "torch"),
    ({}, None, "tensorflow"),
    ({}, "not json", "tensorflow"),
])
def test_the_configured_backend_is_read_as_keras_reads_it(tmp_path, env, keras_json, expected):
    if keras_json is not None:
        (tmp_path / "keras.json").write_text(keras_json if isinstance(keras_json, str) else json.dumps(keras_json))
    assert framework.configured_backend({**env, "KERAS_HOME": str(tmp_path)}) == expected


class _Context:
    def __init__(self, environment):
        self.environment = environment


def test_ship_puts_the_backend_in_the_python_workers_environment():
    sc = _Context({"PYTHONHASHSEED": "0"})
    framework.ship(sc, "jax")
    assert sc.environment == {"PYTHONHASHSEED": "0", "KERAS_BACKEND": "jax"}
    framework.ship(sc, "torch")  # the driver switched backends: its next jobs get another pool of workers
    assert sc.environment["KERAS_BACKEND"] == "torch"
    framework.ship(object(), "jax")  # no environment (a stand-in context): nothing to do


def test_a_task_whose_keras_runs_another_backend_fails_naming_both():
    running = keras.config.backend()
    other = "jax" if running != "jax" else "torch"
    framework.require_backend(running)  # the same backend passes
    with pytest.raises(ConfigError, match=rf"partition 2 .* already runs the '{running}' backend, but the driver's "
                                          rf"Keras runs '{other}'.*spark.executorEnv.KERAS_BACKEND={other}"):
        framework.require_backend(other, "partition 2 of run r")


CHILD = """
import os, sys
from elephant import framework
framework.enter_task(sys.argv[1])
import keras
print(keras.config.backend(), os.environ["KERAS_BACKEND"])
"""


def test_a_task_sets_the_backend_before_keras_is_first_imported():
    """A fresh process (no Keras yet) gets the driver's backend, whatever its own environment said."""
    if __import__("importlib.util").util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    env = {**os.environ, "KERAS_BACKEND": "torch", "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", CHILD, "jax"], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split() == ["jax", "jax"], out.stderr[-2000:]


def test_preload_imports_nothing_for_an_unknown_backend_and_survives_a_missing_framework(monkeypatch, caplog):
    import builtins

    framework.preload("numpy")  # nothing to import
    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch":
            raise ImportError("No module named 'torch'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    with caplog.at_level("INFO", logger="elephant.framework"):
        framework.preload("torch")
    assert "could not preload the torch backend" in caplog.text


@pytest.mark.parametrize("backend, env, imported", [
    ("tensorflow", {}, ["keras", "tensorflow"]),
    ("jax", {}, ["keras", "jax"]),
    ("torch", {}, ["torch"]),  # Keras' torch backend asks CUDA at import: left to the forked task
    ("torch", {"KERAS_TORCH_DEVICE": "cpu"}, ["torch", "keras"]),  # then Keras' import does not ask CUDA
])
def test_preload_imports_the_framework_and_keras_only_where_safe(monkeypatch, backend, env, imported):
    import builtins
    import types

    real_import, seen = builtins.__import__, []

    def recording(name, *args, **kwargs):
        if name in ("keras", "tensorflow", "jax", "torch"):
            seen.append(name)
            return types.ModuleType(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.delenv("KERAS_TORCH_DEVICE", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("KERAS_BACKEND", backend)
    monkeypatch.setattr(builtins, "__import__", recording)
    framework.preload(backend)
    assert seen == imported


def test_the_daemon_preloads_the_configured_framework():
    code = "import sys, elephant.daemon; print(' '.join(m for m in ('keras', 'jax') if m in sys.modules))"
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
    if __import__("importlib.util").util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split() == ["keras", "jax"], out.stderr[-2000:]
