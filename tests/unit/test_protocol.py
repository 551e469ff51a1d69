"""elephant.protocol: the rules the server, the worker and the simulator share, stated once."""

from __future__ import annotations

import numpy as np
import pytest

from elephant import protocol as P
from elephant.optimizers import Downpour, EASGD


@pytest.mark.parametrize("commits, finished, partition, bound, admitted", [
    ([3, 1, 2], set(), 0, None, True),     # no bound
    ([3, 1, 2], set(), 0, 2, True),        # 2 ahead of the slowest: at the bound
    ([4, 1, 2], set(), 0, 2, False),       # 3 ahead
    ([4, 1, 2], {1}, 0, 2, True),          # the slowest finished: it leaves the minimum
    ([4, 1, 2], {0}, 0, 0, True),          # a finished partition is never held
    ([0, 0, 0], set(), 2, 0, True),
])
def test_ssp_admission(commits, finished, partition, bound, admitted):
    assert P.ssp_admitted(commits, finished, partition, bound) is admitted


@pytest.mark.parametrize("committed, finished, workers, closes", [
    ({0, 1, 2}, set(), 3, True),
    ({0, 2}, set(), 3, False),     # partition 1 has neither committed nor finished
    ({0, 2}, {1}, 3, True),
    (set(), {0, 1, 2}, 3, False),  # nothing to apply
])
def test_round_complete(committed, finished, workers, closes):
    assert P.round_complete(committed, finished, workers) is closes


def test_merge_without_overlap_is_the_rules_reply():
    sent = [np.ones(3, np.float32)]
    reply = P.Reply(clock=4, center=[np.full(3, 5.0, np.float32)])
    weights, _ = P.merge_reply(Downpour(), None, reply, sent, sent)
    np.testing.assert_array_equal(weights[0], reply.center[0])  # DOWNPOUR adopts the center


def test_merge_with_overlap_adds_the_progress_made_in_flight_and_keeps_dtypes():
    sent = [np.ones(3, np.float32)]
    now = [np.array([1.5, 1.0, 0.0], np.float32)]  # trained on while the commit was in flight
    reply = P.Reply(clock=4, center=[np.full(3, 5.0, np.float32)])
    weights, _ = P.merge_reply(Downpour(), None, reply, sent, now)
    np.testing.assert_allclose(weights[0], [5.5, 5.0, 4.0])
    assert weights[0].dtype == np.float32


def test_an_elastic_reply_is_applied_to_the_weights_as_sent():
    rule = EASGD(alpha=0.5)
    sent, now = [np.full(2, 2.0)], [np.full(2, 3.0)]
    elastic = [np.full(2, 0.5)]
    expected, _ = rule.on_reply(None, sent, P.Reply(clock=1, center=[np.zeros(2)], tensors=elastic))
    weights, _ = P.merge_reply(rule, None, P.Reply(clock=1, center=[np.zeros(2)], tensors=elastic), sent, now)
    np.testing.assert_allclose(weights[0], expected[0] + 1.0)


def test_the_server_the_worker_and_the_simulator_use_these_rules():
    from elephant import worker
    from elephant.optimizers import simulation
    from elephant.ps import rounds, store, wire

    assert store.ssp_admitted is P.ssp_admitted and simulation.ssp_admitted is P.ssp_admitted
    assert rounds.round_complete is P.round_complete and simulation.round_complete is P.round_complete
    assert worker.merge_reply is P.merge_reply and simulation.merge_reply is P.merge_reply
    assert wire.CommitKey is P.CommitKey and store.Commit is P.Commit
