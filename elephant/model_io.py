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

__all__ = ["model_to_bytes", "model_from_bytes", "fingerprint", "model_fingerprint", "save_with_settings", "load_with_settings"]


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
