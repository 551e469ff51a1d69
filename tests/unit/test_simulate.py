"""The in-process simulator: events, blocking, SSP admission (optimizers.md §10.3), schedules."""

from __future__ import annotations

import numpy as np
import pytest

from elephant.errors import ConfigError, DataError
from elephant.optimizers import (
    ADAG,
    AEASGD,
    Commit,
    DistributedOptimizer,
    Downpour,
    DynSGD,
    ModelAveraging,
    ScheduleError,
    simulate,
    tree_map,
)
from elephant.optimizers.schedules import round_robin, timed
from elephant.optimizers.simulate import nesterov, quadratic, sgd

GRAD = quadratic(3.0)


def w(value=0.0):
    return [np.array(value)]


def run(opt, schedule, **kwargs):
    kwargs.setdefault("local_lr", 0.1)
    return simulate(opt, w(), GRAD, schedule, **kwargs)


# ------------------------------------------------------------------ the rule methods it calls
class Recorder(DistributedOptimizer):
    """Downpour that logs every rule call the way the runtime makes them."""

    name = "recorder"
    modes = ("asynchronous", "synchronous")

    def __init__(self, log, **kwargs):
        super().__init__(**kwargs)
        self.log = log

    def worker_init(self, center):
        self.log.append(("worker_init", float(center[0])))
        return 0

    def make_commit(self, state, weights, pulled, num_steps):
        self.log.append(("make_commit", state, num_steps))
        return tree_map(lambda a, b: a - b, weights, pulled), state + 1

    def on_reply(self, state, weights, reply):
        self.log.append(("on_reply", state, reply.clock))
        return reply.center, state

    def server_init(self, center, num_workers):
        self.log.append(("server_init", num_workers))
        return []

    def on_pull(self, state, center, clock, worker):
        self.log.append(("on_pull", worker, clock))
        return [*state, ("pull", worker)]

    def apply(self, state, center, clock, worker, commit):
        self.log.append(("apply", worker, clock, commit.base_clock, commit.num_steps, commit.num_samples))
        return tree_map(lambda c, d: c + d, center, commit.tensors), None, [*state, ("apply", worker)]

    def apply_round(self, state, center, clock, commits):
        self.log.append(("apply_round", clock, sorted(commits)))
        return center, {k: None for k in commits}, state


def test_asynchronous_events_call_the_runtime_rule_methods_in_order():
    log = []
    schedule = [("pull", 0), ("pull", 1), ("step", 0, 2), ("commit", 0), ("step", 1), ("commit", 1), ("commit", 0)]
    trace = simulate(Recorder(log), w(), GRAD, schedule, num_samples=[4, 8])
    assert log == [
        ("server_init", 2),
        ("on_pull", 0, 0), ("worker_init", 0.0),
        ("on_pull", 1, 0), ("worker_init", 0.0),
        ("make_commit", 0, 2), ("apply", 0, 0, 0, 2, 8), ("on_reply", 1, 1),
        ("make_commit", 0, 1), ("apply", 1, 1, 0, 1, 8), ("on_reply", 1, 2),
        ("make_commit", 1, 0), ("apply", 0, 2, 1, 0, 0), ("on_reply", 2, 3),
    ]
    assert trace.server_state == [("pull", 0), ("pull", 1), ("apply", 0), ("apply", 1), ("apply", 0)]
    assert trace.staleness == [0, 1, 1] and trace.clocks == [1, 2, 3] and trace.clock == 3
    assert trace.workers[0].commits == 2 and trace.workers[0].state == 2 and trace.workers[0].base_clock == 3


def test_synchronous_commits_wait_for_every_active_worker():
    log = []
    schedule = [("pull", 0), ("pull", 1), ("step", 1), ("commit", 1), ("step", 0), ("commit", 0), ("finish", 1), ("step", 0), ("commit", 0)]
    trace = simulate(Recorder(log), w(), GRAD, schedule, mode="synchronous")
    assert [e for e in log if e[0] == "apply_round"] == [("apply_round", 0, [0, 1]), ("apply_round", 1, [0])]
    assert [(a.worker, a.clock) for a in trace.applied] == [(0, 0), (1, 0), (0, 1)]
    assert trace.clocks == [1, 2]


def test_hogwild_is_played_as_asynchronous():
    schedule = round_robin(3, 2, 4)
    a = run(Downpour(window=2), schedule, mode="asynchronous")
    b = run(Downpour(window=2), schedule, mode="hogwild")
    assert [c[0] for c in a.centers] == [c[0] for c in b.centers]


def test_num_workers_is_inferred_from_the_schedule_and_passed_to_server_init():
    trace = run(AEASGD(), [("pull", 2), ("step", 2), ("commit", 2)])
    assert trace.server_state == pytest.approx(0.3)  # alpha = 0.9 / 3
    assert run(AEASGD(), [("pull", 0)], num_workers=9).server_state == pytest.approx(0.1)


def test_simulation_is_deterministic_and_leaves_init_alone():
    init = [np.array([1.0, 2.0], np.float32)]
    schedule = timed([1.0, 1.3, 2.2], window=3, num_steps=10)
    first = simulate(DynSGD(window=3), init, quadratic(0.0), schedule)
    second = simulate(DynSGD(window=3), init, quadratic(0.0), schedule)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(first.centers, second.centers, strict=True))
    assert init[0].tolist() == [1.0, 2.0]


def test_local_steps_sgd_and_nesterov_slots():
    assert float(run(Downpour(), [("pull", 0), ("step", 0, 2)], local_step=sgd(0.5)).workers[0].weights[0]) == 2.25
    worker = run(AEASGD(alpha=0.0), [("pull", 0), ("step", 0, 3), ("commit", 0), ("pull", 0), ("step", 0)], local_step=nesterov(0.1, 0.9)).workers[0]
    assert worker.slots is not None and float(worker.slots[0]) != 0.0  # the local optimizer survives pulls


# ------------------------------------------------------------------ SSP (§10.3)
TWO_AHEAD = [("pull", 0), ("pull", 1), ("step", 0), ("commit", 0), ("step", 0), ("commit", 0)]  # clocks (2, 0)


def test_t10_1_admission_table():
    opt = DynSGD(window=1, staleness_bound=1)
    with pytest.raises(
        ScheduleError,
        match=r"event 6 \('step', 0\) is blocked: SSP: worker 0 has made 2 commits, 2 more than the slowest active worker, above staleness_bound=1",
    ):
        run(opt, TWO_AHEAD + [("step", 0)])
    with pytest.raises(ScheduleError, match=r"event 6 \('pull', 0\) is blocked: SSP"):
        run(opt, TWO_AHEAD + [("pull", 0)])
    admitted = run(opt, TWO_AHEAD + [("step", 1), ("commit", 1), ("step", 0), ("commit", 0)])  # (2, 1): admitted
    assert [a.worker for a in admitted.applied] == [0, 0, 1, 0] and admitted.blocked == []


def test_a_held_back_reply_carries_the_center_of_when_the_worker_resumes():
    schedule = TWO_AHEAD + [("step", 1), ("commit", 1), ("step", 0), ("commit", 0)]
    trace = run(ADAG(window=1, gamma=1e-2, staleness_bound=1), schedule)
    # worker 0's second reply waited for worker 1's commit (clock 3), so its third window is fresh
    assert [(a.worker, a.base_clock, a.staleness) for a in trace.applied] == [(0, 0, 0), (0, 1, 0), (1, 0, 2), (0, 3, 0)]
    held = run(ADAG(window=1, gamma=1e-2, staleness_bound=1), TWO_AHEAD + [("step", 1), ("commit", 1)])
    assert held.workers[0].held_reply is not None and held.workers[0].base_clock == 1
    np.testing.assert_array_equal(held.server_state[0][0], held.centers[1][0])  # the server saw no pull yet


def test_t10_1_a_blocked_worker_waits_with_defer():
    opt = DynSGD(window=1, staleness_bound=1)
    trace = run(opt, TWO_AHEAD + [("step", 0), ("commit", 0), ("step", 1), ("commit", 1)], on_blocked="defer")
    assert [a.worker for a in trace.applied] == [0, 0, 1, 0]
    assert [(b.index, b.event) for b in trace.blocked] == [(6, ("step", 0))]
    assert "above staleness_bound=1" in trace.blocked[0].reason


def test_t10_1_bound_zero_is_lock_step():
    schedule = [("pull", 0), ("pull", 1)] + [("step", 0), ("commit", 0)] * 3 + [("step", 1), ("commit", 1)] * 3
    trace = run(DynSGD(window=1, staleness_bound=0), schedule, on_blocked="defer")
    assert [a.worker for a in trace.applied] == [0, 1, 0, 1, 0, 1]


def test_t10_2_finished_workers_leave_the_minimum():
    schedule = [("pull", 0), ("pull", 1), ("step", 1), ("commit", 1), ("finish", 1)] + [("step", 0), ("commit", 0)] * 4
    trace = run(DynSGD(window=1, staleness_bound=1), schedule)
    assert trace.workers[0].commits == 4 and trace.blocked == []
    with pytest.raises(ScheduleError, match="SSP: worker 0 has made 3 commits, 2 more"):
        run(DynSGD(window=1, staleness_bound=1), [s for s in schedule if s != ("finish", 1)])


def test_t10_3_an_unreachable_bound_reproduces_the_asynchronous_trace():
    schedule = timed([1.0, 1.5, 4.0], window=2, num_steps=12)
    free = run(DynSGD(window=2), schedule)
    bounded = run(DynSGD(window=2, staleness_bound=10**9), schedule)
    assert [c[0] for c in bounded.centers] == [c[0] for c in free.centers]
    tight = run(DynSGD(window=2, staleness_bound=0), schedule, on_blocked="defer")
    assert tight.blocked and [c[0] for c in tight.centers] != [c[0] for c in free.centers]


def test_synchronous_timed_schedule_with_defer():
    schedule = timed([1.0, 2.5], window=2, num_steps=[6, 5])
    trace = simulate(ModelAveraging(window=2), w(), [quadratic(1.0), quadratic(3.0)], schedule, local_lr=0.1, on_blocked="defer")
    # the fast worker waits at each barrier; the slow one's last window is a flushed single step
    assert [(a.worker, a.num_steps, a.clock) for a in trace.applied] == [(0, 2, 0), (1, 2, 0), (0, 2, 1), (1, 2, 1), (0, 2, 2), (1, 1, 2)]
    assert trace.clocks == [1, 2, 3]
    assert [(b.index, b.event) for b in trace.blocked] == [(6, ("step", 0)), (9, ("step", 0)), (14, ("finish", 0))]
    assert trace.blocked[0].reason.startswith("worker 0 committed and waits for round 1")


# ------------------------------------------------------------------ schedule errors
@pytest.mark.parametrize(
    "event, message",
    [
        ("pull", r"event 0 'pull': expected a tuple such as \('step', 0\)"),
        (("jump", 0), r"event 0 \('jump', 0\): unknown kind 'jump'; expected one of \('pull', 'step', 'commit', 'finish'\)"),
        (("pull",), r"event 0 \('pull',\): expected \('pull', worker\)"),
        (("pull", 0, 1), r"expected \('pull', worker\)$"),
        (("step", 0, 1, 1), r"expected \('step', worker\) or \('step', worker, count\)"),
        (("pull", 2), r"worker must be an int in \[0, 2\); received 2"),
        (("pull", "0"), r"worker must be an int in \[0, 2\); received '0'"),
        (("step", 0, 0), r"step count must be a positive int; received 0"),
    ],
)
def test_malformed_events(event, message):
    with pytest.raises(ScheduleError, match=message):
        simulate(Downpour(), w(), [GRAD, GRAD], [event])


@pytest.mark.parametrize("kind", ["step", "commit", "finish"])
def test_events_before_the_first_pull(kind):
    with pytest.raises(ScheduleError, match=rf"event 0 \('{kind}', 0\): worker 0 has not pulled yet; it must pull first"):
        run(Downpour(), [(kind, 0)])


def test_events_after_finish():
    with pytest.raises(ScheduleError, match=r"event 2 \('step', 0\): worker 0 has finished; it must pull first"):
        run(Downpour(), [("pull", 0), ("finish", 0), ("step", 0)])
    assert run(Downpour(), [("pull", 0), ("finish", 0), ("pull", 0), ("step", 0), ("commit", 0)]).clock == 1


def test_finish_with_uncommitted_steps():
    with pytest.raises(ScheduleError, match=r"event 2 \('finish', 0\): worker 0 has 1 uncommitted steps; add \('commit', 0\) first"):
        run(Downpour(), [("pull", 0), ("step", 0), ("finish", 0)])


def test_synchronous_barrier_blocks_a_committed_worker():
    schedule = [("pull", 0), ("pull", 1), ("step", 0), ("commit", 0), ("step", 0)]
    with pytest.raises(ScheduleError, match=r"event 4 \('step', 0\) is blocked: worker 0 committed and waits for round 1 \(workers \[1\] have not committed\)"):
        run(ModelAveraging(), schedule)


def test_schedule_ending_inside_a_round():
    with pytest.raises(ScheduleError, match=r"ended inside synchronous round 1: workers \[0\] committed, workers \[1\] neither"):
        run(ModelAveraging(), [("pull", 0), ("pull", 1), ("step", 0), ("commit", 0)])


def test_schedule_ending_with_blocked_workers():
    schedule = [("pull", 0), ("pull", 1), ("step", 0), ("commit", 0), ("step", 0)]
    with pytest.raises(ScheduleError, match=r"ended with blocked workers \[0\]: event 4 \('step', 0\): worker 0 committed"):
        run(ModelAveraging(), schedule, on_blocked="defer")


# ------------------------------------------------------------------ argument errors
class Widening(Downpour):
    name = "widening"

    def make_commit(self, state, weights, pulled, num_steps):
        return [(a - b).astype(np.float64) for a, b in zip(weights, pulled, strict=True)], state


def test_a_rule_that_changes_a_dtype_is_caught():
    with pytest.raises(DataError, match=r"commit of worker 0\[0\]: expected dtype float32, received float64"):
        simulate(Widening(), [np.zeros(2, np.float32)], GRAD, [("pull", 0), ("step", 0), ("commit", 0)])


def test_a_local_step_that_changes_the_structure_is_caught():
    def bad_step(weights, grad_fn, slots):
        return weights + weights, slots

    with pytest.raises(DataError, match="weights of worker 0 after a local step: expected 1 arrays, received 2"):
        run(Downpour(), [("pull", 0), ("step", 0)], local_step=bad_step)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"optimizer": "downpour"}, r"`optimizer` must be a DistributedOptimizer instance; received optimizer='downpour'"),
        ({"mode": "async"}, r"`mode` must be one of \('asynchronous', 'hogwild'\) for Downpour; received mode='async'"),
        ({"on_blocked": "wait"}, r"`on_blocked` must be 'raise' or 'defer'; received on_blocked='wait'"),
        ({"init": np.zeros(2)}, r"`init` must be a non-empty list of arrays; received init=array"),
        ({"init": []}, r"`init` must be a non-empty list of arrays; received init=\[\]"),
        ({"grad_fns": [GRAD, GRAD], "num_workers": 3}, r"`num_workers`=3 but 2 grad_fns were given"),
        ({"num_workers": 0}, r"`num_workers` must be a positive int; received num_workers=0"),
        ({"num_samples": [1, 2]}, r"`num_samples` must be an int >= 0 or one per worker \(1\); received num_samples=\[1, 2\]"),
        ({"num_samples": -1}, r"`num_samples` must be an int >= 0 or one per worker \(1\); received num_samples=-1"),
        ({"local_lr": -0.1}, r"`learning_rate` must be a real number in \[0, inf\); received learning_rate=-0.1"),
    ],
)
def test_argument_errors(kwargs, message):
    args = {"optimizer": Downpour(), "init": w(), "grad_fns": GRAD, "schedule": [("pull", 0)], **kwargs}
    with pytest.raises(ConfigError, match=message):
        simulate(args.pop("optimizer"), args.pop("init"), args.pop("grad_fns"), args.pop("schedule"), **args)


def test_nesterov_form_is_validated():
    with pytest.raises(ConfigError, match=r"`form` must be 'keras' or 'paper'; received form='torch'"):
        nesterov(0.1, 0.9, form="torch")


# ------------------------------------------------------------------ schedule builders
def test_round_robin():
    assert round_robin(2, 3, 2) == [
        ("pull", 0), ("pull", 1),
        ("step", 0, 3), ("commit", 0), ("step", 1, 3), ("commit", 1),
        ("step", 0, 3), ("commit", 0), ("step", 1, 3), ("commit", 1),
        ("finish", 0), ("finish", 1),
    ]
    with pytest.raises(ConfigError, match=r"`window` must be a positive int; received window=0"):
        round_robin(2, 0, 1)


def test_timed_orders_events_by_time_and_flushes_partial_windows():
    events = timed([1.0, 2.0], window=2, num_steps=3)
    assert events == [
        ("pull", 0), ("pull", 1),
        ("step", 0), ("step", 0), ("commit", 0), ("step", 1),  # t = 1, 2, 2
        ("step", 0), ("commit", 0), ("finish", 0),  # t = 3
        ("step", 1), ("commit", 1),  # t = 4
        ("step", 1), ("commit", 1), ("finish", 1),  # t = 6
    ]


def test_timed_commits_in_the_warmup_windows_through_its_steps_then_counts_on_in_windows():
    events = timed([1.0, 1.0], window=5, num_steps=[14, 3], warmup=(2, 5))
    at = {k: [events[:i].count(("step", k)) for i, e in enumerate(events) if e == ("commit", k)] for k in (0, 1)}
    # steps 2 and 4 in the warm-up; step 5 starts a window that step 9 fills at 5 steps; 14 is the last
    assert at == {0: [2, 4, 9, 14], 1: [2, 3]}
    assert timed([1.0], 5, 14, warmup=(5, 5)) == timed([1.0], 5, 14)


@pytest.mark.parametrize(
    "args, message",
    [
        (([0.0], 2, 3), r"`step_times\[0\]` must be a real number in \(0, inf\); received step_times\[0\]=0.0"),
        (([1.0, 1.0], 2, [3]), r"`num_steps` must be an int or one per worker \(2\); received num_steps=\[3\]"),
        (([1.0], 2, [0]), r"`num_steps\[0\]` must be a positive int; received num_steps\[0\]=0"),
        (([1.0], 2, 3, (0, 5)), r"`warmup\[0\]` must be a positive int; received warmup\[0\]=0"),
        (([1.0], 2, 3, (2, 1.5)), r"`warmup\[1\]` must be a positive int; received warmup\[1\]=1.5"),
        (([1.0], 2, 3, 4), r"`warmup` must be a \(window, steps\) pair of positive ints; received warmup=4"),
    ],
)
def test_timed_is_validated(args, message):
    with pytest.raises(ConfigError, match=message):
        timed(*args)


def test_docstring_example_dynsgd_tames_sixteen_uneven_workers():
    schedule = timed([1 + k / 4 for k in range(16)], window=5, num_steps=40)
    dyn = simulate(DynSGD(window=5), [np.zeros(2)], quadratic(3.0), schedule, num_workers=16, local_lr=0.05)
    down = simulate(Downpour(window=5), [np.zeros(2)], quadratic(3.0), schedule, num_workers=16, local_lr=0.05)
    np.testing.assert_allclose(dyn.center[0], 3.0, atol=0.05)
    assert abs(float(down.center[0][0]) - 3.0) > 1.0  # plain DOWNPOUR does not survive the same delays
    assert max(dyn.staleness) >= 16 and len(dyn.centers) == 16 * 8


def test_commit_payload_reaches_the_rule_unchanged():
    seen = []

    class Spy(Downpour):
        name = "spy"

        def apply(self, state, center, clock, worker, commit):
            seen.append(commit)
            return super().apply(state, center, clock, worker, commit)

    run(Spy(), [("pull", 0), ("step", 0, 2), ("commit", 0)], num_samples=32)
    assert isinstance(seen[0], Commit) and (seen[0].num_steps, seen[0].num_samples, seen[0].base_clock) == (2, 64, 0)
    assert float(seen[0].tensors[0]) == pytest.approx(3 * (1 - 0.9**2))
