"""The parameter server's HTTP layer: a bounded pool of keep-alive handlers behind the gate.

werkzeug's ``BaseWSGIServer`` accepts the connections; two changes to it were
measured to matter (docs/parameter_server.md):

* a **bounded thread pool** (:class:`PooledWSGIServer`; werkzeug's threaded
  server spawns one thread per connection without limit) that serves whole
  requests: a connection reaches it only once the gate
  (:mod:`elephant.ps.gate`) has read an authorized request head, and goes
  back to the gate when it falls idle. After a response, a handler thread
  lingers a few milliseconds for the same client's next request (a worker's
  pull then commit) before it hands the connection back;
* a **keep-alive request handler** (:class:`BufferedHandler`) that writes
  response buffers with ``sendall`` as they are (werkzeug's handler closes
  every connection, accepts only ``bytes`` chunks, so the center would be
  joined into one copy, and lingers up to 10 ms after each response), and
  reads the body from the socket after the head the gate read. A plain head
  (three-word request line, HTTP/1.0 or 1.1, one ``name: value`` per line)
  is parsed here in one pass (:func:`parse_plain_head`, about 0.006 ms)
  instead of through the ``email`` package (about 0.034 ms, a twentieth of a
  small commit's server CPU); anything else goes to ``http.server``'s own parser.

Open connections are capped (``max_connections``; beyond it a new one is
closed at once) and counted for the server's ``connections_*`` figures.
Starting, readiness and stopping are :mod:`elephant.ps.server`.
"""

from __future__ import annotations

import io
import logging
import re
import select
import socket
import socketserver
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from flask import Flask
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler

from elephant.ps.app import BUFFERS_OK
from elephant.ps.gate import HEAD_END, Gate, parse_head

logger = logging.getLogger(__name__)

__all__ = ["BufferedHandler", "Fields", "PooledWSGIServer", "parse_plain_head"]

#: Most header lines a request may have (``http.client``'s own limit).
MAX_FIELDS = 100
_VERSIONS = ("HTTP/1.1", "HTTP/1.0")
#: A field name (RFC 9110's token).
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class Fields:
    """A request's header fields, parsed once: what ``http.server`` and werkzeug ask of ``handler.headers``.

    Names keep their case; lookups ignore it and return the first match, as
    ``email.message.Message`` does.
    """

    __slots__ = ("_fields",)

    def __init__(self, fields: list[tuple[str, str]]):
        self._fields = fields

    def items(self) -> list[tuple[str, str]]:
        return list(self._fields)

    def keys(self) -> list[str]:
        return [name for name, _ in self._fields]

    def values(self) -> list[str]:
        return [value for _, value in self._fields]

    def get(self, name: str, default: Any = None) -> Any:
        name = name.lower()
        for key, value in self._fields:
            if key.lower() == name:
                return value
        return default

    def get_all(self, name: str, default: Any = None) -> Any:
        name = name.lower()
        found = [value for key, value in self._fields if key.lower() == name]
        return found or default

    def __getitem__(self, name: str) -> str | None:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._fields)


def parse_plain_head(head: bytes) -> tuple[str, str, str, Fields] | None:
    """``(method, target, version, fields)`` of a plain request head; None for any other.

    Plain: a request line of three words and version HTTP/1.1 or HTTP/1.0,
    then at most :data:`MAX_FIELDS` lines of ``name: value`` whose name is a
    token (RFC 9110) and no folded continuation line. Values lose the
    whitespace around them. What is not plain (HTTP/0.9 and 2, folding,
    odd names) is left to ``http.server``'s parser and its error replies.
    """
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    words = lines[0].split(b" ")
    if len(words) != 3 or len(lines) > MAX_FIELDS + 1:
        return None
    method, target, version = (word.decode("latin-1") for word in words)
    if version not in _VERSIONS or not method.isalpha() or not target:
        return None
    fields = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            return None
        fields.append((name.decode("ascii"), value.strip(b" \t").decode("latin-1")))
    return method, target, version, Fields(fields)


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


class BufferedHandler(_Handler):
    """Serves one request whose head the gate read; the body is read here, from the socket."""

    def __init__(self, request: Any, client_address: Any, server: Any, head: bytes, prefix: bytes):
        self._head, self._prefix = head, prefix
        super().__init__(request, client_address, server)

    def setup(self) -> None:
        self.connection = self.request
        self.connection.settimeout(self.timeout)  # bounds a slow body, and a write to a peer that stopped reading
        self.rfile = _RequestFile(self._head, self._prefix, self.connection)
        self.wfile = socketserver._SocketWriter(self.connection)

    def parse_request(self) -> bool:
        """Parse the head the gate read: a plain one here in one pass, any other by ``http.server``."""
        plain = parse_plain_head(self._head)
        if plain is None:
            return super().parse_request()
        self.command, path, self.request_version, self.headers = plain
        self.requestline = f"{self.command} {path} {self.request_version}"
        self.path = "/" + path.lstrip("/") if path.startswith("//") else path  # as http.server: no open redirect
        connection = self.headers.get("Connection", "").lower()
        if self.request_version == "HTTP/1.1":
            self.close_connection = connection == "close"
        else:
            self.close_connection = connection != "keep-alive"
        if self.request_version == "HTTP/1.1" and self.headers.get("Expect", "").lower() == "100-continue":
            return self.handle_expect_100()
        return True

    def handle(self) -> None:
        self.close_connection = True  # kept open only if the request allows it (HTTP/1.1 keep-alive)
        try:
            self.handle_one_request()
        except (ConnectionError, socket.timeout) as exc:
            self.close_connection = True
            self.connection_dropped(exc)


class PooledWSGIServer(BaseWSGIServer):
    """``BaseWSGIServer`` whose gate waits for request heads and whose bounded pool serves the requests."""

    multithread = True

    def __init__(self, host: str, port: int, app: Flask, handler: type, threads: int, fd: int, *,
                 authorization: bytes, header_timeout: float = 10.0, idle_timeout: float = 60.0,
                 max_connections: int = 1024, linger: float = 0.02):
        super().__init__(host, port, app, handler=handler, fd=fd)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="elephant-ps-handler")
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._serving = 0  # handler threads inside _serve, counted under _served
        self._served = threading.Condition()
        self._max_connections, self._linger, self._authorization = max_connections, linger, authorization
        self.accepted = 0
        self.refused = 0
        self._gate = Gate(self, authorization, header_timeout, idle_timeout)

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
            self._pool.submit(self._counted_serve, sock, address, head, prefix)
        except RuntimeError:  # the pool is shutting down
            self.drop(sock)

    def _counted_serve(self, *args: Any) -> None:
        with self._served:
            self._serving += 1
        try:
            self._serve(*args)
        finally:
            with self._served:
                self._serving -= 1
                self._served.notify_all()

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
        while HEAD_END not in buffered:
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

    #: How long :meth:`close_all` lets handlers finish the replies they are writing (a commit the store's close
    #: released answers 503) before it cuts their connections too.
    DRAIN_S = 2.0

    def close_all(self) -> None:
        """Stop the gate, shut down open connections, wait for the handler threads, close the sockets.

        Reading ends first, which wakes every handler blocked on its socket while one writing a reply can still
        finish it; what is still served after :data:`DRAIN_S` (a peer that stopped reading) is cut both ways.
        """
        self._gate.stop()
        with self._connections_lock:
            connections = list(self._connections)
        for conn in connections:
            _shutdown(conn, socket.SHUT_RD)
        with self._served:
            self._served.wait_for(lambda: self._serving == 0, timeout=self.DRAIN_S)
        with self._connections_lock:
            connections = list(self._connections)
        for conn in connections:
            _shutdown(conn, socket.SHUT_RDWR)
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._connections_lock:
            leftover, self._connections = list(self._connections), set()
        for conn in leftover:  # queued connections whose future was cancelled
            self.shutdown_request(conn)
        self.server_close()


def _shutdown(conn: socket.socket, how: int) -> None:
    try:
        conn.shutdown(how)
    except OSError:
        pass
