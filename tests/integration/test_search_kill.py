"""A sweep whose driver is killed (SIGKILL) mid-way, then the same call again on the same journal.

The first driver is a subprocess with its own local Spark; the test watches the
journal through Optuna and kills that process once some trials have finished
and others are running. The same call then runs here, on the suite's session:
it must end with exactly ``max_evals`` finished trials (complete + pruned), the
trials finished before the kill kept as they were and none of them run again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.storages.journal import JournalFileBackend, JournalStorage
from optuna.trial import TrialState

from elephant.search import hp, minimize

from .test_search import small_model

ROOT = Path(__file__).resolve().parents[2]
MAX_EVALS = 6
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)

DRIVER = r'''
import sys

from elephant.session import local_session
from tests.integration.test_search_kill import sweep

spark = local_session("local[2]", "elephant-search-killed")
sweep(sys.argv[1], spark)
'''


def sweep(journal: str, spark):
    """The call both drivers make: 6 trials of 3 epochs, 2 at a time, ASHA on val_accuracy."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split((x / 16.0).astype("float32"), y, test_size=0.25,
                                                      random_state=0, stratify=y)
    space = {"units": hp.choice("units", [8, 16]), "lr": hp.loguniform("lr", np.log(3e-3), np.log(3e-2))}
    return minimize(small_model, space, x_train, y_train, max_evals=MAX_EVALS, parallelism=2, pruner="asha",
                    metric="val_accuracy", mode="max", validation_data=(x_val, y_val), epochs=3, num_workers=1,
                    frequency="epoch", storage=journal, seed=0, verbose=0, spark=spark)


def _trials(journal: str) -> list:
    try:
        study = optuna.load_study(study_name="elephant-search", storage=JournalStorage(JournalFileBackend(journal)))
    except KeyError:  # the driver has not created the study yet
        return []
    return study.get_trials(deepcopy=False)


@pytest.mark.timeout(240)
def test_a_killed_driver_resumes_to_exactly_max_evals_without_rerunning_finished_trials(spark, tmp_path):
    journal = str(tmp_path / "sweep.journal")
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    log = tmp_path / "driver.log"
    with open(log, "wb") as out:
        driver = subprocess.Popen([sys.executable, str(script), journal], stdout=out, stderr=subprocess.STDOUT,
                                  env=env, cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 150
        while True:  # poll the journal: kill once two trials have finished and one is running
            trials = _trials(journal) if os.path.exists(journal) else []
            done = [t for t in trials if t.state in FINISHED]
            if len(done) >= 2 and any(t.state == TrialState.RUNNING for t in trials):
                break
            if driver.poll() is not None or time.monotonic() > deadline or len(done) >= MAX_EVALS - 1:
                pytest.fail(f"no moment to kill the driver (exit {driver.poll()}, {len(done)} finished):\n"
                            f"{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        try:  # what the driver started (its Spark JVM) goes with it
            os.killpg(driver.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        driver.wait(timeout=30)

    before = {t.number: t for t in _trials(journal) if t.state in FINISHED}
    left_running = [t.number for t in _trials(journal) if t.state == TrialState.RUNNING]
    assert len(before) >= 2 and left_running

    result = sweep(journal, spark)  # the same call again

    trials = _trials(journal)
    finished = [t for t in trials if t.state in FINISHED]
    assert len(finished) == MAX_EVALS, [(t.number, t.state) for t in trials]
    for number, old in before.items():  # the trials finished before the kill are kept as they were
        now = trials[number]
        assert (now.state, now.params, now.value, now.intermediate_values) == \
            (old.state, old.params, old.value, old.intermediate_values)
    rerun = [t for t in finished if t.number not in before and t.params in [o.params for o in before.values()]]
    assert not rerun, f"finished trials ran again: {[(t.number, t.params) for t in rerun]}"
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert sorted(t.number for t in failed) == sorted(left_running)  # only the interrupted ones, marked failed
    assert all(t.user_attrs.get("elephant.interrupted") for t in failed)
    assert len(trials) == MAX_EVALS + len(left_running)  # nothing else was started
    resumed = [t for t in trials if "elephant.resumed_from" in t.user_attrs]
    assert sorted(t.user_attrs["elephant.resumed_from"] for t in resumed) == sorted(left_running)
    assert len(result.trials) == len(trials)
    assert {t.status for t in result.trials} <= {"ok", "pruned", "failed"}
