"""Flask app factory of the parameter server: thin routes over a :class:`~elephant.ps.store.Store`.

Routes (every one, ``/health`` included, needs ``Authorization: Bearer <token>``):

==========================  ==================================================
``GET /health``             JSON ``{"status": "ok", "run": ..., "clock": ...}``
``GET /weights?worker=k``   binary reply (center + clock); ``&epoch=e`` for SSP
``POST /commit``            binary commit in, binary reply (new center) out
``POST /finish``            JSON ``{"run", "epoch", "partition", "attempt"}``
``GET /metrics``            JSON counters and staleness histogram
==========================  ==================================================

Errors are JSON ``{"error": reason, "type": exception class}``: 401 missing or
wrong token, 411 no Content-Length on a body, 413 body over the limit (refused
before it is read), 400 malformed payload (the center is untouched), 409
superseded task attempt, 504 round or SSP admission timeout, 503 the store is
closing, 500 a server-rule failure. The app does no math and never runs in
debug mode.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import threading
from typing import Any

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
from elephant.ps.store import Store

logger = logging.getLogger(__name__)

__all__ = ["create_app", "max_body_bytes", "DEFAULT_MAX_BODY_BYTES", "EXTENSION", "BUFFERS_OK"]

#: Default request-body limit: 1 GiB.
DEFAULT_MAX_BODY_BYTES = 1 << 30
#: Key of the app's entry in ``app.extensions`` (the server reads token and store there).
EXTENSION = "elephant_ps"
#: Commit bodies read and summed at a time when the store streams synchronous rounds.
STREAMED_INTAKE = 2
#: WSGI environ key set by a server that accepts memoryviews in the response iterable.
BUFFERS_OK = "elephant.buffers_ok"

_BINARY = "application/octet-stream"


def _error(status: int, exc: BaseException | str, kind: str | None = None) -> Response:
    message = str(exc)
    response = jsonify(error=message, type=kind or type(exc).__name__)
    response.status_code = status
    if request.content_length:
        response.headers["Connection"] = "close"  # the body may be unread: do not reuse the connection
    return response


def _binary(store: Store, encoded: wire.Encoded, received: int) -> Response:
    store.count_bytes(received, encoded.nbytes)
    # PEP 3333 wants bytes; PSServer's handler takes the buffers as they are (no join).
    body = encoded if request.environ.get(BUFFERS_OK) else [encoded.tobytes()]
    response = Response(body, mimetype=_BINARY)
    response.headers["Content-Length"] = str(encoded.nbytes)
    return response


def _read_body() -> np.ndarray:
    """Read exactly Content-Length bytes into a fresh buffer (no intermediate copies)."""
    size = request.content_length
    buf = np.empty(size, dtype=np.uint8)  # np.empty: no zero-fill before the socket writes it
    view = memoryview(buf)
    position = 0
    while position < size:
        n = request.stream.readinto(view[position:])
        if not n:
            raise ProtocolError(f"request body truncated: received {position} of {size} bytes")
        position += n
    return buf


def _int_param(name: str, default: Any = ...) -> Any:
    raw = request.args.get(name)
    if raw is None:
        if default is ...:
            raise ProtocolError(f"query parameter {name!r} is required")
        return default
    if not raw.isdigit():
        raise ProtocolError(f"query parameter {name!r} must be an int >= 0; received {raw!r}")
    return int(raw)


def max_body_bytes(template) -> int:
    """The request-body limit of a fit's server: four models (the largest commit) and a MiB of headroom."""
    return 4 * W.nbytes(template) + (1 << 20)


def create_app(store: Store, token: str, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Flask:
    """Build the parameter server's Flask app.

    Args:
        store: the state the routes read and update.
        token: the run's bearer token (e.g. ``secrets.token_urlsafe(32)``).
        max_body_bytes: largest request body accepted; larger ones get 413
            before they are read. Default 1 GiB.

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

    @app.before_request
    def _guard():
        supplied = request.headers.get("Authorization", "").encode("latin-1")
        if not hmac.compare_digest(supplied, expected):
            response = _error(401, "missing or wrong bearer token", "Unauthorized")
            response.headers["WWW-Authenticate"] = "Bearer"
            return response
        size = request.content_length
        if size is not None and size > max_body_bytes:
            return _error(413, f"request body of {size} bytes exceeds the limit of {max_body_bytes} bytes", "TooLarge")
        if request.method == "POST" and size is None:
            return _error(411, "a request body needs a Content-Length header", "LengthRequired")
        return None

    @app.get("/health")
    def health():
        return jsonify(status="ok", run=store.run, clock=store.clock, mode=store.mode)

    @app.get("/weights")
    def weights():
        reply = store.pull(_int_param("worker"), _int_param("epoch", None))
        return _binary(store, wire.encode_reply(reply), 0)

    # Streamed synchronous rounds keep no commit, so the bodies being read and summed
    # are what the server holds: admit a few at a time, whatever the partition count.
    intake = threading.BoundedSemaphore(STREAMED_INTAKE) if store.streams_rounds else contextlib.nullcontext()

    @app.post("/commit")
    def commit():
        with intake:
            body = _read_body()
            received = body.nbytes
            key, attempt, payload = wire.decode_commit(body, store.commit_template)
            del body  # the payload's arrays may view it: both go once the store has summed them
            wait = store.submit(key, attempt, payload, check_finite=False)  # decode checked finiteness
            del payload
        return _binary(store, wire.encode_reply(wait()), received)

    @app.post("/finish")
    def finish():
        data = request.get_json(silent=True)
        if not isinstance(data, dict) or set(data) != {"run", "epoch", "partition", "attempt"}:
            raise ProtocolError(f"finish expects a JSON object with run, epoch, partition, attempt; received {data!r}")
        store.finish(data["run"], data["epoch"], data["partition"], data["attempt"])
        return jsonify(status="ok")

    @app.get("/metrics")
    def metrics():
        out = store.metrics()
        out["staleness"] = {str(k): v for k, v in out["staleness"].items()}
        return jsonify(out)

    @app.errorhandler(ProtocolError)
    @app.errorhandler(DataError)
    def _bad_request(exc):
        logger.info("rejected %s %s: %s", request.method, request.path, exc)
        return _error(400, exc)

    # Most specific first is irrelevant to Flask (it walks the MRO), but it reads best.
    for error_class, status in ((StaleAttemptError, 409), (RoundTimeoutError, 504),
                                (StoreClosedError, 503), (PSError, 500)):
        app.register_error_handler(error_class, lambda exc, status=status: _error(status, exc))

    @app.errorhandler(HTTPException)
    def _http(exc):
        return _error(exc.code or 500, exc.description or exc.name, type(exc).__name__)

    @app.errorhandler(Exception)
    def _internal(exc):
        logger.exception("parameter server failed on %s %s", request.method, request.path)
        return _error(500, f"{type(exc).__name__}: {exc}")

    return app
