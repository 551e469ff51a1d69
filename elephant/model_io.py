"""The only place that (de)serialises Keras models.

A model travels to Spark tasks as the bytes of a ``.keras`` archive (its
architecture, compile settings -- loss, metrics, optimizer config -- and
weights); tasks cache the rebuilt model by the archive's fingerprint. The same
archive format, with an extra ``elephant.json`` member, is what
:meth:`elephant.SparkModel.save` writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
import zipfile
from collections.abc import Mapping
from typing import Any

from elephant.errors import ConfigError

SETTINGS_MEMBER = "elephant.json"

__all__ = [
    "model_to_bytes", "model_from_bytes", "optimizer_values_from_bytes", "fingerprint", "model_fingerprint",
    "structure_fingerprint",
    "save_with_settings", "load_with_settings",
]


def model_to_bytes(model) -> bytes:
    """The ``.keras`` archive of ``model`` as bytes."""
    with tempfile.TemporaryDirectory(prefix="elephant-") as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            return f.read()


def model_from_bytes(data: bytes, custom_objects: Mapping[str, Any] | None = None):
    """Rebuild a compiled Keras model from :func:`model_to_bytes` output."""
    import keras

    with tempfile.TemporaryDirectory(prefix="elephant-") as tmp:
        path = os.path.join(tmp, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        return _load(keras, path, custom_objects)


def optimizer_values_from_bytes(data: bytes) -> list:
    """The optimizer variables a :func:`model_to_bytes` archive holds, as numpy, in the order of the rebuilt
    model's ``optimizer.variables`` (the order Keras saves them in); ``[]`` where it holds none.

    Read from the archive's weights file without rebuilding the model, so that a replica traced for another fit of
    the same structure can start from this fit's optimizer state (:func:`elephant.replicas.training_model`)."""
    import io

    import h5py
    import numpy as np

    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        weights = archive.read("model.weights.h5")
    with h5py.File(io.BytesIO(weights), "r") as store:
        saved = store.get("optimizer/vars")
        return [] if saved is None else [np.array(saved[str(i)]) for i in range(len(saved))]


def _load(keras, path: str, custom_objects):
    with warnings.catch_warnings():
        # An untrained optimizer has no variables yet; Keras warns that it skips them.
        warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
        return keras.saving.load_model(path, custom_objects=dict(custom_objects or {}), compile=True)


def fingerprint(data: bytes) -> str:
    """A short content hash of some bytes."""
    return hashlib.sha256(data).hexdigest()[:16]


def model_fingerprint(model) -> str:
    """A content hash of architecture, compile settings and weights.

    Not the ``.keras`` archive's hash: an archive embeds its save time, so the
    same model would never hit the executors' model cache twice.
    """
    import numpy as np

    digest = hashlib.sha256(model.to_json().encode())
    compile_config = model.get_compile_config() if getattr(model, "compiled", False) else None
    digest.update(json.dumps(compile_config, default=str, sort_keys=True).encode())
    for w in model.get_weights():
        digest.update(str((w.shape, w.dtype)).encode())
        digest.update(np.ascontiguousarray(w).tobytes())
    return digest.hexdigest()[:16]


def structure_fingerprint(model, *, settable_rate: bool = False) -> str:
    """A content hash of what a training replica keeps from one fit to the next: its traced train step.

    Architecture, compile settings and the shapes and dtypes of the
    optimizer's variables, but neither the model's weights (every training task
    overwrites them with the center it pulls) nor the optimizer's values (a fit
    that takes over a replica loads its own from its archive). Fits of models
    that differ only in their weights or their optimizer's state (a notebook cell
    run again, a benchmark's seeds, a sweep's trials, a fit after the driver's
    head) therefore share a rebuilt replica and its traced train step (see
    :func:`elephant.replicas.training_model`).

    With ``settable_rate`` the optimizer's learning rate is left out too (its
    compile setting): for a fit whose tasks set the rate themselves
    (``TaskSpec.learning_rate``, given whenever the rate is a number, not a
    schedule), so that a sweep over learning rates shares replicas. Default False.
    """
    architecture = _without_layer_names(json.loads(model.to_json()))  # holds the compile config too
    if settable_rate:
        architecture = _without_learning_rate(architecture)
    digest = hashlib.sha256(b"structure:" + json.dumps(architecture, sort_keys=True).encode())
    optimizer = getattr(model, "optimizer", None)
    for v in getattr(optimizer, "variables", None) or []:  # their names hold the layers' automatic names: not those
        digest.update(str((tuple(v.shape), str(v.dtype))).encode())  # no copy of the values: only their layout counts
    return digest.hexdigest()[:16]


def _without_learning_rate(config: dict) -> dict:
    """A model config whose compiled optimizer (and any inner one) has ``learning_rate`` None."""
    def strip(optimizer: Any) -> Any:
        if not isinstance(optimizer, dict) or not isinstance(optimizer.get("config"), dict):
            return optimizer
        inner = dict(optimizer["config"], learning_rate=None)
        if "inner_optimizer" in inner:
            inner["inner_optimizer"] = strip(inner["inner_optimizer"])
        return {**optimizer, "config": inner}

    compiled = config.get("compile_config")
    if not isinstance(compiled, dict) or "optimizer" not in compiled:
        return config
    return {**config, "compile_config": {**compiled, "optimizer": strip(compiled["optimizer"])}}


def _without_layer_names(config: Any) -> Any:
    """A model config with every layer name replaced by its order of appearance.

    Keras numbers automatic names per session (``dense``, ``dense_1``, ...), so
    the same architecture built twice serialises differently. Only the places
    that hold layer names are rewritten (a layer's ``name``, ``keras_history``
    references, ``input_layers``/``output_layers``), and the compiled
    optimizer's name (numbered the same way); a name anywhere else stays
    as it is, which can only make two configs differ, never wrongly agree.
    """
    names: dict[str, str] = {}

    def canon(name: Any) -> Any:
        return names.setdefault(name, f"#{len(names)}") if isinstance(name, str) else name

    def refs(value: Any) -> Any:  # [name, node, tensor] or a list of those
        if isinstance(value, list) and value and isinstance(value[0], str):
            return [canon(value[0]), *value[1:]]
        return [refs(v) for v in value] if isinstance(value, list) else value

    def layer(item: Any) -> Any:
        if isinstance(item, dict):
            item = dict(item)
            if isinstance(item.get("config"), dict) and "name" in item["config"]:
                item["config"] = {**item["config"], "name": canon(item["config"]["name"])}
            if "name" in item:
                item["name"] = canon(item["name"])
        return walk(item)

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(v) for v in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for key, value in node.items():
            if key in ("keras_history", "input_layers", "output_layers"):
                out[key] = refs(value)
            elif key == "layers" and isinstance(value, list):
                out[key] = [layer(v) for v in value]
            elif key == "optimizer" and isinstance(value, dict) and isinstance(value.get("config"), dict):
                out[key] = walk({**value, "config": {**value["config"], "name": "#optimizer"}})
            else:
                out[key] = walk(value)
        return out

    return layer(config)


def save_with_settings(model, path: str | os.PathLike, settings: Mapping[str, Any]) -> None:
    """Write ``model`` as a ``.keras`` file with elephant ``settings`` inside it."""
    path = os.fspath(path)
    if not path.endswith(".keras"):
        raise ConfigError(f"`filepath` must end with '.keras'; received filepath={path!r}")
    model.save(path)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(SETTINGS_MEMBER, json.dumps(dict(settings), indent=2, sort_keys=True))


def load_with_settings(path: str | os.PathLike, custom_objects: Mapping[str, Any] | None = None):
    """``(model, settings)`` from a file written by :func:`save_with_settings`.

    A plain ``.keras`` file (no elephant settings) gives empty settings.
    """
    import keras

    path = os.fspath(path)
    if not os.path.exists(path):
        raise ConfigError(f"`filepath` does not exist; received filepath={path!r}")
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        settings = json.loads(archive.read(SETTINGS_MEMBER)) if SETTINGS_MEMBER in names else {}
    return _load(keras, path, custom_objects), settings
