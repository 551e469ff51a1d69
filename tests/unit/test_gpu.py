"""GPU placement (elephant.gpu): Spark's task addresses -> CUDA_VISIBLE_DEVICES, the per-process binding, the refusals."""

import os

import pytest
from pyspark.resource.information import ResourceInformation

from elephant import gpu
from elephant.errors import ConfigError


@pytest.mark.parametrize("addresses, visible, expected", [
    (["0"], None, ["0"]),
    (["1", "3"], None, ["1", "3"]),
    (["0"], "4,5", ["4"]),  # the executor was limited to GPUs 4 and 5: addresses index into them
    (["1"], "4,5", ["5"]),
    (["1", "0"], " 6 , 7 ", ["7", "6"]),
    (["10"], ",".join(str(i) for i in range(11)), ["10"]),
])
def test_addresses_become_cuda_ids_indexing_into_a_preset_visible_list(addresses, visible, expected):
    info = ResourceInformation("gpu", addresses)  # what TaskContext.resources()["gpu"] holds
    assert gpu.owned_devices(info.addresses, visible) == expected


@pytest.mark.parametrize("addresses", [["01"], ["gpu0"], ["-1"], ["0", "1a"], [""]])
def test_addresses_that_are_not_cuda_numbers_are_refused_by_value(addresses):
    with pytest.raises(ConfigError, match=r"integers without zero padding.*received the task's addresses"):
        gpu.owned_devices(addresses, None)


def test_an_address_beyond_the_executors_visible_devices_is_refused():
    with pytest.raises(ConfigError, match=r"CUDA_VISIBLE_DEVICES='4,5' lists 2 devices.*\['2'\] are beyond it"):
        gpu.owned_devices(["2"], "4,5")


@pytest.mark.parametrize("env, expected", [
    ({}, {"CUDA_VISIBLE_DEVICES": "1", "TF_FORCE_GPU_ALLOW_GROWTH": "true", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}),
    ({"TF_FORCE_GPU_ALLOW_GROWTH": "false", "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}, {"CUDA_VISIBLE_DEVICES": "1"}),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "1", "TF_FORCE_GPU_ALLOW_GROWTH": "true",
                                        "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}),
])
def test_the_environment_sets_the_devices_and_lazy_allocation_the_user_left_unset(env, expected):
    assert gpu.gpu_environment(["1"], env) == expected


@pytest.mark.parametrize("devices, name", [([], "cpu"), (None, "cpu"), (["1"], "gpu:1"), (["0", "2"], "gpu:0,2")])
def test_device_names(devices, name):
    assert gpu.device_name(devices) == name


@pytest.mark.parametrize("bound, devices, started", [
    (None, ["1"], True),  # the process's first GPU task
    (("1",), ["1"], True),  # the same GPU again
    (("0",), ["1"], False),  # the framework never started (the earlier task failed before Keras)
])
def test_a_process_may_take_its_first_gpu_and_keep_it(bound, devices, started):
    gpu.check_binding(bound, devices, started, "partition 0")


def test_a_reused_worker_bound_to_another_gpu_is_refused_with_what_to_configure():
    with pytest.raises(ConfigError, match=r"partition 3 of run r was assigned gpu:1.*already started on gpu:0.*"
                                          r"spark.executor.resource.gpu.amount=1.*spark.python.worker.reuse=false"):
        gpu.check_binding(("0",), ["1"], True, "partition 3 of run r")


def test_place_maps_checks_and_sets_and_leaves_cpu_tasks_alone():
    assert gpu.place(None, {}, None, None, True, "t") == ([], {})
    assert gpu.place([], {}, "0", ("0",), True, "t") == ([], {})
    devices, variables = gpu.place(["1"], {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}, "2,3", None, True, "t")
    assert devices == ["3"] and variables == {"CUDA_VISIBLE_DEVICES": "3", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    with pytest.raises(ConfigError, match="already started on gpu:2"):
        gpu.place(["1"], {}, "2,3", ("2",), True, "t")


class _Context:
    def __init__(self, addresses):
        self._resources = {} if addresses is None else {"gpu": ResourceInformation("gpu", addresses)}

    def resources(self):
        return self._resources


@pytest.fixture
def task(monkeypatch):
    """Run place_task as if in a fresh Python worker whose running Spark task has the given GPU addresses."""
    import pyspark

    monkeypatch.setattr(gpu, "_PROCESS", gpu._Placement())
    for name in ("CUDA_VISIBLE_DEVICES", *gpu.GPU_DEFAULTS):
        monkeypatch.delenv(name, raising=False)

    def run(addresses, started=True):
        monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: _Context(addresses)))
        monkeypatch.setattr(gpu, "_framework_started", lambda: started)
        return gpu.place_task("partition 0")

    return run


def test_place_task_binds_the_process_and_remembers_the_executors_own_list(task, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    assert task(["1"], started=False) == "gpu:7"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7" and os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert task(["1"]) == "gpu:7"  # indexed into the executor's "6,7" again, not into the "7" set above
    with pytest.raises(ConfigError, match="assigned gpu:6, .* already started on gpu:7"):
        task(["0"])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7"  # a refused task changes nothing


def test_place_task_without_gpus_is_cpu_and_changes_nothing(task):
    assert task(None) == "cpu"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ and "TF_FORCE_GPU_ALLOW_GROWTH" not in os.environ


def test_place_task_outside_spark_is_cpu():
    assert gpu.place_task() == "cpu"  # no TaskContext in the test process


@pytest.mark.parametrize("conf, master, backend, env, message", [
    ({"spark.task.resource.gpu.amount": "1"}, "local[2]", "tensorflow", {},
     r"`spark.task.resource.gpu.amount`=1 asks Spark for GPUs, but the master is 'local\[2\]'"),
    ({"spark.task.resource.gpu.amount": "0.5"}, "local", "jax", {}, "the master is 'local'"),
    ({"spark.task.resource.gpu.amount": "0.5"}, "spark://h:7077", "jax", {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"},
     r"=0.5 shares each GPU between 2 tasks, but XLA_PYTHON_CLIENT_PREALLOCATE=true"),
    ({"spark.task.resource.gpu.amount": "0.25"}, "yarn", "jax", {"XLA_PYTHON_CLIENT_PREALLOCATE": "1"},
     "between 4 tasks"),
    ({"spark.task.resource.gpu.amount": "one"}, "yarn", "jax", {}, r"must be a number; received 'one'"),
])
def test_gpu_requests_that_cannot_work_are_refused_on_the_driver(conf, master, backend, env, message):
    with pytest.raises(ConfigError, match=message):
        gpu.check_request(conf, master, backend, env)


@pytest.mark.parametrize("conf, master, backend, env", [
    ({}, "local[2]", "jax", {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}),  # no GPUs asked for
    ({"spark.task.resource.gpu.amount": "0"}, "local[2]", "torch", {}),
    ({"spark.task.resource.gpu.amount": "1"}, "local-cluster[1,2,1024]", "jax", {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}),
    ({"spark.task.resource.gpu.amount": "0.5"}, "yarn", "jax", {}),  # elephant's default: no preallocation
    ({"spark.task.resource.gpu.amount": "0.5"}, "yarn", "jax", {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}),
    ({"spark.task.resource.gpu.amount": "0.5"}, "k8s://https://api:6443", "tensorflow",
     {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}),  # only JAX preallocates
])
def test_gpu_requests_that_work_pass(conf, master, backend, env):
    gpu.check_request(conf, master, backend, env)


@pytest.mark.parametrize("conf, text", [
    ({}, "CPU (no GPUs requested from Spark)"),
    ({"spark.task.resource.gpu.amount": "1"}, "1 GPU per task (spark.task.resource.gpu.amount=1)"),
    ({"spark.task.resource.gpu.amount": "0.5"}, "1/2 of a GPU per task (spark.task.resource.gpu.amount=0.5)"),
])
def test_the_request_as_the_fit_logs_it(conf, text):
    assert gpu.describe_request(conf) == text
