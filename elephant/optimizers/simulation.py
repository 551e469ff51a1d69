"""The simulator's state: the parts of the runtime that :func:`~elephant.optimizers.simulate` plays.

:class:`Simulation` holds the center, the clock, the server rule's state and one
:class:`~elephant.optimizers.trace.WorkerView` per worker, and runs one parsed event
of a schedule at a time: SSP admission and the synchronous barrier as the parameter
server keeps them, the workers' pulls, local steps, commits and finishes, and the
server's side (an asynchronous apply, a round's close, the replies). The schedule's
checks and the loop that defers blocked events are in :mod:`~elephant.optimizers.simulate`.
"""

from __future__ import annotations

import numpy as np

from elephant import weights as W
from elephant.errors import ScheduleError
from elephant.optimizers.codecs import encode_change
from elephant.optimizers.compress import check_reply_mode
from elephant.optimizers.helpers import Weights, tree_map
from elephant.optimizers.trace import Applied, WorkerView
from elephant.protocol import Commit, Reply, merge_reply, round_complete, ssp_admitted

__all__ = ["Simulation"]


class Simulation:
    """One simulated fit: the center, the clock, the server rule's state and the workers, event by event.

    Built by :func:`~elephant.optimizers.simulate` from its checked arguments; :meth:`blocked`
    says why an event must wait and :meth:`run` plays one that may go.
    """

    def __init__(self, optimizer, init, grad_fns, num_workers, mode, local_step, samples, overlap=False,
                 keep_centers=None):
        self.opt = optimizer
        self.keep_centers = keep_centers
        self.overlap = overlap
        self.template = init
        self.commit_template = optimizer.commit_template(init)
        self.grad_fns = grad_fns
        self.mode = mode
        self.local_step = local_step
        self.samples = samples
        self.center = tree_map(np.copy, init)
        check_reply_mode(optimizer, mode)
        #: With compressed replies: the workers' view of the center, as the parameter server keeps it.
        self.view = None if optimizer.reply_codec is None else tree_map(np.copy, init)
        self.clock = 0
        self.server_state = optimizer.server_init(tree_map(np.copy, init), num_workers)
        self.workers = {k: WorkerView() for k in range(num_workers)}
        self.round: dict[int, Commit] = {}
        self.round_sent: dict[int, Weights] = {}  # overlapped rounds: each worker's weights at its commit
        self.centers: list[Weights] = []
        self.clocks: list[int] = []
        self.applied: list[Applied] = []

    # -- admission ------------------------------------------------------
    def blocked(self, kind: str, k: int) -> str | None:
        w = self.workers[k]
        if self.mode == "synchronous":
            if k in self.round and not (self.overlap and kind == "step"):  # overlapped: it trains on meanwhile
                waiting = sorted(j for j, v in self.workers.items() if v.active and j not in self.round)
                return f"worker {k} committed and waits for round {self.clock + 1} (workers {waiting} have not committed)"
            return None
        if kind == "pull" or w.held_reply is not None:
            return self._ssp_wait(k)
        return None

    def _ssp_wait(self, k: int) -> str | None:
        """Why worker ``k`` may not start a window now (None: admitted)."""
        bound = self.opt.staleness_bound
        if bound is None or self.mode == "synchronous":
            return None
        commits = [v.commits for v in self.workers.values()]  # workers are 0..K-1, in order
        absent = {j for j, v in self.workers.items() if not v.active and j != k}  # finished, or not pulled yet
        if not ssp_admitted(commits, absent, k, bound):
            mine, slowest = commits[k], min(c for j, c in enumerate(commits) if j not in absent)
            return (
                f"SSP: worker {k} has made {mine} commits, {mine - slowest} more than the slowest "
                f"active worker, above staleness_bound={bound}"
            )
        return None

    # -- events ----------------------------------------------------------
    def run(self, index: int, kind: str, k: int, count: int) -> None:
        w = self.workers[k]
        if kind != "pull" and not w.active:
            state = "finished" if w.weights is not None else "not pulled yet"
            raise ScheduleError(f"event {index} ({kind!r}, {k}): worker {k} has {state}; it must pull first")
        if w.held_reply is not None:  # admitted at last: the reply carries the center as it is now
            tensors, w.held_reply = w.held_reply[0], None
            self.server_state = self.opt.on_pull(self.server_state, tree_map(np.copy, self.center), self.clock, k)
            self._reply(k, tensors)
        if kind != "step" and w.inflight is not None:
            self._settle(w)
        getattr(self, "_" + kind)(index, k, w, count)

    def _served(self) -> Weights:
        """A copy of the center as the workers get it: with compressed replies, their view of it."""
        return tree_map(np.copy, self.center if self.view is None else self.view)

    def _pull(self, index, k, w, count):
        if self.view is not None and not any(v.active for v in self.workers.values()):
            self.view = tree_map(np.copy, self.center)  # an epoch's first pull: the store's view starts at the center
        self.server_state = self.opt.on_pull(self.server_state, tree_map(np.copy, self.center), self.clock, k)
        w.weights = self._served()
        w.pulled = self._served()
        w.base_clock = self.clock
        w.state = self.opt.worker_init(self._served())
        w.steps = w.samples = 0
        w.active = True

    def _step(self, index, k, w, count):
        for _ in range(count):
            weights, w.slots = self.local_step(w.weights, self.grad_fns[k], w.slots)
            W.check_same_structure(self.template, weights, f"weights of worker {k} after a local step")
            w.weights = weights
            w.steps += 1
            w.samples += self.samples[k]
            if w.inflight is not None:  # the reply arrives during the first local step after the send
                self._settle(w)

    def _settle(self, w):
        """Merge the reply of the commit in flight: the rule's answer for the sent weights plus the progress since."""
        reply, sent = w.inflight
        w.inflight = None
        w.weights, w.state = merge_reply(self.opt, w.state, reply, sent, w.weights)
        w.pulled, w.base_clock = reply.center, reply.clock

    def _commit(self, index, k, w, count):
        tensors, w.state = self.opt.make_commit(w.state, w.weights, w.pulled, w.steps)
        W.check_same_structure(self.commit_template, tensors, f"commit of worker {k}")
        commit = Commit(tensors=tensors, num_steps=w.steps, num_samples=w.samples, base_clock=w.base_clock)
        w.commits += 1
        if self.mode == "synchronous":
            self.round[k] = commit
            if self.overlap:  # the next window starts now; the round's reply is merged when it closes
                self.round_sent[k] = tree_map(np.copy, w.weights)
                w.steps = w.samples = 0
            self._maybe_close_round()
            return
        center, reply_tensors, self.server_state = self.opt.apply(self.server_state, self.center, self.clock, k, commit)
        self._record(center, {k: commit})
        if self.overlap:  # the worker trains on; the reply is merged after its next local step
            reply = Reply(clock=self.clock, center=tree_map(np.copy, self.center), tensors=reply_tensors)
            w.inflight = (reply, tree_map(np.copy, w.weights))
            w.steps = w.samples = 0
        elif self._ssp_wait(k) is None:
            self._reply(k, reply_tensors)
        else:  # like the parameter server, answer only once the next window is admitted
            w.held_reply = (reply_tensors,)

    def _finish(self, index, k, w, count):
        if w.steps:
            raise ScheduleError(
                f"event {index} ('finish', {k}): worker {k} has {w.steps} uncommitted steps; "
                f"add ('commit', {k}) first (the runtime flushes a partial window)"
            )
        w.active = False
        if self.mode == "synchronous":
            self._maybe_close_round()

    # -- server side -------------------------------------------------------
    def _maybe_close_round(self) -> None:
        absent = {k for k, v in self.workers.items() if not v.active}  # finished, or not pulled yet
        if not round_complete(set(self.round), absent, len(self.workers)):
            return
        commits, self.round = dict(sorted(self.round.items())), {}
        center, replies, self.server_state = self.opt.apply_round(self.server_state, self.center, self.clock, commits)
        unknown = set(replies) - set(commits)
        if unknown:
            raise ScheduleError(f"{type(self.opt).__name__}.apply_round replied to workers {sorted(unknown)} outside the round")
        self._record(center, commits)
        for k in commits:
            if self.overlap:  # merged after the worker's next local step, like an asynchronous reply
                reply = Reply(clock=self.clock, center=self._served(), tensors=replies.get(k))
                self.workers[k].inflight = (reply, self.round_sent.pop(k))
            else:
                self._reply(k, replies.get(k))

    def _record(self, center: Weights, commits: dict[int, Commit]) -> None:
        W.check_same_structure(self.template, center, f"center returned by {type(self.opt).__name__}")
        for k, c in commits.items():
            tau = self.clock - c.base_clock
            self.applied.append(Applied(k, self.clock, c.base_clock, tau, c.num_steps, c.num_samples))
        self.center = center
        if self.view is not None:  # one encoded change per round, as the parameter server sends it
            _, self.view = encode_change(self.opt.reply_codec, self.view, center)
        self.clock += 1
        kept = self.keep_centers is None or len(self.centers) in self.keep_centers
        self.centers.append(tree_map(np.copy, center) if kept else None)
        self.clocks.append(self.clock)

    def _reply(self, k: int, tensors: Weights | None) -> None:
        if tensors is not None:
            W.check_same_structure(self.template, tensors, f"reply tensors for worker {k}")
        w = self.workers[k]
        reply = Reply(clock=self.clock, center=self._served(), tensors=tensors)
        weights, w.state = self.opt.on_reply(w.state, w.weights, reply)
        W.check_same_structure(self.template, weights, f"weights of worker {k} after the reply")
        w.weights, w.pulled, w.base_clock = weights, reply.center, reply.clock
        w.steps = w.samples = 0
