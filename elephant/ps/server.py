"""Lifecycle of the parameter server: a WSGI server hosted in a driver thread.

:class:`PSServer` serves the Flask app with werkzeug's ``BaseWSGIServer`` plus
three changes measured to matter (docs/parameter_server.md):

* a **gate** (:class:`_Gate`): one selector thread reads each request whole,
  head and body, before a handler thread sees it, and takes the connection
  back once the response is sent. An idle keep-alive connection, a slow or
  half-sent request, or a flood of idle connections costs a socket, never a
  handler thread; a request must start within ``header_timeout`` and keep
  its bytes coming, and the number of open connections is capped;
* a **bounded thread pool** (werkzeug's threaded server spawns one thread per
  connection without limit) that serves whole requests;
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

import ctypes
import hmac
import http.client
import io
import json
import logging
import os
import queue
import select
import selectors
import socket
import socketserver
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

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
    timeout = 60.0  # slow-body / slow-reader timeout; set per server (TCP_NODELAY is set at accept)

    def log(self, type: str, message: str, *args: Any) -> None:
        logger.debug("%s - %s", self.address_string(), message % args)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # per-request logging costs more than a small round trip

    def run_wsgi(self) -> None:
        # "Expect: 100-continue" was answered by http.server's parse_request (handle_expect_100)
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


class _RequestFile:
    """A request's ``rfile``: the head the gate read, then the body (bytes already read, then the socket)."""

    def __init__(self, head: bytes, prefix: bytes, sock: socket.socket):
        self._head = io.BytesIO(head)
        self._prefix = memoryview(prefix)
        self._sock = sock

    def readline(self, size: int = -1) -> bytes:
        return self._head.readline(size)  # the head only: the body is read by size

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        if self._prefix.nbytes:
            n = min(self._prefix.nbytes, target.nbytes)
            target[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        return self._sock.recv_into(target)

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            raise io.UnsupportedOperation("a request body is read by size")
        buffer = bytearray(size)
        n = self.readinto(buffer)
        return bytes(buffer[:n])

    def unread(self) -> bytes:
        """Bytes received with the request but not read by it: the start of a pipelined next request."""
        return bytes(self._prefix)

    def close(self) -> None:
        self._head.close()


class _BufferedHandler(_Handler):
    """Serves one request whose head the gate read; the body is read here, from the socket."""

    def __init__(self, request: Any, client_address: Any, server: Any, head: bytes, prefix: bytes):
        self._head, self._prefix = head, prefix
        super().__init__(request, client_address, server)

    def setup(self) -> None:
        self.connection = self.request
        self.connection.settimeout(self.timeout)  # bounds a slow body, and a write to a peer that stopped reading
        self.rfile = _RequestFile(self._head, self._prefix, self.connection)
        self.wfile = socketserver._SocketWriter(self.connection)

    def handle(self) -> None:
        self.close_connection = True  # kept open only if the request allows it (HTTP/1.1 keep-alive)
        try:
            self.handle_one_request()
        except (ConnectionError, socket.timeout) as exc:
            self.close_connection = True
            self.connection_dropped(exc)


_HEAD_END = b"\r\n\r\n"


class Head(NamedTuple):
    """What the gate makes of a request head."""

    status: int  # 0: serve it; else the status to refuse it with
    head: bytes = b""
    length: int = 0  # Content-Length


#: Largest request head accepted (431 beyond).
MAX_HEAD = 65536


def parse_head(buffer: bytes | bytearray, authorization: bytes, max_head: int = MAX_HEAD) -> Head | None:
    """The request head at the start of ``buffer``: None while incomplete, else what to do with it.

    Refused here, before any handler thread or body buffer is spent on them:
    a head over ``max_head`` (431), a bad Content-Length (400), a chunked body
    (411: the app needs a Content-Length) and a request without the run's
    bearer token (401; its body is never read).
    """
    end = buffer.find(_HEAD_END, 0, max_head + 4)
    if end < 0:
        return Head(431) if len(buffer) > max_head else None
    head = bytes(buffer[: end + 4])
    length, authorized = 0, False
    for line in head[:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip()
        if name == b"content-length":
            if not value.isdigit():
                return Head(400)
            length = int(value)
        elif name == b"transfer-encoding":
            return Head(411)
        elif name == b"authorization":
            authorized = hmac.compare_digest(value, authorization)
    return Head(0, head, length) if authorized else Head(401)


_REASONS = {400: "Bad Request", 401: "Unauthorized", 411: "Length Required", 431: "Request Header Fields Too Large"}


class _Gate:
    """Watches the server's connections with one selector thread until a request head arrives.

    A connection reaches the handler pool only with a whole, authorized
    request head (see :func:`parse_head`), and comes back here when it falls
    idle after a response. So an idle keep-alive connection, a slow or
    half-sent head, a request without the token, or a flood of connections
    costs a socket here, never a handler thread. Deadlines: a new connection
    must send its head within ``header_timeout`` (each chunk of it restarts
    that clock, up to ``max_head`` bytes), an idle kept-alive one within
    ``idle_timeout``; then it is closed. A connection closed by its peer is
    dropped at once, so nothing spins.
    """

    def __init__(self, server: _PooledWSGIServer, authorization: bytes, header_timeout: float,
                 idle_timeout: float, max_head: int = MAX_HEAD):
        self._server, self._authorization = server, authorization
        self._header_timeout, self._idle_timeout, self._max_head = header_timeout, idle_timeout, max_head
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._incoming: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: dict[socket.socket, tuple[Any, bytearray, float]] = {}  # address, bytes so far, deadline
        self._stopping = False
        self.expired = 0
        self.unauthorized = 0
        self._thread = threading.Thread(target=self._run, name="elephant-ps-gate", daemon=True)
        self._thread.start()

    def add(self, sock: socket.socket, address: Any, buffered: bytes = b"", idle: bool = False) -> None:
        """Watch ``sock`` for its next request (any thread)."""
        self._incoming.put((sock, address, buffered, idle))
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass  # the wake-up pipe is full (the gate is waking anyway) or closed (stopping)

    def stop(self) -> None:
        self._stopping = True
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass
        self._thread.join()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _run(self) -> None:
        while not self._stopping:
            try:
                events = self._selector.select(timeout=0.25)
            except OSError:  # a socket closed under the selector by close_all
                events = []
            for key, _ in events:
                if key.fileobj is self._wake_r:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except OSError:
                        pass
                else:
                    self._read(key.fileobj)
            self._admit()
            self._expire()

    def _admit(self) -> None:
        now = time.monotonic()
        while True:
            try:
                sock, address, buffered, idle = self._incoming.get_nowait()
            except queue.Empty:
                return
            if self._stopping:
                self._server.drop(sock)
                continue
            try:
                sock.setblocking(False)
                self._selector.register(sock, selectors.EVENT_READ)
            except (OSError, ValueError):  # closed meanwhile
                self._server.drop(sock)
                continue
            self._pending[sock] = (address, bytearray(buffered),
                                   now + (self._idle_timeout if idle and not buffered else self._header_timeout))
            if buffered:  # a pipelined request may already be here
                self._check(sock)

    def _read(self, sock: socket.socket) -> None:
        if sock not in self._pending:
            return
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # closed by the peer (or reset): forget it, never poll it again
            self._release(sock)
            self._server.drop(sock)
            return
        address, buffer, _ = self._pending[sock]
        buffer += data
        self._pending[sock] = (address, buffer, time.monotonic() + self._header_timeout)
        self._check(sock)

    def _check(self, sock: socket.socket) -> None:
        address, buffer, _ = self._pending[sock]
        verdict = parse_head(buffer, self._authorization, self._max_head)
        if verdict is None:
            return
        self._release(sock)
        if verdict.status:
            self.unauthorized += verdict.status == 401
            refuse(sock, verdict.status)
            self._server.drop(sock)
            return
        self._server.dispatch(sock, address, verdict.head, bytes(buffer[len(verdict.head):]))

    def _release(self, sock: socket.socket) -> None:
        self._pending.pop(sock, None)
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError, OSError):
            pass

    def _expire(self) -> None:
        now = time.monotonic()
        for sock in [s for s, (_, _, deadline) in self._pending.items() if deadline <= now]:
            self.expired += 1
            self._release(sock)
            self._server.drop(sock)


def refuse(sock: socket.socket, status: int) -> None:
    """Answer ``status`` with a JSON reason, as the app does, and say the connection closes."""
    reason = _REASONS[status]
    message = "missing or wrong bearer token" if status == 401 else reason.lower()
    body = json.dumps({"error": message, "type": reason.replace(" ", "")}).encode()
    try:
        sock.setblocking(True)
        sock.settimeout(1.0)
        sock.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
                     f"\r\nConnection: close\r\n\r\n".encode() + body)
    except OSError:
        pass


class _PooledWSGIServer(BaseWSGIServer):
    """``BaseWSGIServer`` whose gate waits for request heads and whose bounded pool serves the requests."""

    multithread = True

    def __init__(self, host: str, port: int, app: Flask, handler: type, threads: int, fd: int, *,
                 authorization: bytes, header_timeout: float = 10.0, idle_timeout: float = 60.0,
                 max_connections: int = 1024, linger: float = 0.02):
        super().__init__(host, port, app, handler=handler, fd=fd)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="elephant-ps-handler")
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._max_connections, self._linger, self._authorization = max_connections, linger, authorization
        self.accepted = 0
        self.refused = 0
        self._gate = _Gate(self, authorization, header_timeout, idle_timeout)

    @property
    def open_connections(self) -> int:
        with self._connections_lock:
            return len(self._connections)

    @property
    def expired(self) -> int:
        return self._gate.expired

    @property
    def unauthorized(self) -> int:
        return self._gate.unauthorized

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            full = len(self._connections) >= self._max_connections
            if not full:
                self._connections.add(request)
                self.accepted += 1
            else:
                self.refused += 1
        if full:  # refused at once: a flood cannot queue up behind the cap
            self.shutdown_request(request)
            return
        try:  # small replies must not wait for the peer's delayed ACK (Nagle): 40 ms each on Linux
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        self._gate.add(request, client_address)

    def dispatch(self, sock: socket.socket, address: Any, head: bytes, prefix: bytes) -> None:
        """Serve an authorized request from the pool (called by the gate)."""
        try:
            self._pool.submit(self._serve, sock, address, head, prefix)
        except RuntimeError:  # the pool is shutting down
            self.drop(sock)

    def _serve(self, sock: socket.socket, address: Any, head: bytes, prefix: bytes) -> None:
        """Serve requests on ``sock`` while they come back to back, then give it back to the gate.

        After a response the thread lingers ``linger`` seconds for the same
        client's next request (a worker's pull then commit, or a short window),
        which skips a round through the gate; a connection that stays quiet, or
        sends less than a whole authorized head, goes back to the gate.
        """
        while True:
            try:
                sock.setblocking(True)
                handler = self.RequestHandlerClass(sock, address, self, head, prefix)
            except Exception:
                logger.exception("parameter server connection from %s failed", address)
                self.drop(sock)
                return
            if handler.close_connection:
                self.drop(sock)
                return
            buffered = self._linger_for_head(sock, handler.rfile.unread())
            if buffered is None:
                return  # closed
            verdict = parse_head(buffered, self._authorization) if buffered else None
            if verdict is None or verdict.status:
                self._gate.add(sock, address, bytes(buffered), idle=True)  # the gate decides, refuses or waits
                return
            head, prefix = verdict.head, bytes(buffered[len(verdict.head):])

    def _linger_for_head(self, sock: socket.socket, unread: bytes) -> bytearray | None:
        """``unread`` and the bytes of the next request that arrive within ``linger`` (empty: none came);
        None if the peer closed."""
        buffered = bytearray(unread)
        deadline = time.monotonic() + self._linger
        while _HEAD_END not in buffered:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                readable, _, _ = select.select([sock], [], [], remaining)
                if not readable:
                    break
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                self.drop(sock)
                return None
            buffered += data
        return buffered

    def drop(self, request: Any) -> None:
        """Close a connection and forget it."""
        with self._connections_lock:
            self._connections.discard(request)
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.exception("parameter server error on a connection from %s", client_address)

    def close_all(self) -> None:
        """Stop the gate, shut down open connections, wait for the handler threads, close the sockets."""
        self._gate.stop()
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


#: Allocations from this size on get their own memory map (see :func:`map_large_allocations`).
MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def map_large_allocations(threshold: int = MMAP_THRESHOLD) -> bool:
    """Have glibc serve allocations of ``threshold`` bytes and more with their own memory maps.

    Each handler thread reads whole commits into fresh buffers. glibc starts by
    mapping such large blocks on their own, but after the first one is freed it
    raises its threshold (up to 32 MiB), and later blocks come from the arena of
    the thread that asked; freed, they stay resident there. A server of ``P``
    partitions then keeps about ``P`` models resident after one round, although
    it holds only about one at a time (``benchmarks/sync_memory.py``: 16 MB
    model, 16 partitions, a peak of 545 MB above the idle server against 85 MB
    with a fixed threshold).
    A fixed threshold returns each large block to the system when it is freed.
    It is set by a server whose store streams synchronous rounds, and stays set
    for the process: it costs the asynchronous server about a fifth of its
    commits per second at 1 MB (``benchmarks/ps_roundtrip.py``, 4-32 clients),
    which is why only synchronous rounds ask for it.

    Leaves the allocator alone where it is not glibc, or where the user set
    ``MALLOC_MMAP_THRESHOLD_`` (glibc's own variable) for this process.

    Returns:
        Whether the threshold was set.
    """
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (macOS, Windows, musl without mallopt)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, int(threshold)))


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
    def connections_open(self) -> int:
        """Connections open now (idle ones included: they wait in the gate, not in a thread)."""
        return self._server.open_connections if self._server is not None else 0

    @property
    def connections_refused(self) -> int:
        """Connections closed at once because ``max_connections`` were open."""
        return self._server.refused if self._server is not None else 0

    @property
    def connections_expired(self) -> int:
        """Connections closed for sending nothing, or too slowly, within their deadline."""
        return self._server.expired if self._server is not None else 0

    @property
    def connections_unauthorized(self) -> int:
        """Requests refused by the gate for a missing or wrong token (their bodies never read)."""
        return self._server.unauthorized if self._server is not None else 0

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
                handler = type("_PSHandler", (_BufferedHandler,), {"timeout": self._idle_timeout})
                self._server = _PooledWSGIServer(
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
