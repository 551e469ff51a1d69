"""Epoch checkpoints that let a fit resume after the driver died: ``keras.callbacks.BackupAndRestore``, atomically.

When ``SparkModel.fit`` is given a ``BackupAndRestore(backup_dir)``, elephant
does its work itself: at the end of every epoch (and, with ``save_freq=N``,
every ``N`` global steps inside one, with each partition's position in its
pass) it writes one file,
``backup_dir/elephant-backup.safetensors``, holding the center weights, the
driver's Keras optimizer variables (the learning rate a callback set, the
step count), the distributed rule's server state, the number of epochs done
and the history so far. The file is written to a temporary name, flushed to
disk and renamed over the old one (``os.replace``), so a kill at any moment
leaves the previous checkpoint or the new one, never a torn one. The next fit
with the same callback starts from it, at the epoch after the last one saved,
as Keras' own callback does; the file is removed when a fit ends normally
(``delete_checkpoint=True``, Keras' default).

safetensors holds the tensors: it is a plain, memory-safe format that loads
without running code, which matters for a file that sits in a shared
directory. Everything else travels in its JSON metadata. Rule states are
nested dicts, lists, tuples, arrays, numbers and dataclasses of elephant's
rules (or of the custom rule's own module); a state with anything else is not
saved, and the resumed fit starts the rule afresh (logged).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from elephant.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["FILENAME", "Checkpoint", "save", "load", "remove", "find_backup"]

FILENAME = "elephant-backup.safetensors"
_FORMAT = "elephant-backup/1"


@dataclasses.dataclass
class Checkpoint:
    """A fit's state at the end of an epoch, or inside one (``positions``)."""

    epochs_done: int
    center: list[np.ndarray]
    optimizer_variables: list[np.ndarray]
    rule_state: Any
    rule: dict[str, Any]  # the rule's config and the number of workers it was initialised for
    history: dict[str, list[float]]
    state_saved: bool = True  # False: the rule's state could not be encoded; it starts afresh on resume
    #: Inside epoch ``epochs_done``: each partition's local steps applied to ``center`` after the driver's head of
    #: ``head_steps`` steps (None: saved at an epoch's end).
    positions: dict[int, int] | None = None
    head_steps: int = 0


def find_backup(callbacks) -> tuple[Any, list]:
    """The ``BackupAndRestore`` among ``callbacks`` (or None) and the other callbacks.

    Raises:
        ConfigError: more than one ``BackupAndRestore``.
    """
    import keras

    callbacks = list(callbacks or [])
    backups = [c for c in callbacks if isinstance(c, keras.callbacks.BackupAndRestore)]
    if len(backups) > 1:
        raise ConfigError(f"`callbacks` holds {len(backups)} BackupAndRestore callbacks; pass one")
    return (backups[0] if backups else None), [c for c in callbacks if c not in backups]


def path(backup_dir: str) -> str:
    return os.path.join(os.fspath(backup_dir), FILENAME)


def save(backup_dir: str, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` atomically: a temporary file, fsync, then ``os.replace`` over the old one."""
    from safetensors.numpy import save_file

    tensors: dict[str, np.ndarray] = {}
    for i, a in enumerate(checkpoint.center):
        tensors[f"center/{i}"] = np.asarray(a, order="C")
    for i, a in enumerate(checkpoint.optimizer_variables):
        tensors[f"optimizer/{i}"] = np.asarray(a, order="C")
    state_saved = checkpoint.state_saved
    try:
        structure = _encode(checkpoint.rule_state, tensors) if state_saved else None
    except TypeError as exc:
        log.warning("the rule's server state cannot be saved (%s); a resumed fit starts it afresh", exc)
        structure, state_saved = None, False
        tensors = {k: v for k, v in tensors.items() if not k.startswith("state/")}
    metadata = {
        "format": _FORMAT,
        "epochs_done": str(checkpoint.epochs_done),
        "num_center": str(len(checkpoint.center)),
        "num_optimizer": str(len(checkpoint.optimizer_variables)),
        "rule": json.dumps(checkpoint.rule),
        "rule_state": json.dumps(structure),
        "state_saved": json.dumps(state_saved),
        "history": json.dumps(checkpoint.history),
        "positions": json.dumps(checkpoint.positions),
        "head_steps": str(checkpoint.head_steps),
    }
    os.makedirs(backup_dir, exist_ok=True)
    final = path(backup_dir)
    tmp = f"{final}.tmp-{os.getpid()}"
    try:
        save_file(tensors, tmp, metadata=metadata)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_dir(os.path.dirname(final))


def load(backup_dir: str, rule_module: str = "elephant.optimizers") -> Checkpoint | None:
    """The checkpoint in ``backup_dir``, or None when there is none.

    Dataclasses in the rule's state are rebuilt only from elephant's own
    modules or ``rule_module`` (the module of the fit's rule): a file never
    makes elephant import anything else.

    Raises:
        ConfigError: the file is not an elephant backup, or cannot be read.
    """
    from safetensors import safe_open

    final = path(backup_dir)
    if not os.path.exists(final):
        return None
    try:
        with safe_open(final, framework="np") as f:
            meta = f.metadata() or {}
            if meta.get("format") != _FORMAT:
                raise ConfigError(f"{final} is not an elephant backup (format {meta.get('format')!r}); "
                                  "remove it or pass another backup_dir")
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except ConfigError:
        raise
    except Exception as exc:  # the rename is atomic, so this is a file written by something else
        raise ConfigError(f"cannot read the backup {final}: {exc}; remove it or pass another backup_dir") from exc
    state_saved = json.loads(meta["state_saved"])
    return Checkpoint(
        epochs_done=int(meta["epochs_done"]),
        center=[tensors[f"center/{i}"] for i in range(int(meta["num_center"]))],
        optimizer_variables=[tensors[f"optimizer/{i}"] for i in range(int(meta["num_optimizer"]))],
        rule_state=_decode(json.loads(meta["rule_state"]), tensors, rule_module) if state_saved else None,
        rule=json.loads(meta["rule"]),
        history=json.loads(meta["history"]),
        state_saved=state_saved,
        positions=_positions(json.loads(meta.get("positions", "null"))),
        head_steps=int(meta.get("head_steps", "0")),
    )


def _positions(saved: dict[str, int] | None) -> dict[int, int] | None:
    return None if saved is None else {int(k): int(v) for k, v in saved.items()}


def remove(backup_dir: str) -> None:
    """Delete the checkpoint, and ``backup_dir`` too if nothing else is in it."""
    final = path(backup_dir)
    if os.path.exists(final):
        os.remove(final)
    try:
        os.rmdir(backup_dir)
    except OSError:
        pass  # not empty (the user's own files), or already gone


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ------------------------------------------------------------ rule states
def encode_state(value: Any) -> tuple[Any, list[np.ndarray]]:
    """A rule's server state as ``(a JSON structure, its arrays)``; no pickle.

    Raises:
        TypeError: the state holds a value other than None, bools, numbers,
            strings, arrays, lists, tuples, dicts and dataclasses of those.
    """
    tensors: dict[str, np.ndarray] = {}
    structure = _encode(value, tensors)
    return structure, [tensors[f"state/{i}"] for i in range(len(tensors))]


def decode_state(structure: Any, arrays: list[np.ndarray], rule_module: str) -> Any:
    """The state of :func:`encode_state` (dataclasses only from elephant or ``rule_module``)."""
    return _decode(structure, {f"state/{i}": a for i, a in enumerate(arrays)}, rule_module)


def _encode(value: Any, tensors: dict[str, np.ndarray]) -> Any:
    """A JSON structure for ``value``; its arrays go to ``tensors`` as ``state/N``."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, np.ndarray):
        return {"num": value.item() if isinstance(value, np.generic) else value}
    if isinstance(value, np.ndarray):
        name = f"state/{sum(k.startswith('state/') for k in tensors)}"
        tensors[name] = np.asarray(value, order="C")
        return {"array": name}
    if isinstance(value, (list, tuple)):
        return {"list" if isinstance(value, list) else "tuple": [_encode(v, tensors) for v in value]}
    if isinstance(value, Mapping):
        items = []
        for k, v in value.items():
            if isinstance(k, bool) or not isinstance(k, (str, int, np.integer)):
                raise TypeError(f"a dict key of type {type(k).__name__}")
            items.append([int(k) if isinstance(k, np.integer) else k, _encode(v, tensors)])
        return {"dict": items}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        fields = {f.name: _encode(getattr(value, f.name), tensors) for f in dataclasses.fields(value)}
        return {"dataclass": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}
    raise TypeError(f"a value of type {type(value).__name__}")


def _decode(node: Any, tensors: dict[str, np.ndarray], rule_module: str) -> Any:
    if node is None or isinstance(node, (bool, str)):
        return node
    if "num" in node:
        return node["num"]
    if "array" in node:
        return tensors[node["array"]]
    if "list" in node:
        return [_decode(v, tensors, rule_module) for v in node["list"]]
    if "tuple" in node:
        return tuple(_decode(v, tensors, rule_module) for v in node["tuple"])
    if "dict" in node:
        return {k: _decode(v, tensors, rule_module) for k, v in node["dict"]}
    module, _, qualname = node["dataclass"].partition(":")
    if not (module == rule_module or module.startswith("elephant.")):
        raise ConfigError(f"the backup names a state class in module {module!r}, which is neither elephant's nor "
                          f"the rule's ({rule_module!r}); remove the backup or pass another backup_dir")
    cls: Any = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ConfigError(f"the backup names {node['dataclass']}, which is not a dataclass")
    return cls(**{k: _decode(v, tensors, rule_module) for k, v in node["fields"].items()})
