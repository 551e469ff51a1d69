"""``spark-submit --master spark://...`` of an example on a real standalone cluster, on loopback.

A master and a worker (2 cores, 2 GB) are started from the pyspark wheel's own
``spark-class``; the example runs exactly as a user runs it, and the test checks
both its accuracy and that its tasks ran in the cluster's executor (the master
lists the finished application, and the worker's work directory holds the
executor's log with the tasks it ran), not in an embedded ``local[*]`` session.
Every process is killed (its whole process group) at the end, whatever happened.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyspark
import pytest

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
SPARK_SUBMIT = SPARK_HOME / "bin" / "spark-submit"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits_mlp.py"
BUDGET = 170.0  # seconds for the whole test, cluster start-up included

pytestmark = pytest.mark.skipif(
    not (SPARK_CLASS.exists() and SPARK_SUBMIT.exists()) or not (shutil.which("java") or os.environ.get("JAVA_HOME")),
    reason=f"needs the pyspark wheel's bin/spark-class and bin/spark-submit ({SPARK_HOME / 'bin'}) and a Java runtime",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def master_state(webui_port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{webui_port}/json/", timeout=2) as response:
            return json.load(response)
    except (OSError, ValueError):
        return None


def wait_for(what: str, check, deadline: float, logs: list[Path]):
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    tails = "\n".join(f"--- {log}:\n{log.read_text(errors='replace')[-2000:]}" for log in logs if log.exists())
    pytest.fail(f"timed out waiting for {what}\n{tails}")


class Cluster:
    """A standalone master and one worker on 127.0.0.1, each in its own process group."""

    def __init__(self, root: Path, budget: float):
        self.root = root
        self.deadline = time.monotonic() + budget  # every wait of the test ends by then
        self.port, self.webui = free_port(), free_port()
        self.work_dir = root / "work"
        self.work_dir.mkdir()
        conf_dir = root / "conf"  # empty: no spark-defaults.conf of the machine leaks in
        conf_dir.mkdir()
        self.env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_CONF_DIR": str(conf_dir), "PYSPARK_PYTHON": sys.executable}
        self.env.pop("PYSPARK_GATEWAY_PORT", None)
        self.env.pop("PYSPARK_GATEWAY_SECRET", None)
        self.processes: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, args: list[str]) -> None:
        log = self.root / f"{name}.log"
        self.logs.append(log)
        with open(log, "wb") as out:
            self.processes.append(subprocess.Popen([str(SPARK_CLASS), *args], stdout=out, stderr=subprocess.STDOUT,
                                                   env=self.env, cwd=self.root, start_new_session=True))

    def start(self) -> None:
        self._start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.port), "--webui-port", str(self.webui)])
        wait_for("the master", lambda: (master_state(self.webui) or {}).get("status") == "ALIVE", self.deadline,
                 self.logs)
        self._start("worker", ["org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                               "--cores", "2", "--memory", "2g", "--webui-port", str(free_port()),
                               "--work-dir", str(self.work_dir)])
        wait_for("the worker to register", lambda: any(
            w.get("state") == "ALIVE" and w.get("cores") == 2 for w in (master_state(self.webui) or {}).get("workers", [])
        ), self.deadline, self.logs)

    def stop(self) -> None:
        for process in self.processes:  # the worker's group holds its executors and their Python workers
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(process.pid, signal.SIGKILL)  # whatever of the group outlived SIGTERM
            except ProcessLookupError:
                pass
            process.wait(timeout=10)


@pytest.fixture
def cluster(tmp_path):
    cluster = Cluster(tmp_path, BUDGET)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.timeout(BUDGET + 20)
def test_spark_submit_to_a_standalone_master_trains_on_its_executors(cluster):
    command = [str(SPARK_SUBMIT), "--master", cluster.url,
               "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
               "--conf", "spark.ui.enabled=false", str(EXAMPLE)]
    remaining = cluster.deadline - time.monotonic()
    try:
        run = subprocess.run(command, capture_output=True, text=True, env=cluster.env, cwd=cluster.root,
                             timeout=max(remaining - 10, 10), start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"spark-submit did not finish in {remaining - 10:.0f} s:\n{(exc.stderr or b'')[-3000:]!r}")
    assert run.returncode == 0, run.stderr[-4000:]
    match = re.search(r"elephant asynchronous/default: 20 epochs .* test accuracy (\d\.\d+)", run.stdout)
    assert match, run.stdout
    accuracy = float(match.group(1))
    assert accuracy >= 0.9, run.stdout  # 0.95+ on local[2]

    # The application ran on this cluster: the master lists it as finished ...
    apps = wait_for("the master to list the finished application", lambda: [
        app for app in (master_state(cluster.webui) or {}).get("completedapps", []) if app.get("name") == EXAMPLE.name
    ], min(cluster.deadline, time.monotonic() + 20), cluster.logs)  # within seconds of the driver's end
    app_id = apps[0]["id"]
    # ... and its tasks ran in the worker's executor, whose log is in the worker's work directory.
    executor_logs = list((cluster.work_dir / app_id).glob("*/stderr"))
    assert executor_logs, f"no executor of {app_id} under {cluster.work_dir}"
    finished = sum(log.read_text(errors="replace").count("Finished task") for log in executor_logs)
    # the data's check, the head's rows and the fit (its epochs as one job), 2 tasks each, at least
    assert finished >= 6, f"{finished} tasks finished in the executors of {app_id}"
    print(f"standalone {cluster.url}: test accuracy {accuracy:.4f}, {app_id}, {finished} tasks in its executors")
