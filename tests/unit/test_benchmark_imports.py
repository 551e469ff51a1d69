"""The tests import a benchmark script one way, ``tests.unit.helpers.benchmark(name)``, and it fails loudly.

``pytest.importorskip`` is for optional third-party packages only: a benchmark script renamed or removed, or one of
the project's own modules, must fail the tests that use it, not skip them.
"""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

from tests.unit import helpers
from tests.unit.helpers import BENCHMARKS, benchmark

TESTS = pathlib.Path(__file__).resolve().parents[1]
#: What a test may not import other than through ``benchmark``: the scripts by their own names, ``benchmarks``
#: itself, and (never through importorskip) the project's package and tests.
SCRIPTS = frozenset(path.stem for path in BENCHMARKS.glob("*.py"))
OWN = SCRIPTS | {"benchmarks", "elephant", "tests"}
#: Calls that load a file by its path or change where imports look.
LOADERS = frozenset({"spec_from_file_location", "SourceFileLoader", "run_path", "import_module", "__import__"})
PATH_CHANGES = frozenset({"insert", "append", "extend"})


def _name(node: ast.AST) -> str:
    """The last part of a called name: ``importorskip`` for ``pytest.importorskip``."""
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _is_sys_path(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "path" and _name(node.value) == "sys"


def _first_string(call: ast.Call) -> str | None:
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None


def other_ways(source: str) -> list[str]:
    """Each way ``source`` imports a benchmark script other than ``benchmark(name)``, as ``line: what``."""
    tree = ast.parse(source)
    names_benchmarks = any(isinstance(node, ast.Constant) and isinstance(node.value, str) and "benchmarks" in node.value
                           for node in ast.walk(tree))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] in SCRIPTS
                      | {"benchmarks"}]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] in SCRIPTS | {"benchmarks"}:
                found.append(f"{node.lineno}: from {node.module} import")
        elif isinstance(node, ast.Call):
            called, first = _name(node.func), _first_string(node)
            top = first.split(".")[0] if first else None
            if called == "importorskip" and top in OWN:
                found.append(f"{node.lineno}: importorskip({first!r}), the project's own")
            elif called in ("import_module", "__import__") and top in SCRIPTS | {"benchmarks"}:
                found.append(f"{node.lineno}: {called}({first!r})")
            elif names_benchmarks and called in LOADERS:
                found.append(f"{node.lineno}: {called}(...) in a file that names benchmarks")
            elif names_benchmarks and called in PATH_CHANGES and _is_sys_path(getattr(node.func, "value", None)):
                found.append(f"{node.lineno}: sys.path.{called}(...) in a file that names benchmarks")
        elif isinstance(node, ast.Assign) and names_benchmarks:
            if any(isinstance(t, ast.Subscript) and _is_sys_path(t.value) for t in node.targets):
                found.append(f"{node.lineno}: sys.path[...] = ... in a file that names benchmarks")
    return sorted(found, key=lambda line: int(line.split(":")[0]))


def test_no_test_imports_a_benchmark_script_other_than_through_the_helper():
    ways = {}
    for path in sorted(TESTS.rglob("*.py")):
        if path == pathlib.Path(helpers.__file__).resolve():
            continue  # the helper itself: the one place a script is loaded from its file
        found = other_ways(path.read_text(encoding="utf-8"))
        if found:
            ways[str(path.relative_to(TESTS.parent))] = found
    assert not ways, f"import benchmark scripts with tests.unit.helpers.benchmark(name), not: {ways}"


@pytest.mark.parametrize("source", [
    'import sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks"))\n',
    'import pytest\nconvergence = pytest.importorskip("convergence")\n',
    'import pytest\nelephant = pytest.importorskip("elephant.ps")\n',
    'import importlib\nm = importlib.import_module("benchmarks.ps_model")\n',
    'import importlib.util\nspec = importlib.util.spec_from_file_location("m", "benchmarks/ps_model.py")\n',
    'import sys\nsys.path[:0] = ["benchmarks"]\n',
    "import workloads\n",
    "from report_convergence import summarise\n",
])
def test_the_scan_finds_each_other_way(source):
    assert other_ways(source)


def test_the_scan_leaves_third_party_skips_running_scripts_and_the_projects_imports_alone():
    source = ('import subprocess, sys\nimport pytest\nfrom elephant.optimizers import simulate_fit\n'
              'from tests.unit.helpers import benchmark\ntorch = pytest.importorskip("torch")\n'
              'subprocess.run([sys.executable, "benchmarks/executor_loss.py"])\nm = benchmark("ps_model")\n')
    assert other_ways(source) == []


def test_a_missing_script_is_an_error_that_names_it_not_a_skip():
    with pytest.raises(FileNotFoundError, match=r"benchmarks/no_such_script\.py"):
        benchmark("no_such_script")


def test_a_script_is_one_module_under_its_name_and_the_path_it_adds_is_removed_again(tmp_path, monkeypatch):
    sibling, script = "elephant_test_bench_sibling", "elephant_test_bench_script"
    (tmp_path / f"{sibling}.py").write_text("VALUE = 3\n")
    (tmp_path / f"{script}.py").write_text(f"import os, sys\nsys.path.insert(0, os.path.dirname(__file__))\n"
                                           f"import {sibling}\nTWICE = 2 * {sibling}.VALUE\n")
    monkeypatch.setattr(helpers, "BENCHMARKS", tmp_path)
    path = list(sys.path)
    try:
        module = benchmark(script)
        assert module.TWICE == 6 and sys.path == path  # the script's own path entry is gone after the load
        assert benchmark(script) is module is sys.modules[script]
        assert benchmark(sibling) is module.__dict__[sibling]  # the test's and the script's sibling: one module
    finally:
        sys.modules.pop(script, None)
        sys.modules.pop(sibling, None)


def test_a_script_that_fails_to_load_is_not_left_half_imported(tmp_path, monkeypatch):
    (tmp_path / "elephant_test_bench_broken.py").write_text("raise ImportError('a missing dependency')\n")
    monkeypatch.setattr(helpers, "BENCHMARKS", tmp_path)
    with pytest.raises(ImportError, match="a missing dependency"):
        benchmark("elephant_test_bench_broken")
    assert "elephant_test_bench_broken" not in sys.modules
