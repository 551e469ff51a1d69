"""The figures the README and the docs quote are those of the benchmark results they come from (no Spark).

Each row names the file a passage is in (the README, or the doc a passage moved to), the
passage (whitespace-normalised), the figure as it is written there, and the value in
``benchmarks/results/`` (or, for the per-request CPU profile, which no results file holds,
the sentence of ``benchmarks/README.md``; for an earlier run's figures, the table of the
doc that keeps them) it comes from. A figure edited, or a result re-run, without the other
fails here.
"""

from __future__ import annotations

import json
import math
import pathlib
import re

import pytest

from tests.unit.helpers import benchmark

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _words(text: str) -> str:
    return " ".join(text.split())


def _json(name: str):
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def _end_to_end(name: str, key: str = "ratio_to_plain"):
    return lambda: next(r for r in _json("end_to_end.json")["results"] if r["name"] == name)[key]


def _largest_accuracy_gap():
    defaults = ("synchronous (default)", "asynchronous (default)", "hogwild (default)",
                "synchronous (default), overlap", "hogwild, overlap")
    return max(abs(_end_to_end(name, "accuracy_delta_pp")()) for name in defaults)


def _first_fit(name: str, key: str = "fit"):
    return lambda: _json("first_fit.json")["best"][name][key]


def _worker_start():
    """What a first fit pays for starting the Python workers: no warm-up, fit at once, less a later fit."""
    return _first_fit("session, fit at once, no warm-up")() - _first_fit("session, fit at once, no warm-up",
                                                                         "second_fit")()


def _spark_default_time_ratios():
    """The latest Spark run of the two defaults on the small workloads: each default's time over plain Keras' at 2
    workers, mean of its seeds, per workload."""
    time_ratio = benchmark("convergence").time_ratio
    rows = _json("convergence_spark_v4_s012.json")["rows"]
    plain = {(r["workload"], r["seed"]): r for r in rows if r["config"] == "plain"}
    ratios: dict[tuple, list[float]] = {}
    for r in rows:
        if r["config"] != "plain" and r["workers"] == 2:
            ratio, _, _ = time_ratio(r, plain[r["workload"], r["seed"]])
            ratios.setdefault((r["workload"], r["config"]), []).append(ratio)
    return [sum(values) / len(values) for values in ratios.values()]


def _profile(sentence: str):
    """The ``low-high`` range a sentence of benchmarks/README.md gives (CPU per commit, from a profile)."""
    text = _words((ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8"))
    assert sentence in text, f"benchmarks/README.md no longer says {sentence!r}"
    low, high = re.match(r"([\d.]+)-([\d.]+)", sentence).groups()
    return lambda: (float(low), float(high))


def _table_cell(doc: str, row_start: str, cell: str):
    """A figure of a table row of ``doc`` (a path from the repository root) that no results file keeps (an
    earlier run's)."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    line = next((line for line in text.splitlines() if line.startswith(row_start)), "")
    return lambda: float(cell) if f"| {cell} |" in line or f"| **{cell}** |" in line else math.nan


README = "README.md"
CONVERGENCE = "docs/convergence.md"
PARAMETER_SERVER = "docs/parameter_server.md"

#: (the file the passage is in, the passage, the figure in it, where it comes from, how they compare):
#: "round:N": the value rounded to N decimals is the figure; "range": the figure ("a-b") holds the value;
#: "bound": no value exceeds the figure; "in": the figure lies in the source's (low, high) range.
FIGURES = [
    (README, "default took 0.71× the wall time of plain `model.fit`", "0.71",
     _end_to_end("synchronous (default)"), "round:2"),
    (README, "0.71× too with `SparkModel(overlap=True)`", "0.71", _end_to_end("synchronous (default), overlap"), "round:2"),
    (README, "0.64× (asynchronous: commits every 32 steps", "0.64", _end_to_end("asynchronous (default)"), "round:2"),
    (README, "and 0.96× (hogwild: DOWNPOUR", "0.96", _end_to_end("hogwild (default)"), "round:2"),
    (README, "step; 0.93× with overlap)", "0.93", _end_to_end("hogwild, overlap"), "round:2"),
    (README, "all within 0.5 point of plain Keras' test accuracy", "0.5", _largest_accuracy_gap, "bound"),
    (README, "`benchmarks/results/end_to_end.json`, plain Keras 13.1 s", "13.1", _end_to_end("plain keras", "seconds"),
     "round:1"),
    (CONVERGENCE, "and an earlier one 11.7 s", "11.7", _table_cell(CONVERGENCE, "| plain Keras |", "11.7"), "round:1"),
    (CONVERGENCE, "the synchronous default's 1.03×", "1.03",
     _table_cell(CONVERGENCE, "| synchronous (default: averaging", "1.03"), "round:2"),
    (README, "the defaults took 0.58 to 0.97× plain Keras' time at 2 workers", "0.58",
     lambda: min(_spark_default_time_ratios()), "round:2"),
    (README, "the defaults took 0.58 to 0.97× plain Keras' time at 2 workers", "0.97",
     lambda: max(_spark_default_time_ratios()), "round:2"),
    (README, "Python workers (about 7 s on 2 cores, mostly importing TensorFlow)", "7", _worker_start, "round:0"),
    (README, "a first fit on 2,000 samples took 1.6 s instead of 8.3 s", "1.6",
     _first_fit("session, fit after 10 s"), "round:1"),
    (README, "a first fit on 2,000 samples took 1.6 s instead of 8.3 s", "8.3",
     _first_fit("session, fit after 10 s, no warm-up"), "round:1"),
    (PARAMETER_SERVER, "left commit p99 at 1.16x its quiet value", "1.16",
     lambda: _json("flood.json")["server"]["p99_ratio"], "round:2"),
    (README, "per 32 KB commit about 0.50 ms in the server", "0.50",
     lambda: next(r["server_ms_per_commit"] for r in _json("ps_scale_binary_s1.json")["rows"]
                  if r["phase"] == "a" and r["size"] == "32KB"), "round:2"),
    (README, "and 0.35 ms in the client", "0.35", _profile("0.32-0.36 ms of client CPU"), "in"),
    (README, "such a commit took 0.75 ms (median)", "0.75",
     lambda: _json("ps_roundtrip.json")["latency"]["32KB"]["ps"]["commit"]["median_ms"], "round:2"),
]


def _text(doc: str) -> str:
    return _words((ROOT / doc).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def readme() -> str:
    return _text(README)


@pytest.mark.parametrize("doc, passage, figure, value, how", FIGURES,
                         ids=[f"{row[2]}:{row[1][:40]}" for row in FIGURES])
def test_a_readme_figure_is_its_results_value(doc, passage, figure, value, how):
    assert passage in _text(doc), f"{doc} no longer says {passage!r}: update FIGURES with the figure's file and source"
    assert figure in passage
    got = value()
    if how.startswith("round:"):
        assert round(got, int(how.split(":")[1])) == float(figure), f"{passage!r}: the results say {got}"
    elif how == "range":
        low, high = map(float, figure.split("-"))
        assert low <= got <= high, f"{passage!r}: the results say {got}"
    elif how == "bound":
        assert got <= float(figure), f"{passage!r}: the results say {got}"
    else:
        low, high = got
        assert low <= float(figure) <= high, f"{passage!r}: the source says {low}-{high}"


def test_the_parameter_server_request_cost_is_not_the_old_figure(readme):
    assert "about 2 ms of Python CPU" not in readme  # requests and werkzeug's client, before the own transport


def test_a_changed_result_fails_the_check(monkeypatch):
    doc, passage, figure, value, how = FIGURES[0]
    results = _json("end_to_end.json")
    next(r for r in results["results"] if r["name"] == "synchronous (default)")["ratio_to_plain"] = 1.03
    monkeypatch.setattr(f"{__name__}._json", lambda name: results)
    assert round(value(), 2) != float(figure)
