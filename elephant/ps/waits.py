"""A store's waits: requests held on its condition until a round closes, SSP admits or an epoch ends (no HTTP).

A :class:`Waits` belongs to one :class:`~elephant.ps.store.Store` and waits on
its condition, the store's lock held. Every wait ends with
:class:`~elephant.errors.StoreClosedError` once the store is closed, and a
request's wait with :class:`~elephant.errors.RolledBackError` once its run was
rolled back, or with :class:`~elephant.errors.RoundTimeoutError` after the
store's ``round_timeout``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from elephant.errors import RolledBackError, RoundTimeoutError, StoreClosedError

logger = logging.getLogger("elephant.ps.store")  # the store's logger, as before the waits had a module of their own

__all__ = ["Waits"]


class Waits:
    """The waits of one store, on its condition ``cond``; the store's lock held on every call.

    Args:
        cond: the store's condition (over its lock), notified when anything waited on may have changed.
        timeout: seconds a request's wait (a round, an SSP admission) may last.
        run: the store's current run id (it changes on a rollback).
    """

    def __init__(self, cond: threading.Condition, timeout: float, run: Callable[[], str]):
        self._cond, self._timeout, self._run = cond, timeout, run
        self.closed = False
        self.waiting = 0  # requests blocked in a round or an SSP admission

    def check_open(self, what: str | None = None) -> None:
        """Raise :class:`StoreClosedError` (its message led by ``what``) once the store is closed."""
        if self.closed:
            lead = "" if what is None else f"{what}: "
            raise StoreClosedError(f"{lead}the parameter server of run {self._run()} is shutting down")

    def close(self) -> None:
        """Refuse further requests; wake every waiting one (it raises :class:`StoreClosedError`)."""
        self.closed = True
        self._cond.notify_all()

    def until(self, ready: Callable[[], bool], on_timeout: Callable[[], str]) -> None:
        """Wait until ``ready()``; after the timeout raise :class:`RoundTimeoutError` with ``on_timeout()``'s message.

        Raises :class:`RolledBackError` if the run is rolled back meanwhile.
        """
        deadline = time.monotonic() + self._timeout
        run = self._run()
        self.waiting += 1
        try:
            while not ready():
                self.check_open()
                if self._run() != run:
                    raise RolledBackError(f"run {run} was rolled back while this request waited")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    message = on_timeout()
                    logger.warning("%s", message)
                    raise RoundTimeoutError(message)
                self._cond.wait(remaining)
        finally:
            self.waiting -= 1

    def within(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        """Wait until ``ready()`` for ``timeout`` seconds at most (None: no limit); whether it became ready."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not ready():
            self.check_open()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            self._cond.wait(left)
        return True
