"""Clients of the parameter server: HTTP (:class:`PSClient`) and in-process.

Both have the same methods (``health``, ``pull``, ``commit``, ``finish``,
``next_epoch``, ``metrics``, ``close``), so the worker loop never knows which one it has.

:class:`PSClient` keeps its connections alive and sends with explicit
``(connect, read)`` timeouts. Pull, commit and finish are retried a bounded
number of times on connection errors, timeouts and HTTP 502/503: safe because
every commit carries an idempotency key, so a commit whose response was lost
is acknowledged, not applied twice, when it is re-sent. HTTP 4xx, 500 (a
server-rule failure) and 504 (round timeout) are final answers. Every failure
is a :class:`~elephant.errors.PSError` naming what was attempted and the
server's ``host:port``; 409 is :class:`~elephant.errors.StaleAttemptError`.

How the bytes travel is :mod:`elephant.ps.transport`: the client's own
keep-alive connections for an ``http://`` URL, or a ``requests.Session``
given as ``session=`` (the seam that lets tests run without a socket).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import numpy as np

from elephant.errors import ConfigError, DataError, PSError, ProtocolError, StaleAttemptError, Transient, TransportFailed
from elephant.protocol import Commit, CommitKey, Reply
from elephant.ps import wire
from elephant.ps.course import WAIT_S, Course
from elephant.ps.store import Store
from elephant.ps.transport import open_transport

if TYPE_CHECKING:
    import requests

logger = logging.getLogger(__name__)

__all__ = ["PSClient", "InProcessClient"]

_RETRY_STATUSES = frozenset({502, 503})
_MAX_BACKOFF = 5.0
_JSON_HEADERS = {"Content-Type": "application/json"}


def commit_what(key: CommitKey, attempt: int) -> str:
    """How errors name a commit: ``"commit (run r, epoch e, partition p, step s, attempt a)"``."""
    return f"commit (run {key.run}, epoch {key.epoch}, partition {key.partition}, step {key.step}, attempt {attempt})"


def check_template(reply: Reply, template: Sequence[Any] | None) -> Reply:
    """``reply`` itself; raises :class:`ProtocolError` if its center's count, shapes or dtypes differ from ``template``."""
    if template is not None:
        if len(template) != len(reply.center):
            raise ProtocolError(f"expected {len(template)} center tensors, received {len(reply.center)}")
        for i, (t, a) in enumerate(zip(template, reply.center)):
            if tuple(t.shape) != a.shape or np.dtype(t.dtype) != a.dtype:
                raise ProtocolError(
                    f"center tensor {i}: expected {np.dtype(t.dtype)}{list(t.shape)}, received {a.dtype}{list(a.shape)}"
                )
    return reply


class PSClient:
    """HTTP client of one parameter server.

    Args:
        url: the server's base URL, e.g. ``PSServer.url``.
        token: the run's bearer token.
        connect_timeout: seconds to establish a connection. Default 5.
        read_timeout: seconds to wait for response bytes. Default 120; in
            synchronous mode use more than the store's ``round_timeout``, since
            a commit waits for its round.
        retries: retries after the first try of pull, commit, finish, health
            and metrics. Default 3.
        backoff: base of the jittered exponential backoff between tries, in
            seconds (``backoff * 2**i``, capped at 5 s). Default 0.1.
        session: a ``requests.Session`` to send through (the transport seam),
            left open by :meth:`close`. Default: the client's own keep-alive
            connections for an ``http://`` URL; for ``https://`` a new session
            that ignores proxy environment variables (``trust_env=False``),
            closed by :meth:`close` (see :mod:`elephant.ps.transport`).

    Raises:
        ConfigError: the URL or a setting is invalid.
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 120.0,
        retries: int = 3,
        backoff: float = 0.1,
        session: requests.Session | None = None,
    ):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
            raise ConfigError(f"`url` must look like 'http://host:port'; received url={url!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"`retries` must be an int >= 0; received retries={retries!r}")
        for name, value in (("connect_timeout", connect_timeout), ("read_timeout", read_timeout)):
            if not value > 0:
                raise ConfigError(f"`{name}` must be > 0 seconds; received {name}={value!r}")
        if not backoff >= 0:
            raise ConfigError(f"`backoff` must be >= 0 seconds; received backoff={backoff!r}")
        self._base = url.rstrip("/")
        self.address = f"{parts.hostname}:{parts.port}"
        self._timeout = (float(connect_timeout), float(read_timeout))
        self._retries = retries
        self._backoff = float(backoff)
        self._transport = open_transport(url, self._timeout, session)
        self._headers = {"Authorization": f"Bearer {token}"}
        #: ``(view, center)`` of the last reply that named its view: what a change reply is rebuilt from.
        self._held: tuple[str, list] | None = None

    # --------------------------------------------------------------- requests
    def _request(self, method: str, path: str, what: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        """Send with bounded retries; returns the fully read body of a 2xx response."""
        headers = {**self._headers, **headers} if headers else self._headers
        attempts = self._retries + 1
        last: str = ""
        for i in range(attempts):
            if i:
                delay = min(_MAX_BACKOFF, self._backoff * 2 ** (i - 1)) * random.uniform(0.5, 1.5)
                logger.info("%s to %s: retry %d/%d in %.2f s after %s", what, self.address, i, self._retries, delay, last)
                time.sleep(delay)
            try:
                status, payload = self._transport.send(method, path, body, headers)  # the body is read in the retry scope
            except Transient as exc:
                last = str(exc)
                continue
            except TransportFailed as exc:
                raise PSError(f"{what} to parameter server {self.address} failed: {exc}") from None
            if status < 300:
                return payload
            reason = _reason(payload)
            if status in _RETRY_STATUSES:
                last = f"HTTP {status}: {reason}"
                continue
            error = StaleAttemptError if status == 409 else PSError
            raise error(_rejected(what, f"parameter server {self.address}, HTTP {status}", reason))
        raise PSError(f"{what} to parameter server {self.address} failed after {attempts} attempts: {last}")

    # ------------------------------------------------------------------ API
    def health(self) -> dict[str, Any]:
        """The server's ``/health`` JSON (status, run, clock, mode)."""
        return _json(self._request("GET", "/health", "health check"))

    def pull(self, worker: int, template: Sequence[Any] | None = None, epoch: int | None = None) -> Reply:
        """The center and clock (read-only arrays), checked against ``template`` if given."""
        path = f"/weights?worker={int(worker)}" + ("" if epoch is None else f"&epoch={int(epoch)}")
        what = f"pull (worker {worker})"
        return self._decode(self._request("GET", path, what), template, what)

    def commit(self, key: CommitKey, attempt: int, commit: Commit, template: Sequence[Any] | None = None) -> Reply:
        """Send one commit; returns the server's reply (new center, rule tensors)."""
        key = CommitKey(*key)
        what = commit_what(key, attempt)
        body = wire.encode_commit(key, attempt, commit)
        return self._decode(self._request("POST", "/commit", what, body), template, what)

    def finish(self, run: str, epoch: int, partition: int, attempt: int, stats: dict | None = None) -> None:
        """Tell the server that ``partition`` has no more data in ``epoch``; ``stats``: its report to the
        server's course (a fit run as one Spark job, :mod:`elephant.ps.course`)."""
        what = f"finish (run {run}, epoch {epoch}, partition {partition}, attempt {attempt})"
        payload = {"run": run, "epoch": epoch, "partition": partition, "attempt": attempt}
        if stats is not None:
            payload["stats"] = stats
        self._request("POST", "/finish", what, json.dumps(payload, default=plain_number).encode("utf-8"),
                      _JSON_HEADERS)

    def next_epoch(self, epoch: int, job: int | None = None) -> dict[str, Any]:
        """The first epoch from ``epoch`` on that the server's course opens (its spec's changes, waited for),
        or ``{"closed": True}``: the fit has no more epochs for its tasks, or none for a task of ``job`` (the
        course's job generation, :meth:`~elephant.ps.course.Course.restart`) where another has started."""
        query = f"/course?epoch={int(epoch)}" + ("" if job is None else f"&job={int(job)}")
        while True:
            opened = _json(self._request("GET", query, f"next epoch (from {epoch})"))
            if not opened.get("wait"):
                return opened

    def metrics(self) -> dict[str, Any]:
        """The server's metrics JSON (staleness histogram keys are strings)."""
        return _json(self._request("GET", "/metrics", "metrics"))

    def _decode(self, body: Any, template: Sequence[Any] | None, what: str) -> Reply:
        try:
            reply = wire.decode_reply(body, template, self._held)
        except ProtocolError as exc:
            raise PSError(f"{what}: parameter server {self.address} sent an invalid reply: {exc}") from None
        self._held = None if reply.view is None else (reply.view, reply.center)
        return reply

    def close(self) -> None:
        """Close the connections, and the session if this client created it."""
        self._transport.close()

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PSClient({self._base!r})"

    def __reduce__(self):
        raise TypeError("PSClient holds an open session; build one inside each Spark task from the url and token")


def _rejected(what: str, where: str, reason: Any) -> str:
    """``"<what> rejected by <where>: <reason>"`` without repeating ``what`` if the reason starts with it."""
    reason = str(reason)
    if reason.startswith(what):
        return f"{reason} (rejected by {where})"
    return f"{what} rejected by {where}: {reason}"


def plain_number(value: Any) -> Any:
    """A numpy scalar as the Python number JSON writes (``json.dumps(default=)``)."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"a value of type {type(value).__name__} is not JSON")


def _json(body: Any) -> dict[str, Any]:
    try:
        return json.loads(bytes(body))
    except ValueError as exc:
        raise PSError(f"parameter server sent invalid JSON: {exc}") from None


def _reason(body: Any) -> str:
    text = bytes(body).decode("utf-8", "replace")
    try:
        return str(json.loads(text)["error"])
    except (ValueError, KeyError, TypeError):
        return text[:500] or "no reason given"


class InProcessClient:
    """The :class:`PSClient` interface calling a :class:`Store` directly (tests, simulator).

    Commit tensors are copied on the way in, as the wire would; reply arrays
    are the store's read-only snapshots. Malformed commits raise ``PSError``
    like the HTTP client's 400s; stale attempts raise ``StaleAttemptError``.
    """

    def __init__(self, store: Store, course: Course | None = None):
        self._store, self._course = store, course
        self.address = "in-process"

    def _where(self) -> str:
        return f"in-process parameter server of run {self._store.run}"

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "run": self._store.run, "clock": self._store.clock, "mode": self._store.mode}

    def pull(self, worker: int, template: Sequence[Any] | None = None, epoch: int | None = None) -> Reply:
        what = f"pull (worker {worker})"
        try:
            return check_template(self._store.pull(worker, epoch), template)
        except (ProtocolError, DataError) as exc:
            raise PSError(_rejected(what, self._where(), exc)) from None

    def commit(self, key: CommitKey, attempt: int, commit: Commit, template: Sequence[Any] | None = None) -> Reply:
        key = CommitKey(*key)
        tensors = [np.array(t, copy=True) for t in commit.tensors]
        copied = Commit(tensors=tensors, num_steps=commit.num_steps, num_samples=commit.num_samples, base_clock=commit.base_clock)
        try:
            return check_template(self._store.commit(key, attempt, copied), template)
        except (ProtocolError, DataError) as exc:
            raise PSError(_rejected(commit_what(key, attempt), self._where(), exc)) from None

    def finish(self, run: str, epoch: int, partition: int, attempt: int, stats: dict | None = None) -> None:
        what = f"finish (run {run}, epoch {epoch}, partition {partition}, attempt {attempt})"
        try:
            self._store.finish(run, epoch, partition, attempt)
            if stats is not None:
                self._course.report(run, epoch, partition, json.loads(json.dumps(stats, default=plain_number)))
        except (ProtocolError, DataError) as exc:
            raise PSError(_rejected(what, self._where(), exc)) from None

    def next_epoch(self, epoch: int, job: int | None = None) -> dict[str, Any]:
        while True:
            opened = self._course.next(epoch, WAIT_S, job)
            if opened is not None:
                return opened

    def metrics(self) -> dict[str, Any]:
        return self._store.metrics()

    def close(self) -> None:
        pass

    def __enter__(self) -> InProcessClient:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
