"""A fit's epochs as one Spark job: the course the driver opens epochs on, the decision, the task's loop."""

import dataclasses
import json
import os
import threading

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from elephant import optimizers as O  # noqa: E402
from elephant import worker  # noqa: E402
from elephant.errors import ProtocolError  # noqa: E402
from elephant.fit import resident  # noqa: E402
from elephant.fit.resident import EPOCH_FIELDS, HeldBlocks, applied, epoch_changes, same_job, why_not  # noqa: E402
from elephant.model_io import fingerprint, model_to_bytes  # noqa: E402
from elephant.ps.app import create_app  # noqa: E402
from elephant.ps.client import InProcessClient  # noqa: E402
from elephant.ps.course import CLOSED, Course  # noqa: E402
from elephant.ps.store import Store  # noqa: E402
from tests.unit.helpers import tiny_model  # noqa: E402

TOKEN = "course-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_a_task_gets_the_first_epoch_opened_from_the_one_it_asks_for_and_closed_at_the_end():
    course = Course(2)
    assert course.next(0, timeout=0.01) is None  # nothing opened yet: ask again
    course.open(0, {"learning_rate": 0.1})
    assert course.next(0, timeout=0.01) == {"learning_rate": 0.1, "epoch": 0}
    assert course.next(1, timeout=0.01) is None  # epoch 0 trained: wait for the next
    course.open(1, {"learning_rate": 0.05})
    assert course.next(1, timeout=0.01) == {"learning_rate": 0.05, "epoch": 1}
    assert course.next(0, timeout=0.01) == {"learning_rate": 0.05, "epoch": 1}  # a restarted task: the epoch open now
    course.close()
    assert course.next(2, timeout=5.0) == CLOSED  # at once, not after the timeout


def test_a_waiting_task_wakes_when_the_driver_opens_the_epoch():
    course, got = Course(1), []
    waiter = threading.Thread(target=lambda: got.append(course.next(3, timeout=30.0)))
    waiter.start()
    course.open(3, {})
    waiter.join(10.0)
    assert got == [{"epoch": 3}]


def test_the_driver_gets_every_partitions_report_of_its_try_in_partition_order():
    course = Course(2)
    course.report("run.t1", 0, 1, {"partition": 1, "try": 1})  # a rolled-back try's report stays its own
    course.report("run", 0, 1, {"partition": 1})
    course.report("run", 0, 0, {"partition": 0})
    assert course.wait_reports("run", 0) == [{"partition": 0}, {"partition": 1}]
    with pytest.raises(ProtocolError, match=r"partition must be in \[0, 2\); received partition=2"):
        course.report("run", 0, 2, {})


def test_a_failed_job_wakes_the_driver_with_its_error_and_a_restart_clears_it():
    course = Course(2)
    course.report("run", 0, 0, {})
    failure = RuntimeError("the barrier stage failed")
    threading.Timer(0.05, course.fail, (failure,)).start()
    with pytest.raises(RuntimeError, match="the barrier stage failed"):
        course.wait_reports("run", 0, poll=0.01)
    course.close()
    course.restart()
    assert course.next(0, timeout=0.01) is None  # open again, no epoch of the failed job left
    course.report("run.e0t1", 0, 0, {"p": 0})
    course.report("run.e0t1", 0, 1, {"p": 1})
    assert course.wait_reports("run.e0t1", 0) == [{"p": 0}, {"p": 1}]


def test_a_task_of_a_failed_job_still_waiting_is_told_to_end_when_the_next_job_starts():
    """Spark ends a failed barrier stage's other tasks only when they return: one that trained its epoch and waits
    for the next would hold its task slot, and the next job's barrier stage would never start."""
    course = Course(2)
    course.restart(1)
    course.open(0, {})
    assert course.next(0, timeout=0.01, job=1) == {"epoch": 0}
    got = []
    zombie = threading.Thread(target=lambda: got.append(course.next(1, timeout=30.0, job=1)))
    zombie.start()
    course.restart(2)  # the job failed; the driver starts the epoch's next try as job 2
    zombie.join(5.0)
    assert got == [CLOSED]
    course.open(0, {})
    assert course.next(0, timeout=0.01, job=2) == {"epoch": 0}
    assert course.next(0, timeout=0.01, job=1) == CLOSED


def test_the_server_serves_the_course_and_takes_the_stats_with_a_finish():
    store = Store([np.zeros(3, np.float32)], O.Downpour(), "asynchronous", 2, "run")
    course = Course(2)
    client = create_app(store, TOKEN, course=course).test_client()
    course.open(0, {"window": 4})
    answer = client.get("/course?epoch=0", headers=AUTH)
    assert answer.status_code == 200 and answer.get_json() == {"window": 4, "epoch": 0}
    finish = {"run": "run", "epoch": 0, "partition": 1, "attempt": 1, "stats": {"steps": 7}}
    assert client.post("/finish", json=finish, headers=AUTH).status_code == 200
    assert client.post("/finish", json=dict(finish, partition=0, stats={"steps": 6}), headers=AUTH).status_code == 200
    assert course.wait_reports("run", 0) == [{"steps": 6}, {"steps": 7}]
    refused = client.get("/course?epoch=-1", headers=AUTH)
    assert refused.status_code == 400 and "epoch" in refused.get_json()["error"]
    course.restart(3)
    assert client.get("/course?epoch=0&job=2", headers=AUTH).get_json() == CLOSED  # a task of an earlier job


def test_a_server_without_a_course_refuses_stats_and_has_no_course_route():
    store = Store([np.zeros(3, np.float32)], O.Downpour(), "asynchronous", 2, "run")
    client = create_app(store, TOKEN).test_client()
    finish = {"run": "run", "epoch": 0, "partition": 0, "attempt": 1, "stats": {}}
    refused = client.post("/finish", json=finish, headers=AUTH)
    assert refused.status_code == 400 and "run, epoch, partition, attempt" in refused.get_json()["error"]
    assert client.get("/course?epoch=0", headers=AUTH).status_code == 404


@pytest.mark.parametrize("changes, why", [
    ({}, None),
    ({"hosted": True}, "ps_placement='executors'"),
    ({"shards": 2}, "split into 2 shards"),
    ({"slots": 1}, "1 task slots cannot run the 2 workers at once"),
    ({"coalesced": True}, "coalesced"),
    ({"buffer": 199}, r"a partition \(100 samples\) is larger than half a task's shuffle buffer \(199 samples\)"),
    ({"buffer": 99, "in_memory": True}, None),  # numpy shards: the task holds them anyway
])
def test_why_a_fit_runs_a_job_per_epoch(changes, why):
    args = dict(hosted=False, shards=1, slots=2, num_workers=2, coalesced=False, in_memory=False,
                partition_samples=(100, 90), buffer=200)
    found = why_not(**dict(args, **changes))
    assert (found is None) if why is None else (found is not None and __import__("re").search(why, found))


def test_held_blocks_are_read_from_spark_once_and_given_again_in_order_after_an_early_stop():
    reads = []

    def source():
        for i in range(4):
            reads.append(i)
            yield (np.full(2, i),)

    held = HeldBlocks(source())
    first = held.blocks()
    assert [int(b[0][0]) for b, _ in zip(first, range(2))] == [0, 1]  # a pass that stopped after two blocks
    held.complete()
    assert [int(b[0][0]) for b in held.blocks()] == [0, 1, 2, 3]
    assert [int(b[0][0]) for b in held.blocks()] == [0, 1, 2, 3]
    assert reads == [0, 1, 2, 3]  # each block read once


def _spec(model, run="run-r", **changes):
    archive = model_to_bytes(model)
    spec = worker.TaskSpec(run=run, epoch=0, model_bytes=archive, fingerprint=fingerprint(archive),
                           optimizer=O.Downpour(), window=2, batch_size=32, mode="asynchronous", ps_url="in-process",
                           token="t", read_timeout=5.0, learning_rate=0.05)
    return dataclasses.replace(spec, **changes)


def test_an_epoch_changes_only_its_fields_and_a_spec_that_differs_elsewhere_needs_a_new_job():
    spec = _spec(tiny_model())
    later = dataclasses.replace(spec, epoch=3, learning_rate=0.01, window=4, resume_steps=(2, 1), last_epoch=True)
    changes = json.loads(json.dumps(epoch_changes(later)))  # what the route carries
    assert set(changes) == set(EPOCH_FIELDS)
    here = applied(spec, changes)
    assert dataclasses.replace(here, optimizer=later.optimizer) == later
    assert here.optimizer is not spec.optimizer  # each epoch a fresh copy, as a task of its own would unpickle
    assert same_job(spec, later)
    assert not same_job(spec, dataclasses.replace(later, ps_run="run-r.e3t1"))  # a rolled-back try: a new job


def test_a_resident_task_trains_each_epoch_the_driver_opens_with_its_replica_kept(linear_data):
    model = tiny_model()
    spec = _spec(model, shuffle_key="k")
    store = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, spec.run)
    course = Course(1)
    reads = []

    def blocks():
        reads.append(1)
        yield linear_data

    trained = []
    task = threading.Thread(target=lambda: trained.append(
        resident.train_resident(spec, 0, 1, blocks(), InProcessClient(store, course), 1)))
    task.start()
    reports = []
    for epoch, rate in ((0, 0.05), (1, 0.0)):
        course.open(epoch, epoch_changes(dataclasses.replace(spec, epoch=epoch, learning_rate=rate)))
        reports.append(course.wait_reports(spec.run, epoch)[0])
        if epoch == 0:
            after_first = [w.copy() for w in store.center()]
    course.close()
    task.join(60.0)
    assert trained == [2] and reads == [1]  # two epochs from one read of the partition
    assert [r["optimizer_state"] for r in reports] == ["new", "kept"]
    assert [r["learning_rate"] for r in reports] == pytest.approx([0.05, 0.0])
    assert all(r["samples"] == len(linear_data[0]) and r["steps"] > 0 for r in reports)
    for got, want in zip(store.center(), after_first, strict=True):
        np.testing.assert_array_equal(got, want)  # the second epoch at rate 0 moved nothing


def test_validation_overlaps_the_next_epoch_only_where_no_callback_can_change_it(monkeypatch):
    import keras

    passive = [keras.callbacks.CSVLogger(os.devnull), keras.callbacks.ModelCheckpoint("m.keras"),
               keras.callbacks.History()]
    assert resident.overlaps_validation(None, inside_saves=False) is None
    assert resident.overlaps_validation(passive, inside_saves=False) is None
    assert resident.overlaps_validation(passive, inside_saves=True) == "BackupAndRestore saves inside the epochs"
    for callback in (keras.callbacks.EarlyStopping(), keras.callbacks.ReduceLROnPlateau(),
                     keras.callbacks.LearningRateScheduler(lambda e, lr: lr), keras.callbacks.TerminateOnNaN(),
                     keras.callbacks.LambdaCallback()):
        assert resident.overlaps_validation([*passive, callback], inside_saves=False) == (
            f"the callback {type(callback).__name__} may change the next epoch")

    class Logger(keras.callbacks.CSVLogger):  # a subclass may do anything at an epoch's end
        pass

    assert "Logger may change" in resident.overlaps_validation([Logger(os.devnull)], inside_saves=False)
    monkeypatch.setattr(resident, "OVERLAP_VALIDATION", False)
    assert resident.overlaps_validation(None, inside_saves=False) == (
        "elephant.fit.resident.OVERLAP_VALIDATION is False")
