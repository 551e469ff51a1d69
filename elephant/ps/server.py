"""Lifecycle of the parameter server: a WSGI server hosted in a driver thread.

:class:`PSServer` serves the Flask app made by :func:`elephant.ps.app.create_app`
from a daemon thread of this process. What is under it:

* the HTTP layer (:mod:`elephant.ps.http`): werkzeug's ``BaseWSGIServer``
  with a bounded pool of keep-alive handler threads that send the center's
  buffers without copying them;
* the gate (:mod:`elephant.ps.gate`): one selector thread that reads each
  request head, refuses what it cannot frame or what lacks the run's token,
  and holds idle connections, so neither costs a handler thread;
* the allocator setting (:mod:`elephant.ps.allocator`), asked for where
  synchronous rounds stream many commits at once.

Lifecycle: port 0 binds a free port (``.port``, ``.url``); :meth:`~PSServer.start`
returns once an authenticated ``/health`` answers (polled, never a fixed
sleep); a second start is refused; :meth:`~PSServer.stop` is idempotent, wakes
blocked requests, shuts down, joins every thread and closes every socket.
The gate's and the pool's counts are read back as the ``connections_*``
properties.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from flask import Flask

from elephant.errors import ConfigError, PSError
from elephant.ps.allocator import map_large_allocations
from elephant.ps.app import EXTENSION
from elephant.ps.http import BufferedHandler, PooledWSGIServer

logger = logging.getLogger(__name__)

__all__ = ["PSServer", "default_threads", "start_server"]


def default_threads(num_workers: int | None) -> int:
    """Handler threads for ``num_workers`` workers: ``max(8, num_workers + 4)``.

    Synchronous commits hold a thread until their round closes, so every
    worker needs one, plus headroom for retries, the driver and health checks.
    """
    return max(8, (num_workers or 0) + 4)


def _bind(host: str, port: int) -> socket.socket:
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise PSError(f"could not bind the parameter server to {host}:{port}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise PSError(f"could not bind the parameter server to {host}:{port}: {exc.strerror or exc}") from None
    return sock


def _count(name: str, doc: str) -> property:
    """A read-only property: the running server's count ``name``, 0 when not running."""
    return property(lambda self: getattr(self._server, name) if self._server is not None else 0, doc=doc)


class PSServer:
    """Serve a parameter-server app from a daemon thread of this process.

    Args:
        app: the Flask app made by :func:`elephant.ps.app.create_app`.
        host: interface to bind. Default ``"127.0.0.1"``; on a cluster use
            ``spark.driver.host``. Never ``0.0.0.0`` unless you mean it.
        port: TCP port; 0 (default) picks a free one, read back from :attr:`port`.
        threads: handler threads. Default :func:`default_threads` of the
            store's ``num_workers`` (synchronous mode needs at least
            ``num_workers + 2``).
        idle_timeout: seconds an idle keep-alive connection is kept open
            (it holds no handler thread), and the longest a response may take
            to write. Default 60.
        header_timeout: seconds a new connection may take to send its first
            bytes, and a request between two of its chunks. Default 10.
        max_connections: open connections beyond which new ones are closed
            at once. Default 1024.
        ready_timeout: seconds :meth:`start` waits for ``/health``. Default 10.

    Example::

        with PSServer(create_app(store, token)) as server:
            client = PSClient(server.url, token)
    """

    def __init__(
        self,
        app: Flask,
        host: str = "127.0.0.1",
        port: int = 0,
        threads: int | None = None,
        *,
        idle_timeout: float = 60.0,
        header_timeout: float = 10.0,
        max_connections: int = 1024,
        ready_timeout: float = 10.0,
    ):
        context = app.extensions.get(EXTENSION)
        if context is None:
            raise ConfigError("`app` must be made by elephant.ps.app.create_app (it has no parameter-server extension)")
        if threads is None:
            threads = default_threads(context["store"].num_workers)
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ConfigError(f"`threads` must be a positive int; received threads={threads!r}")
        self._app = app
        self._store = context["store"]
        self._token = context["token"]
        self._host = host
        self._requested_port = port
        self._threads = threads
        self._idle_timeout = idle_timeout
        self._header_timeout = header_timeout
        self._max_connections = max_connections
        self._ready_timeout = ready_timeout
        self._server: PooledWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._started = False
        self._lock = threading.Lock()

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        """The bound port (the real one when constructed with port 0)."""
        if self._server is None:
            raise PSError("the parameter server is not running; call start() first")
        return self._server.port

    @property
    def url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}"

    @property
    def threads(self) -> int:
        return self._threads

    connections_accepted = _count("accepted", "TCP connections accepted so far (keep-alive clients reuse theirs).")
    connections_open = _count(
        "open_connections", "Connections open now (idle ones included: they wait in the gate, not in a thread).")
    connections_refused = _count("refused", "Connections closed at once because ``max_connections`` were open.")
    connections_expired = _count(
        "expired", "Connections closed for sending nothing, or too slowly, within their deadline.")
    connections_unauthorized = _count(
        "unauthorized", "Requests refused by the gate for a missing or wrong token (their bodies never read).")

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> PSServer:
        """Bind, serve in a daemon thread and wait until ``/health`` answers.

        Raises:
            PSError: already started (even if stopped since), the address cannot be
                bound, or the server did not become ready in ``ready_timeout``.
        """
        with self._lock:
            if self._started:
                raise PSError(f"this parameter server was already started (at {self._host}); create a new PSServer")
            self._started = True
            if self._store.streams_rounds:  # where many bodies arrive at once (see map_large_allocations)
                map_large_allocations()
            sock = _bind(self._host, self._requested_port)
            try:
                handler = type("_PSHandler", (BufferedHandler,), {"timeout": self._idle_timeout})
                self._server = PooledWSGIServer(
                    self._host, 0, self._app, handler, self._threads, sock.fileno(),
                    authorization=f"Bearer {self._token}".encode(), header_timeout=self._header_timeout,
                    idle_timeout=self._idle_timeout, max_connections=self._max_connections)
            finally:
                sock.close()  # the server holds its own duplicate of the descriptor
            self._thread = threading.Thread(
                target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="elephant-ps-serve", daemon=True
            )
            self._thread.start()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        logger.info("parameter server of run %s listening on %s (%d threads)", self._store.run, self.url, self._threads)
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._ready_timeout
        last: Any = None
        while time.monotonic() < deadline:
            conn = http.client.HTTPConnection(self._host, self.port, timeout=1.0)
            try:
                conn.request("GET", "/health", headers={"Authorization": f"Bearer {self._token}"})
                response = conn.getresponse()
                payload = response.read()
                if response.status == 200 and json.loads(payload).get("run") == self._store.run:
                    return
                last = f"HTTP {response.status}: {payload[:200]!r}"
            except (OSError, ValueError) as exc:
                last = exc
            finally:
                conn.close()
            time.sleep(0.01)
        raise PSError(f"parameter server {self._host}:{self.port} not ready after {self._ready_timeout:g} s: {last}")

    def stop(self) -> None:
        """Stop serving, wake blocked requests, join all threads, close all sockets. Idempotent."""
        with self._lock:
            server, thread = self._server, self._thread
            if server is None:
                return
            self._store.close()
            server.shutdown()
            thread.join()  # shutdown() returns within one poll interval (20 ms) of the serve loop
            server.close_all()
            self._thread = None
            logger.info("parameter server of run %s on %s:%d stopped", self._store.run, self._host, server.port)
            self._server = None

    def __enter__(self) -> PSServer:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


def start_server(app: Flask, host: str, ports: Sequence[int], threads: int, *, ports_from: str = "the given ports"):
    """A started :class:`PSServer` on the first port of ``ports`` that binds (``[0]``: any free port).

    ``ports_from`` names where the ports came from, for the error.

    Raises:
        PSError: no port of ``ports`` could be bound (the last error names why).
    """
    *others, last = ports
    for port in others:
        try:
            return PSServer(app, host=host, port=port, threads=threads).start()
        except PSError as exc:
            if "could not bind" not in str(exc):
                raise
    try:
        return PSServer(app, host=host, port=last, threads=threads).start()
    except PSError as exc:
        if others and "could not bind" in str(exc):
            raise PSError(f"{exc} (tried {len(ports)} ports of {ports_from})") from None
        raise
