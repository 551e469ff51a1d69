"""elephant.errors: one exception tree, every class picklable with its message."""

from __future__ import annotations

import ast
import builtins
import inspect
import pathlib
import pickle

import cloudpickle
import pytest

import elephant
from elephant import errors

#: Every exception class of elephant.errors and the classes callers catch it by.
TREE = {
    "ElephantError": (Exception,),
    "ConfigError": (errors.ElephantError, ValueError),
    "ScheduleError": (errors.ConfigError,),
    "DataError": (errors.ElephantError, ValueError),
    "PSError": (errors.ElephantError, RuntimeError),
    "StaleAttemptError": (errors.PSError,),
    "RolledBackError": (errors.StaleAttemptError,),
    "RoundTimeoutError": (errors.PSError,),
    "StoreClosedError": (errors.PSError,),
    "Transient": (errors.PSError,),
    "TransportFailed": (errors.PSError,),
    "ProtocolError": (errors.ElephantError, ValueError),
    "NormGuardError": (errors.ProtocolError,),
    "FitError": (errors.ElephantError, RuntimeError),
}


def test_the_table_covers_every_exception_class_of_the_module():
    defined = {name for name, value in vars(errors).items()
               if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == errors.__name__}
    assert defined == set(TREE) == set(errors.__all__)


@pytest.mark.parametrize("name", sorted(TREE))
def test_each_error_pickles_with_its_type_and_message_and_keeps_its_parents(name):
    cls = getattr(errors, name)
    error = cls(f"partition 3, attempt 7: {name} at parameter server 10.0.0.1:4000")
    for dumps in (pickle.dumps, cloudpickle.dumps):
        back = pickle.loads(dumps(error))
        assert type(back) is cls and str(back) == str(error)
    assert all(isinstance(error, parent) for parent in TREE[name])
    assert isinstance(error, errors.ElephantError)
    assert cls.__doc__ and cls.__doc__.strip()


@pytest.mark.parametrize("module, names", [
    ("elephant.ps.store", ["StaleAttemptError", "RoundTimeoutError", "StoreClosedError", "NormGuardError",
                           "RolledBackError"]),
    ("elephant.ps", ["StaleAttemptError", "RoundTimeoutError", "StoreClosedError"]),
    ("elephant.optimizers.simulate", ["ScheduleError"]),
    ("elephant.optimizers", ["ScheduleError"]),
])
def test_the_old_import_paths_give_the_same_classes(module, names):
    import importlib

    imported = importlib.import_module(module)
    for name in names:
        assert getattr(imported, name) is getattr(errors, name)


def test_the_transport_signals_live_in_errors_and_the_transport_raises_them_from_there():
    """``Transient`` and ``TransportFailed`` moved from elephant.ps.transport: the transport and client use these."""
    from elephant.ps import client, transport

    for name in ("Transient", "TransportFailed"):
        cls = getattr(errors, name)
        assert cls.__module__ == "elephant.errors"
        assert getattr(transport, name) is cls and getattr(client, name) is cls
        assert name not in transport.__all__


def test_no_exception_class_is_defined_outside_errors():
    """Every exception class of the package is defined in elephant.errors (read from the syntax tree)."""
    def is_exception(base: ast.expr) -> bool:
        name = ast.unparse(base).rsplit(".", 1)[-1]
        builtin = getattr(builtins, name, None)
        return (name in errors.__all__ or name.endswith(("Error", "Exception"))
                or inspect.isclass(builtin) and issubclass(builtin, BaseException))

    root = pathlib.Path(elephant.__file__).parent
    strays = [f"{path.relative_to(root)}: {node.name}"
              for path in sorted(root.rglob("*.py")) if path != root / "errors.py"
              for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
              if isinstance(node, ast.ClassDef) and any(is_exception(base) for base in node.bases)]
    assert strays == []
