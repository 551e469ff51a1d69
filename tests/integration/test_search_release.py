"""A pruned trial gives back its Spark jobs, parameter server and cached blocks at the decision.

At once, not after the fit's other epochs: no job of the trial's group starts after the decision. The time
bound only keeps the watcher from polling forever; it leaves room for a loaded machine.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa

from elephant.search import hp, minimize
from elephant.search.job import FitJob

from .test_search import small_model
from .test_search_resume import PruneAt

RELEASE_S = 10.0


def _ps_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("elephant-ps")]


def _active_jobs(sc, group: str) -> list[int]:
    tracker = sc.statusTracker()
    return [j for j in tracker.getJobIdsForGroup(group)
            if (info := tracker.getJobInfo(j)) is not None and info.status in ("RUNNING", "UNKNOWN")]


def test_a_pruned_trial_releases_its_job_group_server_and_cached_blocks_at_the_decision(spark, digits, monkeypatch):
    x_train, x_test, y_train, y_test = digits
    offsets = np.arange(0, x_train.size + 1, 64, dtype=np.int32)
    features = pa.ListArray.from_arrays(pa.array(offsets), pa.array(x_train.ravel()))
    df = spark.createDataFrame(pa.table({"features": features, "label": pa.array(y_train)}).to_pandas())
    sc = spark.sparkContext
    cached_before = sc._jsc.getPersistentRDDs().size()
    seen: dict = {}
    report = FitJob.report

    def watch(group: str) -> None:  # polls from the decision until all three are released
        while time.monotonic() - seen["decided"] < RELEASE_S:
            state = (_active_jobs(sc, group), _ps_threads(), sc._jsc.getPersistentRDDs().size())
            if not state[0] and not state[1] and state[2] <= cached_before:
                seen["released"] = time.monotonic()
                return
            seen["last"] = state
            time.sleep(0.005)

    def deciding(self, epoch, logs, final=False):
        pruned = report(self, epoch, logs, final)
        if pruned and "decided" not in seen:
            seen["decided"] = time.monotonic()
            group = self.sm.job_group
            seen["held"] = (group, sc._jsc.getPersistentRDDs().size(), _ps_threads(),
                            list(sc.statusTracker().getJobIdsForGroup(group)))
            seen["watcher"] = threading.Thread(target=watch, args=(group,), name="release-watcher")
            seen["watcher"].start()
        return pruned

    monkeypatch.setattr(FitJob, "report", deciding)
    result = minimize(small_model, {"units": hp.choice("units", [8, 16])}, df, max_evals=1,
                      pruner=PruneAt({0}, step=1), metric="val_accuracy", mode="max",
                      validation_data=(x_test, y_test), epochs=5, num_workers=2, batch_size=32, seed=0, verbose=0,
                      spark=spark)
    seen["watcher"].join()
    assert [t.status for t in result.trials] == ["pruned"] and result.trials[0].epochs == 1
    group, cached, servers, jobs = seen["held"]
    assert cached > cached_before and servers and jobs, seen["held"]  # all three were held at the decision
    assert "released" in seen, f"not released {RELEASE_S:.0f}s after the decision: {seen.get('last')}"
    assert sorted(sc.statusTracker().getJobIdsForGroup(group)) == sorted(jobs)  # no job of a later epoch ever started
