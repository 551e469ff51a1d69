"""Lifecycle of the parameter server: a WSGI server hosted in a driver thread.

:class:`PSServer` serves the Flask app with werkzeug's ``BaseWSGIServer`` plus
two changes measured to matter (docs/parameter_server.md):

* a **bounded thread pool** (werkzeug's threaded server spawns one thread per
  connection without limit); connections beyond the pool wait in the queue;
* a **keep-alive request handler** that writes response buffers with
  ``sendall`` as they are (werkzeug's handler closes every connection, accepts
  only ``bytes`` chunks, so the center would be joined into one copy, and
  lingers up to 10 ms after each response).

Lifecycle: port 0 binds a free port (``.port``, ``.url``); :meth:`~PSServer.start`
returns once an authenticated ``/health`` answers (polled, never a fixed
sleep); a second start is refused; :meth:`~PSServer.stop` is idempotent, wakes
blocked requests, shuts down, joins every thread and closes every socket.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from flask import Flask
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler

from elephant.errors import ConfigError, PSError
from elephant.ps.app import BUFFERS_OK, EXTENSION

logger = logging.getLogger(__name__)

__all__ = ["PSServer", "default_threads"]


def default_threads(num_workers: int | None) -> int:
    """Handler threads for ``num_workers`` workers: ``max(8, num_workers + 4)``.

    Synchronous commits hold a thread until their round closes, so every
    worker needs one, plus headroom for retries, the driver and health checks.
    """
    return max(8, (num_workers or 0) + 4)


class _Input:
    """``wsgi.input`` wrapper counting consumed bytes (decides keep-alive)."""

    def __init__(self, raw: Any):
        self._raw = raw
        self.consumed = 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.consumed += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        n = self._raw.readinto(buffer) or 0
        self.consumed += n
        return n

    def readline(self, size: int = -1) -> bytes:
        data = self._raw.readline(size)
        self.consumed += len(data)
        return data


class _Handler(WSGIRequestHandler):
    """HTTP/1.1 keep-alive handler that sends response buffers without copying them."""

    protocol_version = "HTTP/1.1"
    timeout = 60.0  # idle keep-alive / slow-socket timeout; set per server

    def setup(self) -> None:
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().setup()

    def log(self, type: str, message: str, *args: Any) -> None:
        logger.debug("%s - %s", self.address_string(), message % args)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # per-request logging costs more than a small round trip

    def run_wsgi(self) -> None:
        if self.headers.get("Expect", "").lower().strip() == "100-continue":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        environ = self.make_environ()
        body = _Input(environ["wsgi.input"])
        environ["wsgi.input"] = body
        environ[BUFFERS_OK] = True
        response: dict[str, Any] = {}
        chunks: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None):
            if exc_info and response.get("sent"):
                raise exc_info[1].with_traceback(exc_info[2])
            response.update(status=status, headers=headers)
            return chunks.append  # the legacy write() callable

        result = self.server.app(environ, start_response)
        try:
            chunks.extend(chunk for chunk in result if len(chunk))
        finally:
            if hasattr(result, "close"):
                result.close()
        lines = [f"HTTP/1.1 {response['status']}"]
        names = set()
        for name, value in response["headers"]:
            lines.append(f"{name}: {value}")
            names.add(name.lower())
            if name.lower() == "connection" and value.lower() == "close":
                self.close_connection = True
        if "content-length" not in names:
            lines.append(f"Content-Length: {sum(memoryview(c).nbytes for c in chunks)}")
        response["sent"] = True
        self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        for chunk in chunks:  # memoryviews of the center arrays go to sendall as they are
            self.wfile.write(chunk)
        length = environ.get("CONTENT_LENGTH")
        if environ.get("wsgi.input_terminated") or (length and body.consumed != int(length)):
            self.close_connection = True  # unread or chunked body: the stream position is unknown


class _PooledWSGIServer(BaseWSGIServer):
    """``BaseWSGIServer`` handing each connection to a bounded thread pool."""

    multithread = True

    def __init__(self, host: str, port: int, app: Flask, handler: type, threads: int, fd: int):
        super().__init__(host, port, app, handler=handler, fd=fd)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="elephant-ps-handler")
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self.accepted = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
            self.accepted += 1
        try:
            self._pool.submit(self._serve_connection, request, client_address)
        except RuntimeError:  # the pool is shutting down
            self._forget(request)

    def _serve_connection(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            logger.exception("parameter server connection from %s failed", client_address)
        finally:
            self._forget(request)

    def _forget(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.exception("parameter server error on a connection from %s", client_address)

    def close_all(self) -> None:
        """Shut down open connections, wait for the handler threads, close the sockets."""
        with self._connections_lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # wakes a handler blocked reading the socket
            except OSError:
                pass
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._connections_lock:
            leftover, self._connections = list(self._connections), set()
        for conn in leftover:  # queued connections whose future was cancelled
            self.shutdown_request(conn)
        self.server_close()


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
        idle_timeout: seconds an idle keep-alive connection (or a stalled
            socket) holds a handler thread. Default 60.
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
        self._ready_timeout = ready_timeout
        self._server: _PooledWSGIServer | None = None
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

    @property
    def connections_accepted(self) -> int:
        """TCP connections accepted so far (keep-alive clients reuse theirs)."""
        return self._server.accepted if self._server is not None else 0

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
            sock = _bind(self._host, self._requested_port)
            try:
                handler = type("_PSHandler", (_Handler,), {"timeout": self._idle_timeout})
                self._server = _PooledWSGIServer(self._host, 0, self._app, handler, self._threads, sock.fileno())
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
