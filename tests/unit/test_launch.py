"""elephant.launch: what elephant starts the driver's JVM with, and when the user's configuration wins (no JVM)."""

import pathlib
import tomllib

import pytest

from elephant import launch

OPTION = f"-Dlog4j2.configurationFile={launch.LOG_CONFIG.as_uri()}"


def test_with_nothing_configured_the_jvm_gets_elephants_logging_a_loopback_address_and_a_larger_heap():
    settings, variables = launch.launch_settings({}, {}, [])
    assert settings == {"spark.driver.extraJavaOptions": OPTION, "spark.driver.memory": launch.local_driver_memory()}
    assert variables == {"SPARK_LOCAL_IP": "127.0.0.1"}


@pytest.mark.parametrize("physical, heap", [
    (24 * 2**30, "6144m"),  # a quarter of the machine
    (2 * 2**30, "1024m"),  # never below Spark's own default of 1 GiB
    (0, "1024m"),  # the machine's memory unknown
    (5 * 2**30 + 3, "1280m"),  # whole MiB
])
def test_a_local_masters_heap_is_a_quarter_of_the_machines_memory_and_at_least_spark_s_default(physical, heap):
    assert launch.local_driver_memory(physical) == heap


def test_the_heap_read_from_the_machine_is_at_least_spark_s_default():
    heap = launch.local_driver_memory()
    assert heap.endswith("m") and int(heap[:-1]) >= 1024


@pytest.mark.parametrize("env, defaults, given", [
    ({}, {}, True),
    ({"MASTER": "local[4]"}, {}, True),
    ({"MASTER": "local-cluster[2,1,1024]"}, {}, False),  # its executors are JVMs of their own
    ({}, {"spark.master": "yarn"}, False),
    ({}, {"spark.driver.memory": "2g"}, False),  # the user's, in spark-defaults.conf
    ({"PYSPARK_SUBMIT_ARGS": "--driver-memory 3g pyspark-shell"}, {}, False),
    ({"PYSPARK_SUBMIT_ARGS": "--driver-memory=3g pyspark-shell"}, {}, False),
    ({"PYSPARK_SUBMIT_ARGS": "--conf spark.driver.memory=3g pyspark-shell"}, {}, False),
    ({"SPARK_DRIVER_MEMORY": "3g"}, {}, False),
    ({"SPARK_CONF_DIR": "/etc/spark"}, {}, False),  # its spark-defaults.conf may set it
    ({"PYSPARK_SUBMIT_ARGS": "--properties-file /etc/my.conf pyspark-shell"}, {}, False),
])
def test_the_heap_only_for_a_local_master_and_no_driver_memory_of_the_users(env, defaults, given):
    settings, _ = launch.launch_settings(env, defaults, [])
    assert ("spark.driver.memory" in settings) is given
    if given:
        assert settings["spark.driver.memory"] == launch.local_driver_memory()


def test_the_logging_configuration_is_shipped_with_the_package():
    text = launch.LOG_CONFIG.read_text(encoding="utf-8")
    assert "rootLogger.level = warn" in text and "org.apache.hadoop.util.NativeCodeLoader" in text
    root = pathlib.Path(launch.__file__).parents[1]
    with open(root / "pyproject.toml", "rb") as f:
        package_data = tomllib.load(f)["tool"]["setuptools"]["package-data"]["elephant"]
    assert launch.LOG_CONFIG.name in package_data  # else a wheel would not hold it


def test_a_jvm_started_by_spark_submit_is_not_elephants_to_configure():
    assert launch.launch_settings({"PYSPARK_GATEWAY_PORT": "40000"}, {}, []) == ({}, {})


@pytest.mark.parametrize("env, defaults, files, where", [
    ({"SPARK_CONF_DIR": "/etc/spark"}, {}, [], "SPARK_CONF_DIR='/etc/spark'"),
    ({}, {}, ["log4j2.properties", "spark-defaults.conf"], "log4j2.properties in Spark's conf directory"),
    ({}, {"spark.driver.extraJavaOptions": "-Xss4m"}, [], "spark.driver.extraJavaOptions='-Xss4m'"),
    ({}, {"spark.driver.defaultJavaOptions": "-XX:+UseG1GC"}, [], "spark.driver.defaultJavaOptions"),
    ({"PYSPARK_SUBMIT_ARGS": "--driver-java-options '-Dlog4j2.configurationFile=/my.properties' pyspark-shell"},
     {}, [], "spark.driver.extraJavaOptions='-Dlog4j2.configurationFile=/my.properties'"),
    ({"PYSPARK_SUBMIT_ARGS": "--conf spark.driver.extraJavaOptions=-Dx=1 pyspark-shell"}, {}, [],
     "spark.driver.extraJavaOptions='-Dx=1'"),
    ({"PYSPARK_SUBMIT_ARGS": "--properties-file /etc/my.conf pyspark-shell"}, {}, [], "--properties-file"),
    ({"JAVA_TOOL_OPTIONS": "-Dlog4j.configurationFile=x"}, {}, [], "log4j in JAVA_TOOL_OPTIONS"),
    ({"SPARK_SUBMIT_OPTS": "-Dlog4j2.level=INFO"}, {}, [], "log4j in SPARK_SUBMIT_OPTS"),
])
def test_the_users_logging_or_java_options_win(env, defaults, files, where):
    settings, _ = launch.launch_settings(env, defaults, files)
    assert not set(launch.JAVA_OPTIONS) & set(settings)
    conf = {**defaults, **launch.submit_conf(env.get("PYSPARK_SUBMIT_ARGS", ""))}
    assert where in launch.logging_configured(env, conf, files)


@pytest.mark.parametrize("env, defaults, expected", [
    ({}, {}, "127.0.0.1"),
    ({"MASTER": "local[4]"}, {}, "127.0.0.1"),
    ({"PYSPARK_SUBMIT_ARGS": "--master local[2] pyspark-shell"}, {}, "127.0.0.1"),
    ({"MASTER": "yarn"}, {}, None),  # executors elsewhere must reach the driver
    ({}, {"spark.master": "spark://head:7077"}, None),
    ({"PYSPARK_SUBMIT_ARGS": "--master=local-cluster[2,1,1024] pyspark-shell"}, {}, None),
    ({"SPARK_LOCAL_IP": "10.0.0.5"}, {}, None),  # the user's own address
    ({"SPARK_LOCAL_HOSTNAME": "edge-1"}, {}, None),
    ({}, {"spark.driver.host": "10.0.0.5"}, None),
    ({"PYSPARK_SUBMIT_ARGS": "--properties-file /etc/my.conf pyspark-shell"}, {}, None),  # its master is unknown
])
def test_the_loopback_address_only_for_a_local_master_and_no_address_of_the_users(env, defaults, expected):
    _, variables = launch.launch_settings(env, defaults, [])
    assert variables.get("SPARK_LOCAL_IP") == expected


def test_submit_args_and_defaults_are_read_as_spark_submit_reads_them():
    args = "--master yarn --conf spark.a=1 -c spark.b=x=y --driver-java-options '-Da=1 -Db=2' --conf spark.a=2 pyspark-shell"
    assert launch.submit_conf(args) == {"spark.master": "yarn", "spark.a": "2", "spark.b": "x=y",
                                        "spark.driver.extraJavaOptions": "-Da=1 -Db=2"}
    assert launch.submit_conf("--driver-memory 8g pyspark-shell") == {"spark.driver.memory": "8g"}
    text = "# comment\n\nspark.master  spark://head:7077\nspark.executor.memory=4g\nspark.x:1\n! bang comment\n"
    assert launch.read_defaults(text) == {"spark.master": "spark://head:7077", "spark.executor.memory": "4g",
                                          "spark.x": "1"}


@pytest.mark.parametrize("master, local", [("local", True), ("local[*]", True), ("local[2,4]", True),
                                           ("local-cluster[2,1,1024]", False), ("yarn", False)])
def test_is_local(master, local):
    assert launch.is_local(master) is local
