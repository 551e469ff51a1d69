"""Helpers shared by the unit tests."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

#: The benchmark scripts' folder. It is not a package: each script is run as ``python benchmarks/<name>.py`` and
#: puts its own folder on ``sys.path`` to import its siblings (``import workloads``).
BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


def benchmark(name: str) -> ModuleType:
    """The module of ``benchmarks/<name>.py``, loaded from its file: the one way the tests import a benchmark script.

    It is registered in ``sys.modules`` under ``name``, the name its siblings import it by, so a test and the script
    that imports it share one module (``benchmark("workloads")`` is ``first_epoch``'s ``WL``). ``sys.path`` is put
    back after the load: the folder a script adds for its siblings does not stay ahead of the installed packages for
    the rest of the session. A missing script is an error, never a skip: a renamed script fails its tests.
    """
    path = BENCHMARKS / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no benchmark script benchmarks/{name}.py (renamed or removed?); "
                                f"the tests that load it with benchmark({name!r}) need it or a new name")
    loaded = sys.modules.get(name)
    if loaded is not None:
        if pathlib.Path(getattr(loaded, "__file__", "") or "").resolve() != path.resolve():
            raise ImportError(f"a module {name!r} from {getattr(loaded, '__file__', None)} is already imported, "
                              f"not benchmarks/{name}.py")
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    sys.modules[name] = module  # before it runs: its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        sys.path[:] = saved
    return module


def tiny_model():
    """A seeded 3 -> 2 Dense model compiled with SGD(0.05) and MSE (fits ``linear_data``)."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


class RecordingBuilder:
    """Stands for ``SparkSession.builder``: records what a session would be made with, makes none."""

    def __init__(self):
        self.settings = {}

    def master(self, value):
        self.settings["master"] = value
        return self

    def appName(self, value):
        self.settings["app"] = value
        return self

    def config(self, key, value):
        self.settings[key] = value
        return self

    def getOrCreate(self):
        return self


def doc_sections(doc: str = "convergence.md") -> set[str]:
    """The section titles of docs/``doc``, as a warning names them (without their Markdown backticks)."""
    import re

    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / doc).read_text(encoding="utf-8")
    return {re.sub(r"^#+\s*", "", line).replace("`", "").strip() for line in text.splitlines() if line.startswith("#")}


def check_points_to_the_figures(message: str, doc: str = "convergence.md") -> str:
    """Check that a warning gives no figure of its own and ends by pointing to the section of docs/``doc``
    (docs/convergence.md unless told) that holds them; returns that section's title."""
    import re

    assert re.search(r"\d+(\.\d+)? ?(points?|%)", message) is None, f"a figure in the warning: {message!r}"
    assert "measured" not in message and "benchmarks/" not in message, message
    found = re.search(rf'\(see docs/{re.escape(doc)}, "([^"]+)"\)\.$', message)
    assert found, f"the warning does not end with its docs/{doc} section: {message!r}"
    assert found.group(1) in doc_sections(doc), f"no section {found.group(1)!r} in docs/{doc}"
    return found.group(1)
