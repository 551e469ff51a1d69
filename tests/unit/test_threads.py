"""elephant's own threads never hold the interpreter at exit: each is a daemon, or joined where it is started.

Read from the code's syntax tree, so a new ``threading.Thread`` without
``daemon=True``, or a ``ThreadPoolExecutor`` neither used as a context manager
nor shut down in its module, fails here (concurrent.futures' workers are joined
at interpreter exit, so a pool left open could hang it, as a Spark Connect client
that outlived its server does: docs/cluster.md).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import elephant

ROOT = pathlib.Path(elephant.__file__).parent
MODULES = sorted(ROOT.rglob("*.py"))


def _callee(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _callee(n) == name]


def _target(tree: ast.AST, call: ast.Call) -> str | None:
    """The name or attribute (``self._pool`` -> ``_pool``) a call's result is assigned to, else None."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is call:
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            return target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
    return None


def _in_with(tree: ast.AST, call: ast.Call) -> bool:
    return any(isinstance(n, ast.With) and any(item.context_expr is call for item in n.items) for n in ast.walk(tree))


def _shut_down(tree: ast.AST, name: str) -> bool:
    """Whether the module calls ``<...>.name.shutdown(...)`` or ``name.shutdown(...)``."""
    for call in _calls(tree, "shutdown"):
        owner = call.func.value if isinstance(call.func, ast.Attribute) else None
        if isinstance(owner, ast.Attribute) and owner.attr == name or isinstance(owner, ast.Name) and owner.id == name:
            return True
    return False


def _threads() -> list[tuple[str, ast.Call]]:
    return [(p.relative_to(ROOT).as_posix(), call) for p in MODULES
            for call in _calls(ast.parse(p.read_text(encoding="utf-8")), "Thread")]


def _pools() -> list[tuple[str, ast.AST, ast.Call]]:
    found = []
    for path in MODULES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [(path.relative_to(ROOT).as_posix(), tree, call) for call in _calls(tree, "ThreadPoolExecutor")]
    return found


def test_the_search_finds_elephants_threads_and_pools():
    threads = {module for module, _ in _threads()}
    assert {"warmup.py", "fit/progress.py", "ps/server.py", "ps/gate.py", "session.py"} <= threads
    assert {"ps/http.py", "worker.py", "search/engine.py", "ensemble.py"} <= {module for module, _, _ in _pools()}


@pytest.mark.parametrize("module, call", _threads(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_thread_elephant_starts_is_a_daemon(module, call):
    daemon = next((k.value for k in call.keywords if k.arg == "daemon"), None)
    assert isinstance(daemon, ast.Constant) and daemon.value is True, (
        f"{module}:{call.lineno}: threading.Thread(...) without daemon=True")


@pytest.mark.parametrize("module, tree, call", _pools(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_thread_pool_is_joined_where_it_is_made(module, tree, call):
    name = _target(tree, call)
    assert _in_with(tree, call) or (name is not None and _shut_down(tree, name)), (
        f"{module}:{call.lineno}: ThreadPoolExecutor neither used in a with block nor shut down in its module")


def test_the_checks_fail_on_a_thread_or_pool_left_open():
    tree = ast.parse("import threading\nt = threading.Thread(target=f)\nself._pool = ThreadPoolExecutor(2)\n")
    thread, = _calls(tree, "Thread")
    assert next((k for k in thread.keywords if k.arg == "daemon"), None) is None
    pool, = _calls(tree, "ThreadPoolExecutor")
    assert _target(tree, pool) == "_pool" and not _in_with(tree, pool) and not _shut_down(tree, "_pool")
    joined = ast.parse("self._pool = ThreadPoolExecutor(2)\nself._pool.shutdown(wait=True)\n")
    assert _shut_down(joined, "_pool")
