"""The parameter server's gate: request heads are read whole before a handler thread is spent.

One selector thread (:class:`Gate`) watches every open connection of the
server until a whole request head has arrived, and judges it with
:func:`parse_head` before any handler thread or body buffer is spent on it:

* a head over ``MAX_HEAD`` bytes (431), a bad ``Content-Length`` (400) or a
  chunked body (411: the app needs a length) is refused here with
  :func:`refuse`, in the app's JSON error shape, and the connection closed;
* a request without the run's bearer token is refused here too (401), its
  body never read;
* an authorized head is handed to the server's pool (``dispatch``) with the
  bytes that came after it, and the connection comes back to the gate once
  the response is sent and it falls idle.

So an idle keep-alive connection, a slow or half-sent request, a request
without the token or a flood of idle connections costs a socket, never a
handler thread. A new connection must send its head within
``header_timeout`` (each chunk restarts that clock), a kept-alive one within
``idle_timeout``; then it is closed. The pool and the handler are
:mod:`elephant.ps.http`; the server's lifecycle is :mod:`elephant.ps.server`.
"""

from __future__ import annotations

import hmac
import json
import queue
import selectors
import socket
import threading
import time
from typing import Any, NamedTuple, Protocol

__all__ = ["Connections", "Gate", "Head", "HEAD_END", "MAX_HEAD", "parse_head", "refuse"]

#: The end of a request head.
HEAD_END = b"\r\n\r\n"


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
    end = buffer.find(HEAD_END, 0, max_head + 4)
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


class Connections(Protocol):
    """What the gate needs of the server that owns the connections."""

    def dispatch(self, sock: socket.socket, address: Any, head: bytes, prefix: bytes) -> None:
        """Serve the request whose ``head`` was read, ``prefix`` being the bytes received after it."""

    def drop(self, sock: socket.socket) -> None:
        """Close the connection and forget it."""


class Gate:
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

    def __init__(self, server: Connections, authorization: bytes, header_timeout: float,
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

