"""benchmarks/scaling.py: the data size, an elephant fit's time by part, speedup and efficiency, the thread pools."""

from __future__ import annotations

import pytest

from tests.unit.helpers import benchmark

scaling = benchmark("scaling")


@pytest.mark.parametrize("train", [1, 4000, 40_000, 39_999])
def test_the_generated_data_holds_at_least_the_training_samples(train):
    n = scaling.data_size(train)
    assert int(n * 0.9) >= train and int((n - 1) * 0.9) < train


def _task(seconds, setup=0.0, pull=0.0, comm=0.0, steps=10):
    return {"seconds": seconds, "setup_seconds": setup, "pull_seconds": pull, "comm_seconds": comm, "steps": steps}


def test_an_epoch_splits_its_slowest_task_and_the_rest_of_its_wall_time_is_fixed():
    parts = scaling.epoch_parts([_task(4.0, setup=0.5, pull=0.25, comm=1.0), _task(3.0, comm=0.5)], wall=5.0)
    assert parts["setup+pull"] == pytest.approx(0.75)
    assert parts["steps"] == pytest.approx(2.25)
    assert parts["commits"] == pytest.approx(1.0)
    assert parts["fixed"] == pytest.approx(1.0)
    assert parts["worker steps"] == pytest.approx((2.25 + 2.5) / 2)
    assert parts["idle"] == pytest.approx(0.5)
    assert parts["steps count"] == 20


def test_a_fits_parts_add_up_to_its_time():
    epochs = [[_task(2.0, setup=0.5, comm=0.25)], [_task(1.5, comm=0.5)]]
    parts = scaling.fit_parts(called=100.0, begins=[101.0, 103.5], returned=105.5, epochs=epochs)
    assert parts["fit start"] == pytest.approx(1.0)
    assert parts["fixed"] == pytest.approx((2.5 - 2.0) + (2.0 - 1.5))
    assert parts["fit"] == pytest.approx(5.5)
    assert sum(parts[p] for p in scaling.PARTS) == pytest.approx(parts["fit"])


def test_speedup_is_against_the_pinned_core_and_efficiency_divides_by_the_cores():
    runs = {"plain-1": [{"seconds": 10.0, "accuracy": 0.9}, {"seconds": 12.0, "accuracy": 0.8}],
            "plain-2": [{"seconds": 11.0, "accuracy": 0.85}], "sync": [{"seconds": 5.5, "accuracy": 0.9}],
            "async": []}
    rows = {r["config"]: r for r in scaling.scaling_rows(runs)}
    assert set(rows) == {"plain-1", "plain-2", "sync"}  # a configuration without runs has no row
    assert rows["plain-1"]["seconds"] == 11.0 and rows["plain-1"]["speedup"] == 1.0
    assert rows["plain-1"]["efficiency"] == 1.0
    assert rows["sync"]["speedup"] == pytest.approx(2.0) and rows["sync"]["efficiency"] == pytest.approx(1.0)
    assert rows["plain-2"]["efficiency"] == pytest.approx(0.5)


def test_without_the_baseline_there_is_no_speedup():
    rows = scaling.scaling_rows({"sync": [{"seconds": 5.0, "accuracy": 0.9}]})
    assert rows[0]["speedup"] is None and rows[0]["efficiency"] is None


def test_one_core_sets_every_backends_pools_to_one_thread_and_two_cores_leave_them_alone():
    base = {"TF_NUM_INTRAOP_THREADS": "4", "XLA_FLAGS": "--other", "PATH": "/bin", "PYTHONPATH": "/elsewhere"}
    one = scaling.thread_env(base, "jax", one_core=True)
    assert one["TF_NUM_INTRAOP_THREADS"] == one["TF_NUM_INTEROP_THREADS"] == "1"
    assert "intra_op_parallelism_threads=1" in one["XLA_FLAGS"] and "multi_thread_eigen=false" in one["XLA_FLAGS"]
    assert one["KERAS_BACKEND"] == "jax" and one["PATH"] == "/bin"
    assert one["PYTHONPATH"].split(":")[0] == scaling.ROOT and one["PYTHONPATH"].endswith("/elsewhere")
    two = scaling.thread_env(base, "tensorflow", one_core=False)
    assert "TF_NUM_INTRAOP_THREADS" not in two and "XLA_FLAGS" not in two


@pytest.mark.parametrize(("backend", "quick", "stem"), [("tensorflow", False, "scaling"), ("jax", False, "scaling_jax"),
                                                        ("tensorflow", True, "scaling_quick"),
                                                        ("torch", True, "scaling_torch_quick")])
def test_a_smoke_run_or_another_backend_never_replaces_the_tensorflow_measurement(backend, quick, stem):
    assert scaling.default_output(backend, quick) == stem
