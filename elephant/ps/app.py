"""Flask app factory of the parameter server: thin routes over a :class:`~elephant.ps.store.Store`.

Routes (every one, ``/health`` included, needs ``Authorization: Bearer <token>``):

==========================  ==================================================
``GET /health``             JSON ``{"status": "ok", "run": ..., "clock": ...}``
``GET /weights?worker=k``   binary reply (center + clock); ``&epoch=e`` for SSP
``POST /commit``            binary commit in, binary reply (new center) out
``POST /finish``            JSON ``{"run", "epoch", "partition", "attempt"}``, and ``"stats"``
                            where the app has a course (the task's report)
``GET /course?epoch=e``     JSON: the epoch the course has open, once it is ``e`` or
                            later; ``{"closed": true}`` (also for a task of an earlier
                            job, ``&job=j``); or ``{"wait": true}`` (ask again)
``GET /metrics``            JSON counters and staleness histogram
==========================  ==================================================

The two course routes exist where :func:`create_app` is given a
:class:`~elephant.ps.course.Course`: a fit whose epochs run as one Spark job
(:mod:`elephant.fit.resident`).

Errors are JSON ``{"error": reason, "type": exception class}``: 401 missing or
wrong token, 411 no Content-Length on a body, 413 body over the limit (refused
before it is read), 400 malformed payload (the center is untouched), 409
superseded task attempt, 504 round or SSP admission timeout, 503 the store is
closing, 500 a server-rule failure. The app does no math and never runs in
debug mode.

The two binary routes carry every byte of a fit and are answered straight
from the WSGI environ (:class:`BinaryRoutes`, wrapped around Flask's
``wsgi_app``), with the same checks and error replies: for a small model,
Flask's request context, URL map and response object cost more server CPU
than the store's work. Every other request is Flask's.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl

import numpy as np
from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from elephant import weights as W
from elephant.errors import (
    ConfigError,
    DataError,
    PSError,
    ProtocolError,
    RoundTimeoutError,
    StaleAttemptError,
    StoreClosedError,
)
from elephant.ps import wire
from elephant.ps.course import WAIT_S, Course
from elephant.ps.encoding import Encoded
from elephant.ps.store import Store

logger = logging.getLogger(__name__)

__all__ = ["BinaryRoutes", "create_app", "max_body_bytes", "DEFAULT_MAX_BODY_BYTES", "EXTENSION", "BUFFERS_OK"]

#: Default request-body limit: 1 GiB.
DEFAULT_MAX_BODY_BYTES = 1 << 30
#: Key of the app's entry in ``app.extensions`` (the server reads token and store there).
EXTENSION = "elephant_ps"
#: Commit bodies read and summed at a time when the store streams synchronous rounds.
STREAMED_INTAKE = 2
#: WSGI environ key set by a server that accepts memoryviews in the response iterable.
BUFFERS_OK = "elephant.buffers_ok"

_BINARY = "application/octet-stream"


#: Status of each failure a route can raise, most specific first (the first match wins).
STATUSES: tuple[tuple[type[BaseException], int], ...] = (
    (ProtocolError, 400), (DataError, 400), (StaleAttemptError, 409), (RoundTimeoutError, 504),
    (StoreClosedError, 503), (PSError, 500))


def failure(exc: BaseException, method: str, path: str) -> tuple[int, str, str]:
    """``(status, message, type)`` of the JSON error reply to ``exc``, logged as the app logs it.

    A refusal (:data:`STATUSES`) keeps its message and class name; 400s are
    logged at INFO. Anything else is a server bug: 500, logged with its
    traceback, type ``InternalServerError``.
    """
    status = next((status for kind, status in STATUSES if isinstance(exc, kind)), None)
    if status is None:
        logger.exception("parameter server failed on %s %s", method, path)
        return 500, f"{type(exc).__name__}: {exc}", "InternalServerError"
    if status == 400:
        logger.info("rejected %s %s: %s", method, path, exc)
    return status, str(exc), type(exc).__name__


def refusal(authorization: str, expected: bytes, method: str, length: int | None,
            limit: int) -> tuple[int, str, str] | None:
    """``(status, message, type)`` of a request refused before its body is read, else None.

    A missing or wrong token (compared in constant time) is 401, a body over
    ``limit`` bytes 413, a POST without a Content-Length 411.
    """
    if not hmac.compare_digest(authorization.encode("latin-1"), expected):
        return 401, "missing or wrong bearer token", "Unauthorized"
    if length is not None and length > limit:
        return 413, f"request body of {length} bytes exceeds the limit of {limit} bytes", "TooLarge"
    if method == "POST" and length is None:
        return 411, "a request body needs a Content-Length header", "LengthRequired"
    return None


def _error(status: int, message: str, kind: str) -> Response:
    response = jsonify(error=message, type=kind)
    response.status_code = status
    if request.content_length:
        response.headers["Connection"] = "close"  # the body may be unread: do not reuse the connection
    if status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


def read_body(stream: Any, size: int) -> np.ndarray:
    """Read exactly ``size`` bytes of ``stream`` into a fresh buffer (no intermediate copies)."""
    buf = np.empty(size, dtype=np.uint8)  # np.empty: no zero-fill before the socket writes it
    view = memoryview(buf)
    position = 0
    while position < size:
        n = stream.readinto(view[position:])
        if not n:
            raise ProtocolError(f"request body truncated: received {position} of {size} bytes")
        position += n
    return buf


def int_param(args: dict[str, str], name: str, default: Any = ...) -> Any:
    """Query parameter ``name`` of ``args`` as an int >= 0 (``default`` when absent; required without one)."""
    raw = args.get(name)
    if raw is None:
        if default is ...:
            raise ProtocolError(f"query parameter {name!r} is required")
        return default
    if not (raw.isascii() and raw.isdigit()):
        raise ProtocolError(f"query parameter {name!r} must be an int >= 0; received {raw!r}")
    return int(raw)


def _content_length(environ: dict[str, Any]) -> int | None:
    """The body's length as werkzeug reads it: None when chunked, absent or malformed."""
    if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        return None
    raw = environ.get("CONTENT_LENGTH", "")
    return int(raw) if raw.isascii() and raw.isdigit() else None


class BinaryRoutes:
    """WSGI middleware: ``POST /commit`` and ``GET /weights`` from the environ, any other request to Flask.

    A small commit spent more of its server CPU in Flask's request context,
    URL map and response object than in the store (docs/parameter_server.md,
    "Performance", has the split). These two routes keep the
    app's checks (:func:`refusal` before the body is read) and its error
    replies (:data:`STATUSES`, the JSON shape, ``Connection: close`` where
    the body may be unread); another method on their paths is 405.
    """

    def __init__(self, wsgi_app: Callable, store: Store, expected: bytes, limit: int):
        self._flask, self._store, self._expected, self._limit = wsgi_app, store, expected, limit
        # Streamed synchronous rounds keep no commit, so the bodies being read and summed
        # are what the server holds: admit a few at a time, whatever the partition count.
        self._intake = threading.BoundedSemaphore(STREAMED_INTAKE) if store.streams_rounds \
            else contextlib.nullcontext()
        self._routes = {"/commit": ("POST", self._commit), "/weights": ("GET", self._weights)}

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[Any]:
        route = self._routes.get(environ.get("PATH_INFO", ""))
        if route is None:
            return self._flask(environ, start_response)
        method, serve = route
        length = _content_length(environ)
        refused = refusal(environ.get("HTTP_AUTHORIZATION", ""), self._expected, environ.get("REQUEST_METHOD", ""),
                          length, self._limit)
        if refused is None and environ.get("REQUEST_METHOD") != method:
            refused = 405, f"{environ.get('PATH_INFO')} takes {method} only", "MethodNotAllowed"
        if refused is not None:
            return self._reply_error(environ, start_response, *refused)
        try:
            encoded, received = serve(environ, length)
        except Exception as exc:  # every failure gets the app's JSON error
            return self._reply_error(environ, start_response, *failure(exc, method, environ["PATH_INFO"]))
        self._store.count_bytes(received, encoded.nbytes)
        start_response("200 OK", [("Content-Type", _BINARY), ("Content-Length", str(encoded.nbytes))])
        # PEP 3333 wants bytes; PSServer's handler takes the buffers as they are (no join).
        return encoded if environ.get(BUFFERS_OK) else [encoded.tobytes()]

    def _commit(self, environ: dict[str, Any], length: int) -> tuple[Encoded, int]:
        store = self._store
        with self._intake:
            body = read_body(environ["wsgi.input"], length)
            key, attempt, payload = wire.decode_commit(body, store.commit_template)
            del body  # the payload's arrays may view it: both go once the store has summed them
            wait = store.submit(key, attempt, payload, check_finite=False)  # decode checked finiteness
            base_clock = payload.base_clock
            del payload
        reply = wait()
        # A round's encoded change goes to a worker whose window started from the view it applies to.
        changed = reply.change is not None and reply.change.base_clock == base_clock
        return wire.encode_reply(reply, changed), length

    def _weights(self, environ: dict[str, Any], length: int | None) -> tuple[Encoded, int]:
        args: dict[str, str] = {}
        for name, value in parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True):
            args.setdefault(name, value)  # the first of a repeated parameter, as Flask's request.args
        reply = self._store.pull(int_param(args, "worker"), int_param(args, "epoch", None))
        return wire.encode_reply(reply), 0

    @staticmethod
    def _reply_error(environ: dict[str, Any], start_response: Callable, status: int, message: str,
                     kind: str) -> list[bytes]:
        body = json.dumps({"error": message, "type": kind}).encode() + b"\n"
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        if _content_length(environ):
            headers.append(("Connection", "close"))  # the body may be unread: do not reuse the connection
        if status == 401:
            headers.append(("WWW-Authenticate", "Bearer"))
        elif status == 405:
            headers.append(("Allow", "POST" if environ.get("PATH_INFO") == "/commit" else "GET"))
        start_response(f"{status} {HTTPStatus(status).phrase}", headers)
        return [body]


def max_body_bytes(template) -> int:
    """The request-body limit of a fit's server: four models (the largest commit) and a MiB of headroom."""
    return 4 * W.nbytes(template) + (1 << 20)


def create_app(store: Store, token: str, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               course: Course | None = None) -> Flask:
    """Build the parameter server's Flask app.

    Args:
        store: the state the routes read and update.
        token: the run's bearer token (e.g. ``secrets.token_urlsafe(32)``).
        max_body_bytes: largest request body accepted; larger ones get 413
            before they are read. Default 1 GiB.
        course: the epochs of a fit run as one Spark job, and their reports
            (default None: no ``/course`` route, and a finish carries no stats).

    Raises:
        ConfigError: empty token or a non-positive limit.
    """
    if not isinstance(token, str) or not token or not token.isascii():
        raise ConfigError("`token` must be a non-empty ASCII str")
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
        raise ConfigError(f"`max_body_bytes` must be a positive int; received max_body_bytes={max_body_bytes!r}")

    app = Flask("elephant.ps")
    app.config.update(DEBUG=False, TESTING=False, PROPAGATE_EXCEPTIONS=False, MAX_CONTENT_LENGTH=max_body_bytes)
    app.extensions[EXTENSION] = {"store": store, "token": token, "max_body_bytes": max_body_bytes}
    expected = f"Bearer {token}".encode("ascii")
    app.wsgi_app = BinaryRoutes(app.wsgi_app, store, expected, max_body_bytes)

    @app.before_request
    def _guard():
        refused = refusal(request.headers.get("Authorization", ""), expected, request.method,
                          request.content_length, max_body_bytes)
        return None if refused is None else _error(*refused)

    @app.get("/health")
    def health():
        return jsonify(status="ok", run=store.run, clock=store.clock, mode=store.mode)

    finish_keys = {"run", "epoch", "partition", "attempt"}

    @app.post("/finish")
    def finish():
        data = request.get_json(silent=True)
        if not isinstance(data, dict) or not (set(data) == finish_keys or
                                              course is not None and set(data) == finish_keys | {"stats"}):
            raise ProtocolError("finish expects a JSON object with run, epoch, partition, attempt"
                                f"{' (and stats)' if course is not None else ''}; received {data!r}")
        store.finish(data["run"], data["epoch"], data["partition"], data["attempt"])
        if "stats" in data:
            course.report(data["run"], data["epoch"], data["partition"], data["stats"])
        return jsonify(status="ok")

    if course is not None:
        @app.get("/course")
        def next_epoch():
            opened = course.next(int_param(request.args, "epoch"), WAIT_S, int_param(request.args, "job", None))
            return jsonify(opened if opened is not None else {"wait": True})

    @app.get("/metrics")
    def metrics():
        out = store.metrics()
        out["staleness"] = {str(k): v for k, v in out["staleness"].items()}
        return jsonify(out)

    @app.errorhandler(HTTPException)
    def _http(exc):
        return _error(exc.code or 500, exc.description or exc.name, type(exc).__name__)

    @app.errorhandler(Exception)
    def _failed(exc):  # Flask picks the most specific handler: HTTPException's above, this for the rest
        return _error(*failure(exc, request.method, request.path))

    return app
