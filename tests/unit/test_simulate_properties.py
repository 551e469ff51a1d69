"""Property tests over random schedules (optimizers.md §14.6), with hypothesis.

Reductions that must hold for *any* interleaving, not just the scripted ones of
the conformance table: with one worker DOWNPOUR and DynSGD are sequential SGD
and ADAG is AGN; DC-ASGD with λ = 0 is DOWNPOUR with one step per commit for any
number of workers; a synchronous round does not depend on the order in which its
commits arrive.
"""

import numpy as np

from hypothesis import given, settings, strategies as st

from elephant import optimizers as O
from elephant.optimizers import simulate
from elephant.optimizers.steps import quadratic

LR = 0.1
INIT = [np.array([0.5, -1.0]), np.array([[2.0]])]
GRAD = quadratic(3.0)
SETTINGS = settings(max_examples=40, deadline=None)


def _close(a, b):
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)


@st.composite
def asynchronous_schedules(draw, max_workers=4, max_steps=4):
    """Each worker: pull, then windows of (step n, commit), then finish; interleaved at random."""
    n = draw(st.integers(1, max_workers))
    lanes = []
    for k in range(n):
        windows = draw(st.lists(st.integers(1, max_steps), min_size=1, max_size=4))
        lane = [("pull", k)]
        for steps in windows:
            lane += [("step", k, steps), ("commit", k)]
        lanes.append(lane + [("finish", k)])
    order = draw(st.permutations([k for k, lane in enumerate(lanes) for _ in lane]))
    cursor = [0] * n
    schedule = []
    for k in order:  # a permutation of lane labels keeps every lane's own order
        schedule.append(lanes[k][cursor[k]])
        cursor[k] += 1
    return n, schedule


def _sequential_sgd(total_steps):
    w = [a.copy() for a in INIT]
    for _ in range(total_steps):
        w = [a - LR * g for a, g in zip(w, GRAD(w), strict=True)]
    return w


@SETTINGS
@given(asynchronous_schedules(max_workers=1))
def test_one_worker_downpour_and_dynsgd_are_sequential_sgd(case):
    _, schedule = case
    total = sum(e[2] for e in schedule if e[0] == "step")
    expected = _sequential_sgd(total)
    for rule in (O.Downpour(), O.DynSGD()):
        _close(simulate(rule, INIT, GRAD, schedule, local_lr=LR).center, expected)


@SETTINGS
@given(asynchronous_schedules(max_workers=1))
def test_one_worker_adag_is_agn(case):
    _, schedule = case
    _close(simulate(O.ADAG(), INIT, GRAD, schedule, local_lr=LR).center,
           simulate(O.AGN(), INIT, GRAD, schedule, local_lr=LR).center)


@SETTINGS
@given(asynchronous_schedules(max_steps=1))
def test_dcasgd_without_compensation_is_downpour_for_any_interleaving(case):
    n, schedule = case
    dc = simulate(O.DCASGD(learning_rate=LR, lambda_dc=0.0), INIT, GRAD, schedule, num_workers=n, local_lr=LR)
    ref = simulate(O.Downpour(), INIT, GRAD, schedule, num_workers=n, local_lr=LR)
    assert dc.clocks == ref.clocks
    _close(dc.center, ref.center)


@SETTINGS
@given(
    st.integers(2, 4).flatmap(lambda n: st.tuples(
        st.just(n),
        st.lists(st.lists(st.integers(1, 3), min_size=n, max_size=n), min_size=1, max_size=3),
        st.randoms(use_true_random=False),
    ))
)
def test_a_synchronous_round_does_not_depend_on_commit_order(case):
    n, rounds, rng = case
    ordered = [("pull", k) for k in range(n)]
    shuffled = list(ordered)
    for steps in rounds:
        ordered += [("step", k, steps[k]) for k in range(n)] + [("commit", k) for k in range(n)]
        commits = [("commit", k) for k in range(n)]
        rng.shuffle(commits)
        shuffled += [("step", k, steps[k]) for k in range(n)] + commits
    for rule in (O.ModelAveraging(), O.EASGD()):
        a = simulate(rule, INIT, GRAD, ordered, mode="synchronous", num_samples=[8, 16, 24, 32][:n], local_lr=LR)
        b = simulate(rule, INIT, GRAD, shuffled, mode="synchronous", num_samples=[8, 16, 24, 32][:n], local_lr=LR)
        for x, y in zip(a.center, b.center, strict=True):
            np.testing.assert_array_equal(x, y)
