"""How far one parameter-server process scales: CPU per commit, open-loop load, shaped links.

The server is elephant's real stack (Store + Flask app + PSServer, a bearer
token from ``secrets.token_urlsafe(32)`` and the body limit the fit sets, the
handler pool ``2K + 4`` of a classic fit) in a process of its own, started by
:func:`start_servers`, which returns the servers' URLs. With ``--shards S``
it is a sharded server as a classic fit starts it: the model is planned over
S shards (:func:`elephant.ps.shards.plan_shards`) and each shard is a Store
over its slice in a process of its own (:func:`elephant.ps.shard_process.start_shards`),
and every worker commits the whole model through a
:class:`~elephant.ps.shard_client.ShardedClient`, which splits it and sends
the S slices in parallel. The rule is the fit's default asynchronous one (DelayedNesterov;
``--rule`` picks another asynchronous rule). ``--codec int8`` (or ``bf16``) wraps it in
``Compressed``: every worker commits the delta as the codec encodes it (once, error
feedback from a zero residual), each server decodes it, and a sharded server's plan cuts
tensors at the codec's block ends, as a fit's does; the replies stay uncompressed.

Phase (a), CPU per commit: for commits of 32 KB, 256 KB, 1 MB, 4 MB, 17 MB and
40 MB, one client (this process's main thread) commits back to back to a
fresh server. Client CPU is ``time.thread_time()`` of that thread; server
CPU is the server process's ``utime + stime`` from ``/proc/<pid>/stat``
(clock ticks of 10 ms, over about 2 s of commits per size). The idle
server's rate (its serve loop's 20 ms poll), measured for 1 s before, is
recorded beside it, not subtracted: it is 0 or one tick. Reported: ms of
each per commit and commits/s at one client.

Phase (b), open-loop load: K logical workers (``--workers``, default 8, 32,
128, 512), one thread each, spread over ``--client-processes`` processes (4;
one process of 512 threads would be bound by its GIL, not the server). For
each K the server's capacity is first measured closed-loop in the same run
(``min(K, 32)`` workers committing back to back for a few seconds); then for
each offered load f (0.5, 0.7, 0.9, 1.1) the workers commit on a fixed
schedule of ``f * capacity`` commits/s in all: worker k sends at
``k/r + n*K/r`` (:func:`schedule`), so arrivals are evenly spaced and decided
in advance. A worker sleeps until its next send time (its compute phase),
sends, and when a reply comes late it sends the next commit at once:
latency is measured from the scheduled time, so a server's backlog shows.
Sends still pending ``grace`` seconds after the offered window are not sent
and count in the percentiles with their wait so far (a lower bound).
Reported: applied/offered commits, goodput in and out (the store's body-byte
counters over the window), p50/p99 latency, server CPU utilisation (cores,
``/proc``), client CPU of the busiest client process, errors (after the
client's retries, as a fit would see them).

Phase (c), shaped link (``--shaped 100mbit 1gbit``): the server runs in a
network namespace behind a veth pair with ``tc tbf`` at each rate in each
direction (:mod:`shaped_link`); (a)'s commits are timed and compared with
the ideal ``2 * P / rate`` (the commit in, the center back). Where the
namespace cannot be made the phase says why and is skipped.

Everything shares the machine: on a small host the client processes compete
with the server for the same cores, which the client CPU column shows.

Usage::

    python benchmarks/ps_scale.py                    # (a) and (b), full (about 7 minutes)
    python benchmarks/ps_scale.py --quick            # smoke run (about a minute)
    python benchmarks/ps_scale.py --phases c --shaped 100mbit 1gbit
    python benchmarks/ps_scale.py --workers 512 --bytes 1048576 --phases b

Results: ``benchmarks/results/ps_scale.json`` (environment, method, rows) and
``ps_scale.png`` (``ps_scale_quick.*`` for ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import queue
import resource
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from ps_roundtrip import environment as _roundtrip_environment  # noqa: E402
from ps_roundtrip import model  # noqa: E402
import shaped_link  # noqa: E402

RUN = "ps-scale"
SIZES = {"32KB": 32 << 10, "256KB": 256 << 10, "1MB": 1 << 20, "4MB": 4 << 20, "17MB": 17 << 20, "40MB": 40 << 20}
#: Commits timed per size in (a): about 2 s of one client each, so the server's 10 ms CPU ticks are ~1 %.
COMMITS = {"32KB": 1500, "256KB": 1000, "1MB": 500, "4MB": 150, "17MB": 40, "40MB": 16}
QUICK_SIZES = ("32KB", "256KB", "1MB")
WORKERS, QUICK_WORKERS = (8, 32, 128, 512), (8, 32)
LOADS = (0.5, 0.7, 0.9, 1.1)
CLOSED_LOOP_MAX = 32
TICK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------ pure decisions
def schedule(worker: int, num_workers: int, rate: float, duration: float) -> np.ndarray:
    """Send times (seconds from the start) of ``worker`` when ``num_workers`` offer ``rate`` commits/s in all.

    Each worker commits every ``num_workers / rate`` seconds, worker ``k``
    first at ``k / rate``: the union over the workers is one commit every
    ``1 / rate`` seconds, every time below ``duration``.
    """
    if not 0 <= worker < num_workers:
        raise ValueError(f"`worker` must be in [0, {num_workers}); received worker={worker!r}")
    if not (rate > 0 and duration > 0):
        raise ValueError(f"`rate` and `duration` must be > 0; received rate={rate!r}, duration={duration!r}")
    period, first = num_workers / rate, worker / rate
    count = max(0, math.ceil((duration - first) / period)) if first < duration else 0
    return first + period * np.arange(count)


def offered_rates(capacity: float, loads: Sequence[float]) -> list[float]:
    """Commits/s offered at each load, as a fraction of the measured ``capacity``."""
    if not capacity > 0:
        raise ValueError(f"`capacity` must be > 0 commits/s; received capacity={capacity!r}")
    return [capacity * f for f in loads]


def closed_loop_workers(num_workers: int, cap: int = CLOSED_LOOP_MAX) -> int:
    """Workers that commit back to back to measure capacity: all of them up to ``cap`` (32)."""
    return min(num_workers, cap)


def split_workers(num_workers: int, processes: int) -> list[list[int]]:
    """Worker ids per client process, dealt round-robin (so the first ``n`` workers span every process)."""
    processes = max(1, min(processes, num_workers))
    return [list(range(p, num_workers, processes)) for p in range(processes)]


def commits_for(seconds_each: float, budget: float, low: int = 3, high: int = 200) -> int:
    """Commits to time when each takes about ``seconds_each``: ``budget`` seconds' worth, within [low, high]."""
    return int(min(high, max(low, budget // max(seconds_each, 1e-9))))


@dataclass
class LoopResult:
    """What one worker's open loop saw: latencies of completed sends (from their scheduled times), and the rest."""

    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    messages: list[str] = field(default_factory=list)
    unsent_waits: list[float] = field(default_factory=list)

    def send(self, send: Callable[[], None], clock: Callable[[], float], since: float) -> None:
        """Send once; record the latency from ``since``, or count the error (never hidden)."""
        try:
            send()
        except Exception as exc:
            self.errors += 1
            if len(self.messages) < 3:
                self.messages.append(str(exc)[:300])
            return
        self.latencies.append(clock() - since)


def open_loop(times: Sequence[float], send: Callable[[], None], clock: Callable[[], float],
              sleep: Callable[[float], None], deadline: float) -> LoopResult:
    """Send at each scheduled time of ``times``; a send due while the previous one was in flight goes at once.

    Latency is ``clock() - scheduled`` when the send returns, never measured
    from when it actually went out. Sends not started by ``deadline`` are not
    sent; their waits so far (``deadline - scheduled``) are returned as lower
    bounds. ``clock`` is seconds since the schedule's start.
    """
    out = LoopResult()
    for i, due in enumerate(times):
        now = clock()
        if now >= deadline:
            out.unsent_waits = [deadline - t for t in times[i:]]
            break
        if due > now:
            sleep(due - now)
        out.send(send, clock, due)
    return out


def closed_loop(send: Callable[[], None], clock: Callable[[], float], sleep: Callable[[float], None],
                deadline: float) -> LoopResult:
    """From time 0, send back to back until ``deadline``; latency from each send's start."""
    out = LoopResult()
    if clock() < 0:
        sleep(-clock())
    while (start := clock()) < deadline:
        out.send(send, clock, start)
    return out


def percentiles(seconds: Sequence[float]) -> dict[str, float | None]:
    """p50 and p99 in ms (None when empty)."""
    if not len(seconds):
        return {"p50_ms": None, "p99_ms": None}
    ms = np.asarray(seconds) * 1e3
    return {"p50_ms": round(float(np.percentile(ms, 50)), 3), "p99_ms": round(float(np.percentile(ms, 99)), 3)}


# ------------------------------------------------------------------ servers
def _cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


@dataclass
class ServerGroup:
    """Parameter-server processes started by :func:`start_servers`; :meth:`stop` ends them.

    ``processes`` are ``--serve`` subprocesses (one server), or the
    :class:`~elephant.ps.shard_process.ShardProcess` handles of a sharded one,
    whose plan (as data) the clients split their commits by.
    """

    processes: list[Any]
    urls: list[str]
    token: str
    plan: dict | None = None

    def cpu_seconds(self) -> float:
        return sum(_cpu_seconds(getattr(p, "process", p).pid) for p in self.processes)

    def metrics(self) -> dict[str, float]:
        """The stores' counters summed over the shards (``commits_applied`` averaged: every commit visits each)."""
        from elephant.ps import PSClient

        total: dict[str, float] = {"commits_applied": 0, "bytes_in": 0, "bytes_out": 0}
        for url in self.urls:
            with PSClient(url, self.token) as client:
                found = client.metrics()
            for key in total:
                total[key] += found[key]
        total["commits_applied"] /= len(self.urls)
        return total

    def stop(self) -> None:
        if self.plan is not None:
            for shard in self.processes:
                shard.stop()
            return
        for process in self.processes:
            if process.poll() is None:
                process.stdin.close()  # the server stops when its stdin ends
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            process.stdout.close()


def start_servers(nbytes: int, num_workers: int, rule: str | dict, shards: int = 1, *, host: str = "127.0.0.1",
                  link: shaped_link.ShapedLink | None = None) -> ServerGroup:
    """Start ``shards`` server processes, each holding ``nbytes / shards`` of the model, ready when this returns.

    Each is this script run with ``--serve``: it reads its settings from
    stdin, starts a Store (``rule``, asynchronous, ``num_workers``
    partitions), the app and a PSServer on ``host`` port 0 (which waits for
    its own ``/health``), prints its URL, and stops when stdin closes. With
    ``link`` the processes run inside its namespace.

    With ``shards > 1`` (and no ``link``) the server is sharded as a fit
    shards it: the plan of :func:`~elephant.ps.shards.plan_shards` over the
    model, and one :func:`~elephant.ps.shard_process.start_shards` process
    per shard, each a Store over its slice.
    """
    token = secrets.token_urlsafe(32)
    if shards > 1:
        if link is not None:
            raise ValueError(f"a shaped link serves one server process; received shards={shards}")
        return _start_shards(nbytes, num_workers, rule, shards, host, token)
    processes: list[subprocess.Popen] = []
    group = ServerGroup(processes, [], token)
    try:
        for _ in range(shards):
            argv = [sys.executable, str(Path(__file__).resolve()), "--serve"]
            process = subprocess.Popen(link.command(argv) if link else argv, stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True)
            processes.append(process)
            settings = {"nbytes": nbytes // shards, "num_workers": num_workers, "rule": rule, "host": host,
                        "token": token}
            process.stdin.write(json.dumps(settings) + "\n")
            process.stdin.flush()
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"parameter-server process {process.pid} exited with {process.wait()} before "
                                   "reporting its URL (its stderr is above)")
            group.urls.append(json.loads(line)["url"])
    except BaseException:
        group.stop()
        raise
    return group


def _start_shards(nbytes: int, num_workers: int, rule: str | dict, shards: int, host: str, token: str) -> ServerGroup:
    from elephant.optimizers import get
    from elephant.ps.app import max_body_bytes
    from elephant.ps.shard_process import start_shards
    from elephant.ps.shards import plan_shards

    center = model(nbytes)
    plan = plan_shards(center, shards, codec=getattr(get(rule), "codec", None))
    specs = [dict(center=part, optimizer=get(rule), mode="asynchronous", num_workers=num_workers, run=RUN,
                  round_timeout=600.0, state=None, clock=0, token=token, host=host, ports=[0], ports_from="port 0",
                  max_body_bytes=max_body_bytes(part), threads=2 * num_workers + 4) for part in plan.split(center)]
    processes = start_shards(specs)
    return ServerGroup(processes, [p.url for p in processes], token, plan.as_data())


def _serve() -> None:
    """The ``--serve`` entry: one server process (see :func:`start_servers`)."""
    from elephant.optimizers import get
    from elephant.ps import PSServer, Store, create_app
    from elephant.ps.app import max_body_bytes

    settings = json.loads(sys.stdin.readline())
    num_workers = settings["num_workers"]
    store = Store(model(settings["nbytes"]), get(settings["rule"]), "asynchronous", num_workers, RUN)
    app = create_app(store, settings["token"], max_body_bytes=max_body_bytes(store.template))
    with PSServer(app, host=settings["host"], threads=2 * num_workers + 4) as server:
        print(json.dumps({"url": server.url}), flush=True)
        sys.stdin.read()  # until the parent closes it


# ------------------------------------------------------------------ clients
class Worker:
    """One logical worker: a keep-alive client (a ShardedClient over the shards of a sharded server), its steps.

    ``plan``: the shard plan (as data) of a sharded server, None for one server.
    """

    def __init__(self, urls: Sequence[str], token: str, partition: int, delta: list[np.ndarray],
                 plan: dict | None = None):
        from elephant.ps.shard_client import connect_shards

        self.partition = partition
        self.client = connect_shards(urls, token, plan)
        self.delta = delta  # the commit's tensors, shared by the workers of a process (read only)
        self.base = self.client.pull(partition).clock  # connects, as a task's first pull
        self.epoch = self.step = 0

    def commit(self) -> None:
        from elephant.optimizers import Commit
        from elephant.ps import CommitKey

        key = CommitKey(RUN, self.epoch, self.partition, self.step)
        self.step += 1
        self.base = self.client.commit(key, 1, Commit(self.delta, 1, 1, self.base)).clock

    def close(self) -> None:
        self.client.close()


def delta_for(nbytes: int) -> list[np.ndarray]:
    """A commit's tensors (small, finite), ``nbytes`` in all, shaped as the server's model."""
    return [t * 1e-6 for t in model(nbytes)]


def payload_for(nbytes: int, rule) -> list[np.ndarray]:
    """What a worker commits under ``rule``: :func:`delta_for`, encoded where the rule is ``Compressed``."""
    from elephant.optimizers import get
    from elephant.optimizers.codecs import encode_with_feedback, zero_residual

    delta = delta_for(nbytes)
    codec = getattr(get(rule), "codec", None)
    return delta if codec is None else encode_with_feedback(codec, delta, zero_residual(delta))[0]


def rule_spec(rule: str, codec: str) -> str | dict:
    """The server's rule: ``rule`` by name, wrapped in ``Compressed`` with ``codec`` unless it is "none"."""
    return rule if codec == "none" else {"name": "compressed", "config": {"inner": rule, "codec": codec}}


def _run_worker(worker: Worker, plan: dict, start_at: float) -> LoopResult:
    def clock() -> float:
        return time.monotonic() - start_at

    worker.epoch, worker.step = plan["epoch"], 0
    if plan["kind"] == "closed":
        if worker.partition >= plan["closed_workers"]:
            return LoopResult()
        return closed_loop(worker.commit, clock, time.sleep, plan["duration"])
    times = schedule(worker.partition, plan["num_workers"], plan["rate"], plan["duration"])
    return open_loop(times, worker.commit, clock, time.sleep, plan["duration"] + plan["grace"])


def _client_process(urls, token, nbytes, partitions, commands, results, plan=None, rule="delayednesterov") -> None:
    """A client process: its workers connect once, then run each plan from ``commands`` in threads."""
    delta = payload_for(nbytes, rule)
    workers = [Worker(urls, token, p, delta, plan) for p in partitions]
    results.put({"ready": len(workers)})
    while (plan := commands.get()) is not None:
        outcomes: list[LoopResult] = [LoopResult()] * len(workers)

        def run(i: int) -> None:
            outcomes[i] = _run_worker(workers[i], plan, plan["start_at"])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(workers))]
        usage = resource.getrusage(resource.RUSAGE_SELF)
        while time.monotonic() < plan["start_at"] - 0.05:
            time.sleep(0.01)
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        end = time.monotonic()
        after = resource.getrusage(resource.RUSAGE_SELF)
        results.put({
            "latencies": [x for o in outcomes for x in o.latencies],
            "unsent_waits": [x for o in outcomes for x in o.unsent_waits],
            "errors": sum(o.errors for o in outcomes),
            "messages": [m for o in outcomes for m in o.messages][:3],
            "cpu_s": after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime,
            "end": end,
        })
    for worker in workers:
        worker.close()


class ClientPool:
    """``num_workers`` workers in ``processes`` spawned processes, kept (and connected) across plans."""

    def __init__(self, servers: ServerGroup, nbytes: int, num_workers: int, processes: int,
                 rule="delayednesterov"):
        ctx = mp.get_context("spawn")
        self.num_workers = num_workers
        self._results = ctx.Queue()
        self._commands = []
        self._processes = []
        for partitions in split_workers(num_workers, processes):
            commands = ctx.Queue()
            process = ctx.Process(target=_client_process,
                                  args=(servers.urls, servers.token, nbytes, partitions, commands, self._results,
                                        servers.plan, rule))
            process.start()
            self._commands.append(commands)
            self._processes.append(process)
        for _ in self._processes:
            self._get(600)

    def _get(self, timeout: float) -> dict:
        """The next result of a client process; raises at once if one of them died."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return self._results.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in self._processes if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"client process {dead[0].pid} exited with {dead[0].exitcode}") from None
        raise TimeoutError(f"no result from the client processes in {timeout:g} s")

    @property
    def processes(self) -> int:
        return len(self._processes)

    def run(self, plan: dict, servers: ServerGroup) -> tuple[list[dict], dict]:
        """Run ``plan`` in every process; ``(per-process results, window)``: seconds, server CPU and counters."""
        counts = servers.metrics()  # while the clients are idle: a request under load would be served late
        start_at = time.monotonic() + 0.5 + self.num_workers / 1000
        for commands in self._commands:
            commands.put({**plan, "start_at": start_at})
        time.sleep(max(0.0, start_at - time.monotonic()))
        cpu = servers.cpu_seconds()
        found = [self._get(plan["duration"] + plan.get("grace", 0) + 600) for _ in self._processes]
        seconds = max(r["end"] for r in found) - start_at
        window = {"seconds": seconds, "server_cpu_s": servers.cpu_seconds() - cpu}
        after = servers.metrics()
        window.update({k: after[k] - counts[k] for k in counts})
        return found, window

    def close(self) -> None:
        for commands in self._commands:
            commands.put(None)
        for process in self._processes:
            process.join(timeout=60)


# ------------------------------------------------------------------- phases
def cpu_per_commit(label: str, nbytes: int, commits: int, rule: str | dict, shards: int = 1,
                   link: shaped_link.ShapedLink | None = None, store_workers: int = 8, warmup: int = 3) -> dict:
    """Phase (a) for one size: back-to-back commits from this thread; CPU of client and server per commit.

    The store is made for ``store_workers`` partitions (8), as a fit's would
    be, so a rule with a per-round step (DelayedNesterov's momentum every K
    commits) runs it as often as in a fit of that size; partition 0 commits.
    """
    host = link.server_address if link else "127.0.0.1"
    servers = start_servers(nbytes, store_workers, rule, shards, host=host, link=link)
    try:
        worker = Worker(servers.urls, servers.token, 0, payload_for(nbytes, rule), servers.plan)
        idle0, t_idle = servers.cpu_seconds(), time.perf_counter()
        time.sleep(1.0)
        idle_rate = (servers.cpu_seconds() - idle0) / (time.perf_counter() - t_idle)  # reported, not subtracted
        for _ in range(warmup):
            worker.commit()
        seconds: list[float] = []
        server0, client0, wall0 = servers.cpu_seconds(), time.thread_time(), time.perf_counter()
        for _ in range(commits):
            t0 = time.perf_counter()
            worker.commit()
            seconds.append(time.perf_counter() - t0)
        wall = time.perf_counter() - wall0
        client_cpu, server_cpu = time.thread_time() - client0, servers.cpu_seconds() - server0
        worker.close()
    finally:
        servers.stop()
    return {
        "phase": "a" if link is None else "c", "size": label, "bytes": nbytes, "commits": commits,
        "server_ms_per_commit": round(1e3 * server_cpu / commits, 3),
        "client_ms_per_commit": round(1e3 * client_cpu / commits, 3),
        "server_idle_cores": round(idle_rate, 4),
        "commits_per_s": round(commits / wall, 1),
        "commit_ms": percentiles(seconds) | {"median_ms": round(1e3 * float(np.median(seconds)), 3)},
    }


def load_rows(num_workers: int, nbytes: int, rule: str | dict, loads: Sequence[float], capacity_s: float,
              duration: float, client_processes: int, shards: int = 1) -> list[dict]:
    """Phase (b) for one K: capacity closed-loop, then each offered load open-loop, on one server."""
    servers = start_servers(nbytes, num_workers, rule, shards)
    rows = []
    try:
        pool = ClientPool(servers, nbytes, num_workers, client_processes, rule)
        try:
            base = {"workers": num_workers, "bytes": nbytes, "client_processes": pool.processes, "shards": shards}
            closed = closed_loop_workers(num_workers)
            found, window = pool.run({"kind": "closed", "epoch": 0, "duration": capacity_s,
                                      "closed_workers": closed}, servers)
            done = sum(len(r["latencies"]) for r in found)
            capacity = done / window["seconds"]
            rows.append(_row("capacity", base, found, window, offered=None, load=None) | {
                "closed_loop_workers": closed, "capacity_commits_per_s": round(capacity, 1)})
            grace = max(1.0, 0.25 * duration)
            for epoch, (load, rate) in enumerate(zip(loads, offered_rates(capacity, loads)), start=1):
                plan = {"kind": "open", "epoch": epoch, "duration": duration, "grace": grace, "rate": rate,
                        "num_workers": num_workers}
                offered = sum(len(schedule(w, num_workers, rate, duration)) for w in range(num_workers))
                found, window = pool.run(plan, servers)
                rows.append(_row("b", base, found, window, offered=offered, load=load) | {
                    "offered_commits_per_s": round(rate, 1), "capacity_commits_per_s": round(capacity, 1),
                    "offered_s": duration, "grace_s": grace})
        finally:
            pool.close()
    finally:
        servers.stop()
    return rows


def _row(phase: str, base: dict, found: list[dict], window: dict, offered: int | None, load: float | None) -> dict:
    latencies = [x for r in found for x in r["latencies"]]
    unsent = [x for r in found for x in r["unsent_waits"]]
    seconds = window["seconds"]
    return base | {
        "phase": phase, "load": load, "offered": offered, "completed": len(latencies),
        "applied": int(window["commits_applied"]), "unsent": len(unsent),
        "applied_per_s": round(window["commits_applied"] / seconds, 1),
        "mb_in_per_s": round(window["bytes_in"] / seconds / 1e6, 2),
        "mb_out_per_s": round(window["bytes_out"] / seconds / 1e6, 2),
        **percentiles(latencies + unsent),
        "server_cores": round(window["server_cpu_s"] / seconds, 3),
        "server_ms_per_commit": round(1e3 * window["server_cpu_s"] / max(1, window["commits_applied"]), 3),
        "client_cores_max": round(max(r["cpu_s"] for r in found) / seconds, 3),
        "errors": sum(r["errors"] for r in found),
        "error_messages": [m for r in found for m in r["messages"]][:3],
        "seconds": round(seconds, 3),
    }


def shaped_rows(rates: Sequence[str], sizes: Sequence[str], rule: str | dict,
                budget: float) -> tuple[list[dict], str | None]:
    """Phase (c): phase (a) with the server behind a shaped link at each rate; ``(rows, why skipped)``."""
    why = shaped_link.unavailable()
    if why:
        return [], why
    rows = []
    for text in rates:
        bits = shaped_link.parse_rate(text)
        with shaped_link.ShapedLink(bits) as link:
            for label in sizes:
                nbytes = SIZES[label]
                ideal = 2 * nbytes * 8 / bits
                row = cpu_per_commit(label, nbytes, commits_for(ideal, budget, high=COMMITS[label]), rule, link=link,
                                     warmup=1)
                median = row["commit_ms"]["median_ms"] / 1e3
                rows.append(row | {"rate": text, "rate_bits": bits, "burst_bytes": shaped_link.tbf_burst(bits),
                                   "ideal_ms": round(1e3 * ideal, 3),
                                   "ratio_to_ideal": round(median / ideal, 3),
                                   "effective_mbit_per_direction": round(nbytes * 8 / (median / 2) / 1e6, 1)})
    return rows, None


# --------------------------------------------------------------------- main
def environment() -> dict:
    return _roundtrip_environment() | {"loadavg_start": os.getloadavg(), "uptime": _uptime()}


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except OSError:
        return ""


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate_ax, p99_ax, cpu_ax) = plt.subplots(1, 3, figsize=(15, 4.4))
    for k in sorted({r["workers"] for r in rows if r["phase"] == "b"}):
        points = [r for r in rows if r["phase"] == "b" and r["workers"] == k]
        loads = [r["load"] for r in points]
        rate_ax.plot(loads, [r["applied_per_s"] for r in points], "o-", label=f"K={k} applied")
        rate_ax.plot(loads, [r["offered_commits_per_s"] for r in points], ":", color="grey")
        p99_ax.plot(loads, [r["p99_ms"] for r in points], "o-", label=f"K={k}")
    rate_ax.set(xlabel="offered load (fraction of measured capacity)", ylabel="commits applied / s",
                title="Open loop: applied (dotted: offered)")
    p99_ax.set(xlabel="offered load (fraction of measured capacity)", ylabel="p99 latency from schedule (ms)",
               yscale="log", title="Open loop: p99 latency")
    if any(r["phase"] == "b" for r in rows):
        for ax in (rate_ax, p99_ax):
            ax.legend(fontsize=8)
    a = [r for r in rows if r["phase"] == "a"]
    if a:
        mb = [r["bytes"] / 2**20 for r in a]
        cpu_ax.plot(mb, [r["server_ms_per_commit"] for r in a], "o-", label="server CPU")
        cpu_ax.plot(mb, [r["client_ms_per_commit"] for r in a], "s-", label="client CPU")
        cpu_ax.set(xscale="log", yscale="log", xlabel="commit size (MiB)", ylabel="ms of CPU per commit",
                   title="CPU per commit, one client")
        cpu_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _print_a(row: dict) -> None:
    print(f"{row['size']:>6} {row['server_ms_per_commit']:10.3f} {row['client_ms_per_commit']:10.3f} "
          f"{row['commits_per_s']:9.1f} {row['commit_ms']['median_ms']:9.2f}", flush=True)


def _print_b(row: dict) -> None:
    load = "cap" if row["load"] is None else f"{row['load']:.1f}"
    offered = "-" if row["offered"] is None else str(row["offered"])
    p50 = "-" if row["p50_ms"] is None else f"{row['p50_ms']:.1f}"
    p99 = "-" if row["p99_ms"] is None else f"{row['p99_ms']:.1f}"
    print(f"{row['workers']:5d} {load:>4} {row['applied']:>7}/{offered:<7} {row['unsent']:6d} "
          f"{row['applied_per_s']:9.1f} {row['mb_in_per_s']:7.2f} {row['mb_out_per_s']:7.2f} {p50:>8} {p99:>9} "
          f"{row['server_cores']:6.2f} {row['client_cores_max']:6.2f} {row['errors']:6d}", flush=True)
    for message in row["error_messages"]:
        print(f"      error: {message}", flush=True)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="sizes to 1 MB, K = 8 and 32, short points")
    parser.add_argument("--phases", nargs="+", choices=("a", "b", "c"), default=None,
                        help="phases to run (default a and b, and c when --shaped is given)")
    parser.add_argument("--workers", type=int, nargs="+", default=None, help="K for (b); default 8 32 128 512")
    parser.add_argument("--loads", type=float, nargs="+", default=list(LOADS), help="offered loads for (b)")
    parser.add_argument("--bytes", type=int, default=32 << 10, help="commit size for (b); default 32768")
    parser.add_argument("--duration", type=float, default=None, help="offered seconds per (b) point; default 10")
    parser.add_argument("--capacity-seconds", type=float, default=None, help="closed-loop seconds; default 5")
    parser.add_argument("--client-processes", type=int, default=4, help="processes the workers run in; default 4")
    parser.add_argument("--rule", default="delayednesterov", help="asynchronous rule; default the fit's")
    parser.add_argument("--shards", type=int, default=1, help="server processes, each with 1/S of the model")
    parser.add_argument("--codec", choices=("none", "bf16", "int8"), default="none",
                        help="commits compressed with this codec (the rule wrapped in Compressed); default none")
    parser.add_argument("--shaped", nargs="+", default=[], metavar="RATE",
                        help="(c) at these rates, e.g. 100mbit 1gbit")
    parser.add_argument("--out", type=Path, default=None, help="prefix of the results; default results/ps_scale")
    args = parser.parse_args(argv)
    if args.serve:
        _serve()
        return {}
    if args.shards < 1:
        parser.error(f"--shards must be >= 1; received {args.shards}")
    for text in args.shaped:
        try:
            shaped_link.parse_rate(text)
        except ValueError as exc:
            parser.error(str(exc))
    phases = set(args.phases or (["a", "b"] + (["c"] if args.shaped else [])))
    rule = rule_spec(args.rule, args.codec)
    sizes = QUICK_SIZES if args.quick else tuple(SIZES)
    workers = args.workers or (QUICK_WORKERS if args.quick else WORKERS)
    duration = args.duration or (3.0 if args.quick else 10.0)
    capacity_s = args.capacity_seconds or (2.0 if args.quick else 5.0)
    out = args.out or HERE / "results" / ("ps_scale_quick" if args.quick else "ps_scale")

    rows: list[dict] = []
    results = {"environment": environment(), "method": _method(args, phases, duration, capacity_s), "rows": rows}
    if "a" in phases:
        print(f"(a) CPU per commit, one client, rule {args.rule}, codec {args.codec}, {args.shards} server process(es)")
        print(f"{'size':>6} {'server ms':>10} {'client ms':>10} {'commits/s':>9} {'median ms':>9}")
        for label in sizes:
            commits = max(5, COMMITS[label] // (10 if args.quick else 1))
            rows.append(cpu_per_commit(label, SIZES[label], commits, rule, args.shards))
            _print_a(rows[-1])
    if "b" in phases:
        print(f"\n(b) open loop, {args.bytes} B commits, {duration:g} s offered per point (+ grace), "
              f"capacity closed-loop over {capacity_s:g} s with min(K, {CLOSED_LOOP_MAX}) workers")
        print(f"{'K':>5} {'load':>4} {'applied/offered':>15} {'unsent':>6} {'commits/s':>9} {'MB/s in':>7} "
              f"{'MB/s out':>7} {'p50 ms':>8} {'p99 ms':>9} {'srv cores':>6} {'cli max':>6} {'errors':>6}")
        for k in workers:
            found = load_rows(k, args.bytes, rule, args.loads, capacity_s, duration, args.client_processes,
                              args.shards)
            print(f"      K={k}: {found[0]['client_processes']} client processes of about "
                  f"{-(-k // found[0]['client_processes'])} threads each", flush=True)
            for row in found:
                _print_b(row)
            rows.extend(found)
    if "c" in phases:
        shaped, why = shaped_rows(args.shaped or ["100mbit", "1gbit"], sizes, rule, 3.0 if args.quick else 8.0)
        results["shaped_skipped"] = why
        if why:
            print(f"\n(c) shaped link skipped: {why}")
        else:
            print("\n(c) shaped link (netns + veth + tbf each way), one client")
            print(f"{'rate':>8} {'size':>6} {'median ms':>9} {'ideal ms':>9} {'ratio':>6} {'Mbit/s each way':>15}")
            for row in shaped:
                print(f"{row['rate']:>8} {row['size']:>6} {row['commit_ms']['median_ms']:9.2f} {row['ideal_ms']:9.2f} "
                      f"{row['ratio_to_ideal']:6.2f} {row['effective_mbit_per_direction']:15.1f}", flush=True)
            rows.extend(shaped)
    results["environment"]["loadavg_end"] = os.getloadavg()
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(results, indent=1))
    plot(rows, Path(f"{out}.png"))
    print(f"\nload average at start {results['environment']['loadavg_start']}, at end {os.getloadavg()}")
    print(f"wrote {out}.json and {out}.png")
    return results


def _method(args, phases, duration: float, capacity_s: float) -> dict:
    return {
        "phases": sorted(phases), "rule": args.rule, "codec": args.codec, "mode": "asynchronous",
        "shards": args.shards,
        "server": "elephant Store + create_app + PSServer in its own process (subprocess, --serve); with --shards "
                  "S > 1 one elephant.ps.shard_process per shard of plan_shards over the model; "
                  "bearer token secrets.token_urlsafe(32); max_body_bytes as the fit; 2K+4 handler threads",
        "cpu": "client: time.thread_time() of the committing thread (a); getrusage(RUSAGE_SELF) per client "
               "process (b). server: utime+stime of /proc/<pid>/stat (10 ms ticks); idle rate recorded, "
               "not subtracted",
        "open_loop": "worker k of K sends at k/r + n*K/r (r = load * capacity); latency from the scheduled time; "
                     "sends not started within grace after the window count with their wait so far",
        "capacity": f"closed loop, min(K, {CLOSED_LOOP_MAX}) workers back to back for {capacity_s:g} s, same run",
        "b_bytes": args.bytes, "b_offered_seconds": duration, "client_processes": args.client_processes,
        "shard_client": "elephant ShardedClient (connect_shards): each commit split by the plan, the S slices "
                        "sent in parallel",
    }


if __name__ == "__main__":
    main()
