"""benchmarks/convergence.py --time-repeats: each fit timed N times, the median kept, the ratio read with its range."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.unit.helpers import benchmark

convergence = benchmark("convergence")


def _again(*times: dict):
    """A fit's stand-in: each call returns the next of ``times``."""
    calls = iter(times)
    return lambda: dict(next(calls))


def test_one_repeat_leaves_the_row_as_it_was():
    row = {"curve": [0.9], "final": 0.9, "seconds": 30.0, "wall": 31.0}
    out = convergence.repeat_timing(dict(row), _again(), 1, ("seconds", "wall"))
    assert out == row  # no second fit, no ``_runs``


def test_repeats_keep_every_run_and_the_median_in_place_of_the_first():
    row = {"curve": [0.9], "final": 0.9, "seconds": 42.0, "wall": 44.0, "window": 8}
    out = convergence.repeat_timing(row, _again({"seconds": 25.0, "wall": 26.0, "final": 0.1},
                                                {"seconds": 30.0, "wall": 32.0}), 3, ("seconds", "wall"))
    assert out["seconds_runs"] == [42.0, 25.0, 30.0]  # the first fit's time first
    assert out["wall_runs"] == [44.0, 26.0, 32.0]
    assert out["seconds"] == 30.0 and out["wall"] == 32.0
    assert out["final"] == 0.9 and out["curve"] == [0.9] and out["window"] == 8  # the first fit's, not a timing run's


def test_an_even_number_of_repeats_takes_the_mean_of_the_middle_two():
    out = convergence.repeat_timing({"seconds": 10.0}, _again({"seconds": 20.0}), 2)
    assert out["seconds"] == 15.0 and out["seconds_runs"] == [10.0, 20.0]


def test_a_row_saved_before_reads_as_the_plain_ratio():
    row, plain = {"seconds": 33.0}, {"seconds": 28.0, "wall": 30.0}
    assert convergence.time_ratio(row, plain) == (pytest.approx(1.1), None, None)
    assert convergence.ratio_text(row, plain) == "1.10x"


def test_repeated_fits_read_as_the_ratio_of_medians_with_the_extreme_pairs():
    row = {"seconds": 33.0, "seconds_runs": [36.0, 33.0, 31.5]}
    plain = {"seconds": 28.0, "wall": 30.0, "wall_runs": [30.0, 35.0, 25.0]}
    ratio, low, high = convergence.time_ratio(row, plain)
    assert ratio == pytest.approx(1.1)  # 33 / 30: the medians
    assert low == pytest.approx(31.5 / 35.0) and high == pytest.approx(36.0 / 25.0)
    assert convergence.ratio_text(row, plain) == "1.10x (0.90-1.44)"


def test_a_range_where_only_one_side_was_repeated():
    plain = {"wall": 30.0}
    assert convergence.ratio_text({"seconds": 33.0, "seconds_runs": [30.0, 33.0, 36.0]}, plain) == "1.10x (1.00-1.20)"
    assert convergence.ratio_text({"seconds": 30.0}, {"wall": 30.0, "wall_runs": [25.0, 30.0, 40.0]}) \
        == "1.00x (0.75-1.20)"


def _fake_run(monkeypatch, tmp_path, repeats: int) -> tuple[list[dict], list[str]]:
    """``convergence.run`` on the Spark engine with every fit and the session stubbed: the rows it saves, and which
    fits it made (plain Keras rebuilt from the seed each time, the configuration's with the same arguments)."""
    calls, times = [], iter(range(10, 100))
    wl = SimpleNamespace(name="digits-mlp")
    monkeypatch.setattr(convergence, "RESULTS", str(tmp_path))
    monkeypatch.setattr(convergence.WL, "make", lambda name: wl)
    monkeypatch.setattr(convergence, "_spark", lambda slots: SimpleNamespace(
        sparkContext=SimpleNamespace(defaultParallelism=slots), stop=lambda: None))
    monkeypatch.setattr(convergence, "_warm_up", lambda spark, workers: None)

    def plain_keras(wl_, seed, order=0):
        calls.append(f"plain {seed}")
        t = float(next(times))
        return {"curve": [0.9, t], "final": t, "seconds": t, "wall": t + 1.0}

    def run_spark(wl_, config, workers, seed, spark):
        calls.append(f"{config['mode']} {workers} {seed}")
        t = float(next(times))
        return {"curve": [0.8, t], "final": t, "seconds": t, "window": 8}

    monkeypatch.setattr(convergence, "plain_keras", plain_keras)
    monkeypatch.setattr(convergence, "run_spark", run_spark)
    args = SimpleNamespace(engine="spark", tag="t", fresh=True, workloads=["digits-mlp"], rate_multiplier=1.0,
                           seeds=[0], plain_orders=0, workers=[2], configs=["sync-default"], time_repeats=repeats)
    convergence.run(args)
    rows = json.loads((tmp_path / "convergence_spark_t.json").read_text())["rows"]
    return rows, calls


def test_the_spark_engine_times_plain_keras_and_each_configuration_n_times(monkeypatch, tmp_path):
    rows, calls = _fake_run(monkeypatch, tmp_path, 3)
    assert calls == ["plain 0"] * 3 + ["synchronous 2 0"] * 3
    plain, spark = (next(r for r in rows if r["config"] == c) for c in ("plain", "sync-default"))
    assert plain["seconds_runs"] == [10.0, 11.0, 12.0] and plain["seconds"] == 11.0
    assert plain["wall_runs"] == [11.0, 12.0, 13.0] and plain["wall"] == 12.0
    assert plain["final"] == 10.0  # the curve and final metric of the first fit
    assert spark["seconds_runs"] == [13.0, 14.0, 15.0] and spark["seconds"] == 14.0
    assert spark["final"] == 13.0 and spark["window"] == 8


def test_one_time_repeat_saves_the_rows_as_before(monkeypatch, tmp_path):
    rows, calls = _fake_run(monkeypatch, tmp_path, 1)
    assert calls == ["plain 0", "synchronous 2 0"]
    assert not any(key.endswith("_runs") for row in rows for key in row)
