"""Run the test suite beside a CPU-bound process on each core, then each integration file alone.

A test that passes only on an idle machine fails a landing when the machine is busy; this finds
such tests before CI does. Each run's outcome goes to a JSON summary (``--out``), a line per run::

    python scripts/suite_under_load.py --runs 3            # the README's test command, 3 times, loaded
    python scripts/suite_under_load.py --runs 0 --alone    # each tests/integration file alone, unloaded
    python scripts/suite_under_load.py --runs 1 -- tests/integration/test_failures.py

Arguments after ``--`` replace the test paths (the default is the whole suite).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def busy_cores(count: int):
    """``count`` processes, each spinning on a core, for the duration of the block."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(count)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.terminate()
            spinner.join()


def run_pytest(args: list[str], log: pathlib.Path) -> dict:
    """One pytest run from the repository root, its output into ``log``: arguments, exit code, time, failures."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rf", *args],
                          cwd=ROOT, capture_output=True, text=True)
    log.write_text(done.stdout + done.stderr)
    failed = [line.split()[1] for line in done.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    return {"args": args, "exit": done.returncode, "seconds": round(time.monotonic() - started, 1), "failed": failed,
            "log": str(log)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="loaded runs of the suite (default 3)")
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="spinning processes (default: cores)")
    parser.add_argument("--alone", action="store_true", help="then run each tests/integration file alone")
    parser.add_argument("--out", default="suite_under_load.json", help="where the summary goes (each run's output "
                                                                        "beside it, as OUT.N.log)")
    parser.add_argument("paths", nargs="*", help="test paths (default: the whole suite, -n 2 --dist loadfile)")
    options = parser.parse_args(argv)
    suite = options.paths or ["-n", "2", "--dist", "loadfile"]
    results: list[dict] = []

    def log() -> pathlib.Path:
        return pathlib.Path(f"{options.out}.{len(results)}.log")

    for run in range(options.runs):
        with busy_cores(options.busy):
            results.append({"loaded": options.busy, "run": run, **run_pytest(suite, log())})
        print(json.dumps(results[-1]), flush=True)
    if options.alone:
        for path in sorted((ROOT / "tests" / "integration").glob("test_*.py")):
            results.append({"loaded": 0, **run_pytest([str(path.relative_to(ROOT))], log())})
            print(json.dumps(results[-1]), flush=True)
    pathlib.Path(options.out).write_text(json.dumps(results, indent=1))
    return 0 if all(r["exit"] in (0, 5) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
