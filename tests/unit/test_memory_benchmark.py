"""benchmarks/memory.py: reading /proc, telling Spark's processes apart, and the targets against 1x."""

from __future__ import annotations

import os

import pytest

from tests.unit.helpers import benchmark

memory = benchmark("memory")

JAVA = b"/usr/lib/jvm/java-17-openjdk-amd64/bin/java\0-cp\0/venv/pyspark/jars/*\0-Xmx1g\0"


def test_status_gives_rss_and_its_high_water_mark_in_bytes_and_zero_for_a_zombie():
    text = "Name:\tpython\nVmPeak:\t 2000 kB\nVmHWM:\t  805000 kB\nVmRSS:\t  496000 kB\nThreads:\t4\n"
    assert memory.parse_status(text) == {"VmRSS": 496_000 * 1024, "VmHWM": 805_000 * 1024}
    assert memory.parse_status("Name:\tjava\nState:\tZ (zombie)\n") == {"VmRSS": 0, "VmHWM": 0}


def test_the_parent_is_read_after_the_command_even_one_with_spaces_and_parentheses():
    assert memory.parse_ppid("4242 (python) S 4200 4242 4200 0 -1") == 4200
    assert memory.parse_ppid("4243 (Worker (1) x) R 17 4243 17 0 -1") == 17


@pytest.mark.parametrize(("cmdline", "kind"), [
    (JAVA + b"org.apache.spark.executor.CoarseGrainedExecutorBackend\0--driver-url\0", "executor_jvm"),
    (JAVA + b"org.apache.spark.deploy.SparkSubmit\0--conf\0spark.master=local[2]\0pyspark-shell\0", "driver_jvm"),
    (b"/venv/bin/python\0-m\0elephant.daemon\0pyspark.worker\0", "python_worker"),
    (b"/usr/bin/python3.11\0-m\0pyspark.daemon\0", "python_worker"),
    # the launcher script before it execs java: its arguments name the daemon module and SparkSubmit
    (b"bash\0/venv/pyspark/bin/spark-class\0org.apache.spark.deploy.SparkSubmit\0--conf\0"
     b"spark.python.daemon.module=elephant.daemon\0", None),
    (b"/venv/bin/python\0-c\0from multiprocessing.resource_tracker import main\0", None),
])
def test_each_process_is_told_by_its_program_and_arguments(cmdline, kind):
    assert memory.kind_of(cmdline, 200, root=100) == kind


def test_the_root_is_the_driver_python_whatever_its_command_line():
    assert memory.kind_of(b"/venv/bin/python\0benchmarks/memory.py\0", 100, root=100) == "driver_python"


def test_a_python_process_started_by_a_jvm_is_a_daemon_and_one_it_forked_a_worker():
    parents = {10: 1, 11: 10, 12: 11, 13: 12, 14: 11}
    kinds = {10: "driver_jvm", 11: "executor_jvm", 12: "python_worker", 13: "python_worker", 14: None}
    assert memory.split_daemons(kinds, parents) == {10: "driver_jvm", 11: "executor_jvm", 12: "python_daemon",
                                                    13: "python_worker", 14: None}


def test_descendants_are_the_root_and_everything_below_it_not_its_siblings():
    parents = {1: 0, 5: 1, 6: 5, 7: 6, 8: 1, 9: 8, 20: 0}
    assert memory.descendants(parents, 5) == {5, 6, 7}
    assert memory.descendants(parents, 7) == {7}
    assert memory.descendants(parents, 1) == {1, 5, 6, 7, 8, 9}


def test_the_sampler_finds_this_process_and_its_peak():
    sampler = memory.ProcessPeaks(root=os.getpid())
    sampler.sample()
    assert sampler.peak["driver_python"] >= sampler.total["driver_python"] > 0
    assert sampler.count["driver_python"] == 1 and sampler.samples == 1


def _run(mode, scale, worker, executors, seconds=10.0):
    return {"mode": mode, "scale": scale, "data_bytes": scale * 100, "seconds": seconds, "task_peak_rss": worker,
            "processes": {"peak": {"python_worker": worker, "executor_jvm": executors // 2, "driver_jvm": 5,
                                   "driver_python": 7},
                          "total": {"executor_jvm": executors}}}


def test_ratios_are_to_the_smallest_size_of_the_same_mode_and_the_targets_follow_from_them():
    runs = memory.with_ratios([_run("synchronous", 1, 1000, 800), _run("synchronous", 4, 1200, 1000, 40.0),
                               _run("synchronous", 16, 1300, 2000), _run("asynchronous", 4, 500, 400)])
    one, four, sixteen, other = runs
    assert one["ratios"]["data"] == 1 and four["ratios"] == {
        "data": 4.0, "seconds": 4.0, "python_worker": 1.2, "task_peak_rss": 1.2, "executor_jvm": 1.25,
        "executor_jvms": 1.25, "driver_jvm": 1.0, "driver_python": 1.0}
    assert other["ratios"]["python_worker"] == 1.0  # its mode's own smallest run
    assert memory.verdicts(one) == {"python_worker_within_1.25x": None, "jvm_growth_under_half_the_data's": None}
    assert memory.verdicts(four) == {"python_worker_within_1.25x": True, "jvm_growth_under_half_the_data's": True}
    # a worker at 1.3x; the executors at 2.5x (grown by 1.5) where the data grew by 15: under half of it
    assert memory.verdicts(sixteen) == {"python_worker_within_1.25x": False, "jvm_growth_under_half_the_data's": True}
