"""A benchmark script's measurement in a child process that imports another checkout's elephant (``--base``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

__all__ = ["run_child"]


def run_child(script: str, path: str, argv: list[str]) -> dict:
    """``script --child argv`` with the elephant at ``path``: the JSON of its last ``RESULT`` line.

    It runs from ``path``: Spark starts its Python workers with ``python -m``, which puts their working directory,
    the driver's, first on their path, so a child run from elsewhere would train with that folder's elephant.
    """
    proc = subprocess.run([sys.executable, os.path.abspath(script), "--child", *argv], cwd=path,
                          env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"the measurement with elephant from {path} failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])
