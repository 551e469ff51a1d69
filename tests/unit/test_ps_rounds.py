"""elephant.ps.rounds: a Rounds object on its own, with a stand-in for the store's apply."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from elephant.errors import PSError
from elephant.optimizers import Commit, Downpour, ModelAveraging
from elephant.ps.rounds import Epoch, Rounds
from elephant.ps.wire import CommitKey

RUN = "run-r"


def delta(value):
    return Commit(tensors=[np.full(2, value)], num_steps=1, num_samples=1, base_clock=0)


class Host:
    """The store's side: a condition and an apply that runs the rule on a center of zeros."""

    def __init__(self):
        self.cond = threading.Condition()
        self.applied = []

    def apply(self, ep, what, rule, entries):
        center, replies, _ = rule(None, [np.zeros(2)], 0)
        self.applied.append([(key.partition, attempt) for key, attempt, _ in entries])
        return 1, center, replies, {}


def rounds(optimizer, num_workers=3, mode="synchronous"):
    host = Host()
    return host, Rounds(optimizer, mode, num_workers, 0.5, host.cond, host.apply), Epoch(commits=[0] * num_workers)


def averaging(streams=True):
    optimizer = ModelAveraging(outer_momentum=0.0)
    optimizer.streams_rounds = streams  # False: the round holds the commits until it closes
    return optimizer


@pytest.mark.parametrize("streams", [True, False], ids=["streamed", "held"])
def test_a_round_closes_once_every_active_partition_committed(streams):
    host, r, ep = rounds(averaging(streams))
    with host.cond:
        first = r.enter(ep, CommitKey(RUN, 0, 2, 0), 4, delta(3.0), "commit 2")
        ep.finished.add(1)
        r.close_ready(ep)
        assert not first.done and host.applied == []
        second = r.enter(ep, CommitKey(RUN, 0, 0, 0), 5, delta(1.0), "commit 0")
        assert first.done and second.done and host.applied == [[(0, 5), (2, 4)]]
        assert r.result(first).clock == 1 and first.newer_attempt is None
        np.testing.assert_array_equal(r.result(second).center[0], np.full(2, 2.0))


def test_a_withdrawn_commit_leaves_its_round_and_names_who_is_missing():
    host, r, ep = rounds(averaging(streams=False))
    with host.cond:
        ticket = r.enter(ep, CommitKey(RUN, 0, 1, 3), 1, delta(1.0), "commit 1")
        assert r.withdraw(ticket) == "commit 1 waited 0.5 s for round (epoch 0, step 3); committed: [], missing: [0, 2]"
        assert ep.rounds == {}


def test_an_abandoned_round_wakes_its_waiters_with_the_reason():
    host, r, ep = rounds(averaging())
    with host.cond:
        ticket = r.enter(ep, CommitKey(RUN, 0, 0, 0), 1, delta(1.0), "commit 0")
        r.abandon(ep, "the epoch was rolled back")
        assert ticket.done
        with pytest.raises(PSError, match=r"commit 0: round \(epoch 0, step 0\) failed: the epoch was rolled back"):
            r.result(ticket)


def test_admission_is_asked_only_under_a_staleness_bound_outside_synchronous_rounds():
    assert rounds(Downpour(), mode="asynchronous")[1].admission(Epoch([0, 0, 0]), 0, 0, "pull") is None
    host, r, ep = rounds(Downpour(staleness_bound=1), mode="asynchronous")
    ep.commits[:] = [3, 1, 2]
    ready, message = r.admission(ep, 0, 0, "pull (worker 0)")
    assert not ready()
    assert message() == ("pull (worker 0) waited 0.5 s for admission under staleness_bound=1: partition 0 has 3 "
                         "commits in epoch 0, the slowest active partition 1 has 1")
    ep.finished.add(1)
    assert ready()
