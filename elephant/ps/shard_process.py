"""One parameter-server shard in a process of its own on the driver host, steered over a pipe.

One Python process serves about one core's worth of commits (the GIL;
``benchmarks/ps_scale.py`` measures it), so the ``S`` shards of a sharded server run in
``S`` processes. :func:`start_shards` starts them, in parallel, with the
``spawn`` start method (never ``fork``: the driver has a JVM gateway and
threads). Each child builds an ordinary :class:`~elephant.ps.store.Store` over
its slice, the app (:func:`~elephant.ps.app.create_app`) and a server
(:func:`~elephant.ps.server.start_server`, on the first free port of the
allowed ones), and sends back its URL; the driver waits on that message (never
a sleep), and a child that fails to start is reported with its traceback.

The driver then holds one :class:`ShardProcess` per shard: it has the
:class:`Store` methods a fit uses (``center``, ``template``, ``snapshot``,
``rollback``, ``metrics``, ``ledger``, ``samples_applied``,
``learning_rate_changed``, ``run``, ``clock``, ``wait_finished``, ``close``),
each a request over a :class:`multiprocessing.connection.Connection`, so a
:class:`~elephant.ps.sharded_store.ShardedStore` holds them where it held
stores. Snapshots come back as :class:`~elephant.ps.snapshots.Snapshot` objects
(picklable data: center slice, rule state, clock, bookkeeping).

Requests carry an id and may be answered out of order (``wait_finished``
blocks in a thread of the child), so several driver threads can use one
proxy at once (the progress bar polls ``samples_applied`` while the fit reads
the center). :meth:`ShardProcess.stop` stops the server, takes the store's
final :class:`~elephant.ps.snapshots.Outcome` back, joins the child (terminating
it after ``timeout``) and closes the pipe. A child whose driver dies sees its
pipe close (or its parent change) and exits.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
import threading
import time
import traceback
import types
from collections.abc import Sequence
from typing import Any

import numpy as np

from elephant.errors import PSError

logger = logging.getLogger(__name__)

__all__ = ["ShardProcess", "start_shards", "unhostable", "START_METHOD", "NAME_PREFIX"]

#: The multiprocessing start method: a fresh interpreter, nothing inherited from the driver but the pipe.
START_METHOD = "spawn"
#: Name prefix of the child processes (``multiprocessing.active_children()``; the tests' leak check).
NAME_PREFIX = "elephant-ps-shard"
#: Seconds between two checks that the other side of the pipe is still alive.
POLL_S = 0.5


# ------------------------------------------------------------------ the child
def _frozen(snapshot: Any) -> Any:
    """A snapshot that crossed the pipe, with read-only center arrays again (the store never mutates them)."""
    import dataclasses

    center = [np.asarray(a) for a in snapshot.center]
    for a in center:
        a.setflags(write=False)
    return dataclasses.replace(snapshot, center=center)


def _operations(store: Any) -> dict[str, Any]:
    return {
        "center": store.center, "snapshot": store.snapshot, "metrics": store.metrics, "ledger": store.ledger,
        "outcome": store.outcome, "close": store.close, "learning_rate_changed": store.learning_rate_changed,
        "wait_finished": store.wait_finished, "run": lambda: store.run, "clock": lambda: store.clock,
        "samples_applied": lambda: store.samples_applied,
        "rollback": lambda snapshot, run: store.rollback(_frozen(snapshot), run),
    }


def _reply(conn: Any, lock: threading.Lock, ident: int, call: Any, args: tuple) -> None:
    try:
        message = (ident, True, call(*args))
    except Exception as exc:  # sent back and raised in the driver
        message = (ident, False, exc)
    with lock:
        try:
            conn.send(message)
        except OSError:  # the driver is gone; the serve loop sees it too
            return
        except Exception as exc:  # an unpicklable answer or exception
            conn.send((ident, False, PSError(f"the shard's answer could not be sent back: {exc!r}; "
                                             f"it was {message[2]!r:.500}")))


def _child(conn: Any, parent: int) -> None:
    """The child's entry: build the shard from the spec on ``conn``, report the URL, serve requests until told."""
    try:
        from elephant.ps.app import create_app
        from elephant.ps.server import start_server
        from elephant.ps.store import Store

        spec = conn.recv()
        store = Store(spec["center"], spec["optimizer"], spec["mode"], spec["num_workers"], spec["run"],
                      round_timeout=spec["round_timeout"], state=spec["state"], clock=spec["clock"])
        del spec["center"], spec["state"]
        app = create_app(store, spec["token"], max_body_bytes=spec["max_body_bytes"])
        server = start_server(app, spec["host"], spec["ports"], spec["threads"], ports_from=spec["ports_from"])
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(("failed", traceback.format_exc()))
        return
    lock = threading.Lock()
    try:
        with lock:
            conn.send(("ready", server.url))
        _serve(conn, lock, store, server, parent)
    finally:
        server.stop()


def _serve(conn: Any, lock: threading.Lock, store: Any, server: Any, parent: int) -> None:
    operations = _operations(store)
    while True:
        try:
            if not conn.poll(POLL_S):
                if os.getppid() != parent:
                    logger.warning("shard of run %s: the driver (pid %d) is gone; exiting", store.run, parent)
                    return
                continue
            ident, name, args = conn.recv()
        except (EOFError, OSError):  # the driver closed its end, or died
            return
        if name == "stop":
            server.stop()  # closes the store, wakes its waiting requests, joins the server's threads
            _reply(conn, lock, ident, store.outcome, ())
            return
        call = operations.get(name)
        if call is None:
            _reply(conn, lock, ident, _unknown(name), ())
        elif name == "wait_finished":  # blocks: answered from a thread, the others are served meanwhile
            threading.Thread(target=_reply, args=(conn, lock, ident, call, args), daemon=True,
                             name="elephant-shard-wait").start()
        else:
            _reply(conn, lock, ident, call, args)


def _unknown(name: str) -> Any:
    def fail() -> None:
        raise PSError(f"a shard process has no operation {name!r}")
    return fail


# ----------------------------------------------------------------- the driver
@contextlib.contextmanager
def _bare_main():
    """Start children without the driver's ``__main__``: spawn would run an unguarded script's body again there."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def unhostable(optimizer: Any) -> str | None:
    """Why ``optimizer`` cannot be sent to a shard process (None: it can).

    A child is started without the driver's ``__main__`` (:func:`_bare_main`), so a rule
    class defined there cannot be found in it.
    """
    if type(optimizer).__module__ == "__main__":
        return (f"the rule's class {type(optimizer).__name__} is defined in __main__, which a shard process does "
                "not import (define it in a module)")
    return None


class ShardProcess:
    """The driver's handle on one shard's process: :class:`Store`'s methods, each a request over the pipe.

    Made by :func:`start_shards`; see the module's docstring.

    Attributes:
        index: the shard's index; url: its server's URL; process: the
            :class:`multiprocessing.Process`; optimizer, mode, num_workers:
            as the store's (the driver's copies).
    """

    def __init__(self, index: int, process: Any, conn: Any, optimizer: Any, mode: str, num_workers: int, run: str):
        self.index, self.process, self._conn = index, process, conn
        self.optimizer, self.mode, self.num_workers = optimizer, mode, num_workers
        self.url: str | None = None
        self._run = run
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._answers: dict[int, tuple[bool, Any]] = {}
        self._reading = False
        self._stopped = False

    # ------------------------------------------------------------- transport
    def _died(self, what: str) -> PSError:
        code = self.process.exitcode
        return PSError(f"parameter-server shard {self.index} (process {self.process.pid}) is gone "
                       f"({'exit code ' + str(code) if code is not None else 'its pipe closed'}) during {what}")

    def _receive(self, what: str, deadline: float | None = None) -> Any:
        while not self._conn.poll(POLL_S):
            if not self.process.is_alive() and not self._conn.poll(0):
                raise self._died(what)
            if deadline is not None and time.monotonic() > deadline:
                raise PSError(f"parameter-server shard {self.index} (process {self.process.pid}) did not answer "
                              f"{what} in time")
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            raise self._died(what) from None

    def _call(self, name: str, *args: Any, timeout: float | None = None) -> Any:
        if self._stopped:
            raise PSError(f"parameter-server shard {self.index} was stopped; received a request for {name}")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._send_lock:
            ident = next(self._ids)
            try:
                self._conn.send((ident, name, args))
            except (OSError, ValueError):
                raise self._died(name) from None
        while True:  # whoever is not waiting on another's read reads, and files answers by id
            with self._cond:
                while ident not in self._answers and self._reading:
                    self._cond.wait()
                if ident in self._answers:
                    ok, value = self._answers.pop(ident)
                    break
                self._reading = True
            answer = None
            try:
                answer = self._receive(name, deadline)
            finally:
                with self._cond:
                    self._reading = False
                    if answer is not None:
                        self._answers[answer[0]] = answer[1:]
                    self._cond.notify_all()
        if not ok:
            raise value
        return value

    # ------------------------------------------------------- the Store methods
    run = property(lambda self: self._run, doc="The run id the shard serves.")
    clock = property(lambda self: self._call("clock"), doc="Commits or rounds the shard applied.")
    samples_applied = property(lambda self: self._call("samples_applied"), doc="As :attr:`Store.samples_applied`.")
    streams_rounds = property(lambda self: self.mode == "synchronous" and self.optimizer.streams_rounds,
                              doc="As :attr:`Store.streams_rounds`.")
    template = property(lambda self: self._call("center"), doc="The shard's center (shapes, dtypes); fetched.")

    def center(self) -> list[np.ndarray]:
        return self._call("center")

    def snapshot(self) -> Any:
        return self._call("snapshot")

    def rollback(self, snapshot: Any, run: str) -> int:
        undone = self._call("rollback", snapshot, run)
        self._run = run
        return undone

    def metrics(self) -> dict[str, Any]:
        return self._call("metrics")

    def ledger(self) -> list:
        return self._call("ledger")

    def outcome(self) -> Any:
        return self._call("outcome")

    def learning_rate_changed(self, ratio: float) -> None:
        self._call("learning_rate_changed", ratio)

    def wait_finished(self, epoch: int) -> None:
        self._call("wait_finished", epoch)

    def close(self) -> None:
        """Refuse further requests (the server keeps answering them, with 503); :meth:`stop` ends the process."""
        self._call("close")

    # -------------------------------------------------------------- lifecycle
    def stop(self, timeout: float = 30.0) -> Any:
        """Stop the server and the process; the store's final :class:`Outcome` (None if the child was gone).

        Waits ``timeout`` seconds (default 30) for the answer and as long for the child to exit, then
        terminates it (and kills it if it ignores that too). Idempotent.
        """
        if self._stopped:
            return None
        outcome = None
        try:
            if self.url is not None and self.process.is_alive():  # a child that never served has nothing to stop
                outcome = self._call("stop", timeout=timeout)
        except PSError as exc:
            logger.warning("%s", exc)
        finally:
            self._stopped = True
            self.process.join(timeout)
            if self.process.is_alive():
                logger.warning("parameter-server shard %d (process %d) did not exit in %g s; terminating it",
                               self.index, self.process.pid, timeout)
                self.process.terminate()
                self.process.join(min(timeout, 5.0))
                if self.process.is_alive():
                    self.process.kill()
                    self.process.join()
            self._conn.close()
        return outcome

    def __repr__(self) -> str:
        return f"ShardProcess(index={self.index}, pid={self.process.pid}, url={self.url!r}, run={self._run!r})"

    def __reduce__(self):
        raise TypeError("ShardProcess lives on the driver and cannot be pickled into a Spark task; tasks reach "
                        "the shard through its url")


def start_shards(specs: Sequence[dict[str, Any]], *, ready_timeout: float = 120.0) -> list[ShardProcess]:
    """Start one process per spec, all at once, and wait until each serves; their handles, in spec order.

    Args:
        specs: per shard, a dict with ``center`` (its slice), ``optimizer``, ``mode``, ``num_workers``,
            ``run``, ``round_timeout``, ``state`` (None: ``server_init``), ``clock``, ``token``,
            ``host``, ``ports`` (tried in order; ``[0]``: any free port), ``ports_from`` (named in a
            bind error), ``max_body_bytes`` and ``threads``.
        ready_timeout: seconds to wait for every child's URL (default 120: a fresh interpreter imports
            numpy and Flask first).

    Raises:
        PSError: a child failed to start (its traceback is in the message) or was not ready in
            ``ready_timeout``; the children already started are stopped first.
    """
    import multiprocessing

    context = multiprocessing.get_context(START_METHOD)
    started: list[ShardProcess] = []
    t0 = time.monotonic()
    try:
        for index, spec in enumerate(specs):
            ours, theirs = context.Pipe()
            process = context.Process(target=_child, args=(theirs, os.getpid()), daemon=True,
                                      name=f"{NAME_PREFIX}-{index}")
            with _bare_main():
                process.start()
            theirs.close()  # the child holds its own end: its death closes the pipe for us
            shard = ShardProcess(index, process, ours, spec["optimizer"], spec["mode"], spec["num_workers"],
                                 spec["run"])
            started.append(shard)
            ours.send(dict(spec))  # over the pipe to our own child (multiprocessing pickles it), never a socket
        deadline = time.monotonic() + ready_timeout
        for shard in started:
            what = f"its start (waited up to {ready_timeout:g} s)"
            status, detail = shard._receive(what, deadline)
            if status != "ready":
                raise PSError(f"parameter-server shard {shard.index} (process {shard.process.pid}) failed to "
                              f"start:\n{detail}")
            shard.url = detail
    except BaseException:
        for shard in started:
            shard.stop(timeout=5.0)
        raise
    logger.info("%d parameter-server shard processes ready in %.2f s: %s", len(started), time.monotonic() - t0,
                ", ".join(f"{s.url} (pid {s.process.pid})" for s in started))
    return started
