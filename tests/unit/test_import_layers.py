"""Imports run one way: from the façades down to the ground, never back up, never in a circle.

Read from the code's syntax tree (function-local imports count too: an import
deferred to call time still ties the modules together). A new module must be
given a layer here; docs/architecture.md draws the same table.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import elephant

ROOT = pathlib.Path(elephant.__file__).parent

#: Bottom up. A module may import from its own layer and the layers below it.
LAYERS = [
    ("ground", ["errors", "weights", "protocol", "console", "faults"]),
    ("pure rules and wire", ["optimizers", "optimizers.*", "ps.wire", "ps.layout", "ps.encoding", "ps.decoding"]),
    ("pure state and checks", ["ps.rounds", "ps.store", "ps.ledger", "ps.guard", "ps.metrics", "ps.checks",
                               "ps.snapshots", "ps.view", "ps.waits", "data", "stream", "arrow", "config",
                               "checkpoint", "combine", "model_io"]),
    ("HTTP", ["ps", "ps.app", "ps.server", "ps.client", "ps.*"]),
    ("Keras worker", ["worker", "replicas", "backends", "framework", "gpu"]),
    ("Spark", ["session", "launch", "warmup", "daemon"]),
    ("inputs, fit and inference", ["sources", "fit", "fit.*", "inference"]),
    ("façades", ["spark_model", "search", "search.*", "ensemble"]),
    ("Spark ML and the package", ["ml", ""]),
]

#: Upward imports made on purpose: a documented name re-exported where users look for it,
#: imported only when first used. (importer, imported)
LAZY_RE_EXPORTS = {("optimizers", "fit.simulated")}


def _name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(name: str) -> bool:
    path = ROOT.joinpath(*name.split(".")) if name else ROOT
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _imports(path: pathlib.Path) -> set[str]:
    """The elephant modules ``path`` imports, as names relative to the package ("" is the package)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "elephant":
            base = node.module.removeprefix("elephant").lstrip(".")
            for alias in node.names:
                sub = f"{base}.{alias.name}".lstrip(".")
                found.add(sub if _exists(sub) else base)
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("elephant").lstrip(".") for a in node.names
                      if a.name.split(".")[0] == "elephant"}
    return found


def _graph() -> dict[str, set[str]]:
    graph = {_name(p): _imports(p) for p in sorted(ROOT.rglob("*.py"))}
    return {module: deps - {module} for module, deps in graph.items()}


def _layer(module: str) -> int:
    for rank, (_, members) in enumerate(LAYERS):
        for member in members:
            if module == member or (member.endswith(".*") and module.startswith(member[:-1])):
                return rank
    raise LookupError(module)


def test_every_module_has_a_layer():
    missing = [m or "elephant" for m in _graph() if not _has_layer(m)]
    assert missing == [], f"give these modules a layer in LAYERS: {missing}"


def _has_layer(module: str) -> bool:
    try:
        _layer(module)
    except LookupError:
        return False
    return True


def test_no_import_runs_up_the_layers():
    graph = _graph()
    upward = sorted(
        (module, dep) for module, deps in graph.items() for dep in deps
        if (module, dep) not in LAZY_RE_EXPORTS and _layer(dep) > _layer(module)
    )
    assert upward == [], "imports that run back up the layers: " + ", ".join(
        f"{m or 'elephant'} ({LAYERS[_layer(m)][0]}) -> {d} ({LAYERS[_layer(d)][0]})" for m, d in upward)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for dep in sorted(graph.get(module, ())):
            if (module, dep) in LAZY_RE_EXPORTS:
                continue
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_the_store_and_the_modules_split_out_of_it_load_no_http_library():
    """``ps.store`` and its parts are pure state: importing them loads neither Flask nor requests (nor Spark, Keras)."""
    parts = [m for _, members in LAYERS for m in members if m.startswith("ps.") and _layer(m) == _layer("ps.store")]
    assert {"ps.store", "ps.ledger", "ps.guard", "ps.metrics", "ps.checks", "ps.snapshots", "ps.view",
            "ps.waits"} <= set(parts)
    code = (f"import sys, {', '.join('elephant.' + m for m in parts)}\n"
            "heavy = ('flask', 'werkzeug', 'requests', 'urllib3', 'pyspark', 'tensorflow', 'keras')\n"
            "print(','.join(m for m in heavy if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == ""


def test_no_import_circle():
    assert _cycle(_graph()) is None, f"an import circle: {' -> '.join(_cycle(_graph()))}"


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ({"a": {"a"}}, ["a", "a"]),
])
def test_the_circle_finder_finds_circles(graph, expected):
    assert _cycle(graph) == expected


def test_the_reader_sees_function_local_and_aliased_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from elephant import data as D\n"
                      "def f():\n    from elephant.fit.loop import run_fit\n    import elephant.session\n")
    assert _imports(source) == {"data", "fit.loop", "session"}


def test_an_upward_import_would_be_caught():
    """The layers test can fail: the optimizers importing the façade is flagged."""
    assert _layer("spark_model") > _layer("optimizers.base")
    assert ("optimizers.base", "spark_model") not in LAZY_RE_EXPORTS


def test_no_module_imports_another_modules_private_names():
    """A module's ``_private`` names are its own (it may import them from itself, as Spark tasks do)."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        me = _name(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("elephant"):
                source = node.module.removeprefix("elephant").lstrip(".")
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private and source != me:
                    found.append(f"{me} imports {private} from {source}")
    assert found == []
