"""GPU placement on a real cluster with fake GPUs: local-cluster[1,2,1024], GPUs 0 and 1, one per task.

One Spark session, in a subprocess (``fake_gpu_cluster.py``): a tiny fit, then
probe jobs of two concurrent tasks in the Python workers the fit started.

What Spark does (observed with PySpark 4.3): it assigns the addresses per
task, in task order, and hands a task whichever idle Python worker comes
first, whatever GPU that worker's earlier task had. So a reused worker may be
given the other GPU, and elephant refuses that task instead of letting it run
on the GPU its framework already started on. Hence the documented layout: one
GPU per executor, or ``spark.python.worker.reuse=false``. Which rounds see a
swap is up to Spark's scheduling, so the test checks every task against what
elephant controls (its GPU, or a refusal naming the fix) and not how many
swaps happened; ``tests/unit/test_gpu.py`` refuses a swapped worker every time.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("fake_gpu_cluster.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    out = tmp_path_factory.mktemp("fake-gpus") / "result.json"
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
           "TF_CPP_MIN_LOG_LEVEL": "3", "SPARK_LOCAL_IP": "127.0.0.1"}
    run = subprocess.run([sys.executable, str(SCRIPT), str(out)], capture_output=True, text=True, env=env,
                         timeout=420)
    assert out.exists(), run.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.timeout(480)
def test_a_fit_on_fake_gpus_places_each_task_on_its_own_gpu(cluster):
    assert cluster["driver_resources"] == []  # the driver asked for no GPUs of its own
    fit = cluster["fit"]
    assert fit["error"] is None and fit["loss"] > 0
    start, devices = fit["log"]
    assert start.endswith(f"Keras backend {cluster['backend']}, devices: 1 GPU per task "
                          "(spark.task.resource.gpu.amount=1)")
    assert devices == "the tasks ran on partition 0: gpu:0, partition 1: gpu:1"  # concurrent tasks, one GPU each


@pytest.mark.timeout(480)
def test_reused_workers_keep_their_gpu_and_refuse_a_task_given_the_other(cluster):
    rounds = cluster["rounds"]
    assert len(rounds) == 4
    bound = {}  # pid -> the device id its CUDA_VISIBLE_DEVICES holds
    refused = 0
    for tasks in rounds:
        assert sorted(t["addresses"] for t in tasks) == [["0"], ["1"]]  # two concurrent tasks, different GPUs
        assert len({t["pid"] for t in tasks}) == 2
        for t in tasks:
            address = t["addresses"][0]
            assert bound.setdefault(t["pid"], t["visible"]) == t["visible"], "a worker's devices changed"
            assert t["keras_backend_env"] == cluster["backend"]
            if t["error"] is None:
                assert t["device"] == f"gpu:{address}" and t["visible"] == address
                assert t["keras_backend"] == cluster["backend"]
            else:
                refused += 1
                other = "1" if address == "0" else "0"
                assert t["visible"] == other  # the worker stays on the GPU its framework started on
                assert re.search(rf"was assigned gpu:{address}, but it runs in a reused Python worker \(pid {t['pid']}\) "
                                 rf"whose framework already started on gpu:{other}.*one GPU.*"
                                 r"spark.python.worker.reuse=false", t["error"]), t["error"]
    assert len(bound) == 2, f"the probes ran in {len(bound)} Python workers, not the fit's 2 reused ones"
    assert sorted(bound.values()) == ["0", "1"]
    print(f"{refused} of {2 * len(rounds)} probe tasks were handed the other GPU by Spark, and refused")
