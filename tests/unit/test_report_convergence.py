"""The convergence report reads each gap against plain Keras' mean over shuffle orders where they were measured."""

from __future__ import annotations

import pytest

from tests.unit.helpers import benchmark

report = benchmark("report_convergence")


def _rows(workload: str, plain: list[float], orders: list[list[float]], finals: list[float]) -> list[dict]:
    rows = []
    for seed, (reference, others, final) in enumerate(zip(plain, orders, finals)):
        rows.append({"workload": workload, "config": "plain", "workers": 0, "seed": seed, "final": reference,
                     "curve": [reference]})
        if others:
            rows.append({"workload": workload, "config": "plain-orders", "workers": 0, "seed": seed,
                         "orders": list(range(1, len(others) + 1)), "finals": others, "curves": [[v] for v in others]})
        rows.append({"workload": workload, "config": "sync-default", "workers": 8, "seed": seed, "final": final,
                     "curve": [final], "engine": "sim"})
    return rows


def test_the_gap_over_orders_is_taken_against_each_seeds_mean_of_plain_fits():
    rows = _rows("digits-mlp", plain=[0.96, 0.97], orders=[[0.94, 0.95], [0.95, 0.96]], finals=[0.95, 0.95])
    summary = report.summarise(rows)[("digits-mlp", "sync-default", 8)]
    assert summary["gap"] == pytest.approx(-1.5)  # against the one plain fit of each seed
    assert summary["gap_orders"] == pytest.approx(-0.5)  # seed 0's plain mean 0.95, seed 1's 0.96: +0.0 and -1.0


def test_a_loss_is_read_in_percent_of_the_plain_mean():
    rows = _rows("friedman-regression", plain=[6.0], orders=[[5.0, 7.0]], finals=[6.3])
    summary = report.summarise(rows)[("friedman-regression", "sync-default", 8)]
    assert summary["gap_orders"] == pytest.approx(-5.0)  # 6.3 against the mean 6.0: 5 % worse


def test_without_orders_for_every_seed_there_is_no_gap_over_orders():
    rows = _rows("digits-mlp", plain=[0.96, 0.97], orders=[[0.94], []], finals=[0.95, 0.95])
    assert report.summarise(rows)[("digits-mlp", "sync-default", 8)]["gap_orders"] is None


def test_the_spread_table_lists_each_seeds_orders_and_their_deviation():
    rows = _rows("digits-mlp", plain=[0.96], orders=[[0.94, 0.95]], finals=[0.95])
    table = report.order_spread(rows)
    assert "| digits-mlp | 0 | 0.9600 | 0.9400, 0.9500 | 1.00 |" in table
    assert report.order_spread(_rows("digits-mlp", plain=[0.96], orders=[[]], finals=[0.95])) == ""
