"""elephant.ps.app through Flask's test client: auth, limits, status codes, no side effects."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest

from elephant.errors import ConfigError
from elephant.optimizers import Commit, Downpour, ModelAveraging
from elephant.ps import app as app_module
from elephant.ps import wire
from elephant.ps.app import create_app
from elephant.ps.store import CommitKey, Store

RUN = "run-a"
TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CENTER = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, dtype=np.float32)]


def make(mode="asynchronous", optimizer=None, max_body_bytes=1 << 20, **kwargs):
    store = Store(CENTER, optimizer or Downpour(), mode, 2, RUN, **kwargs)
    return store, create_app(store, TOKEN, max_body_bytes).test_client()


def snapshot(store):
    return [a.tobytes() for a in store.center()]


def commit_body(tensors=None, partition=0, step=0, attempt=1, run=RUN, base_clock=0):
    tensors = [np.ones_like(a) for a in CENTER] if tensors is None else tensors
    commit = Commit(tensors=tensors, num_steps=1, num_samples=8, base_clock=base_clock)
    return wire.encode_commit(CommitKey(run, 0, partition, step), attempt, commit).tobytes()


def test_commit_applies_and_returns_the_new_center():
    store, client = make()
    response = client.post("/commit", data=commit_body(), headers=AUTH)
    assert response.status_code == 200
    assert response.mimetype == "application/octet-stream"
    reply = wire.decode_reply(response.data, CENTER)
    assert reply.clock == 1
    np.testing.assert_array_equal(reply.center[0], CENTER[0] + 1)
    assert snapshot(store) == [a.tobytes() for a in reply.center]
    metrics = store.metrics()
    assert metrics["bytes_in"] == len(commit_body()) and metrics["bytes_out"] == len(response.data)


def test_pull_returns_center_and_clock():
    store, client = make()
    response = client.get("/weights?worker=1", headers=AUTH)
    assert response.status_code == 200
    reply = wire.decode_reply(response.data, CENTER)
    assert reply.clock == 0 and reply.tensors is None
    np.testing.assert_array_equal(reply.center[1], CENTER[1])
    assert store.metrics()["pulls"] == 1


@pytest.mark.parametrize("path", ["/weights?worker=0", "/weights?worker=-1", "/weights"])
def test_pull_parameters_are_validated(path):
    _, client = make()
    response = client.get(path, headers=AUTH)
    if path.endswith("=0"):
        assert response.status_code == 200
    else:
        assert response.status_code == 400
        assert "query parameter 'worker'" in response.get_json()["error"]


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("get", "/health", None),
        ("get", "/weights?worker=0", None),
        ("post", "/commit", commit_body()),
        ("post", "/finish", json.dumps({"run": RUN, "epoch": 0, "partition": 0, "attempt": 1})),
        ("get", "/metrics", None),
    ],
)
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}])
def test_missing_or_wrong_token_is_401_and_changes_nothing(method, path, body, headers):
    store, client = make()
    before = snapshot(store)
    response = getattr(client, method)(path, data=body, headers=headers)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert response.get_json()["error"] == "missing or wrong bearer token"
    assert snapshot(store) == before
    assert store.metrics()["pulls"] == 0 and store.clock == 0


def test_token_is_compared_in_constant_time(monkeypatch):
    calls = []
    real = app_module.hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(app_module.hmac, "compare_digest", spy)
    _, client = make()
    assert client.get("/health", headers=AUTH).status_code == 200
    assert calls == [(AUTH["Authorization"].encode(), AUTH["Authorization"].encode())]


class _Unreadable(io.RawIOBase):
    """A 5000-byte body that fails the test if anything reads it."""

    size = 5000
    position = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.position

    def seek(self, offset, whence=0):
        self.position = offset + (self.size if whence == 2 else 0)
        return self.position

    def readinto(self, buffer):
        raise AssertionError("the body of an oversized request was read")


def test_oversized_body_is_413_before_it_is_read():
    store, client = make(max_body_bytes=1000)
    response = client.post("/commit", input_stream=_Unreadable(), headers=AUTH)
    assert response.status_code == 413
    assert response.get_json()["error"] == "request body of 5000 bytes exceeds the limit of 1000 bytes"
    assert response.headers["Connection"] == "close"
    assert store.clock == 0


def test_chunked_body_without_length_is_411():
    store, client = make()
    response = client.post("/commit", data=commit_body(), headers=AUTH,
                           environ_overrides={"HTTP_TRANSFER_ENCODING": "chunked"})
    assert response.status_code == 411
    assert response.get_json()["error"] == "a request body needs a Content-Length header"
    assert store.clock == 0


def _bad_payloads():
    nan = [a.copy() for a in CENTER]
    nan[1][2] = np.nan
    return [
        ("count", commit_body([np.ones_like(CENTER[0])]), "expected 2 tensors, received 1"),
        ("shape", commit_body([np.ones((3, 2), np.float32), CENTER[1]]), r"tensor 0: expected shape \(2, 3\)"),
        ("dtype", commit_body([CENTER[0].astype(np.float64), CENTER[1]]), "tensor 0: expected dtype float32"),
        ("nan", commit_body(nan), "tensor 1 holds non-finite values"),
        ("trailing", commit_body() + b"\x00" * 3, "3 trailing bytes"),
        ("truncated", commit_body()[:-5], "truncated"),
        ("garbage", b"GET / HTTP/1.1\r\n\r\n", "header length"),
        ("pickle", b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00", "header length|not valid JSON"),
        ("run", commit_body(run="run-b"), "names run 'run-b' but this parameter server serves run 'run-a'"),
        ("partition", commit_body(partition=7), "partition 7 is out of range for num_workers=2"),
    ]


@pytest.mark.parametrize("name, body, match", _bad_payloads(), ids=[p[0] for p in _bad_payloads()])
def test_bad_payload_is_400_with_reason_and_center_byte_identical(name, body, match):
    store, client = make()
    client.post("/commit", data=commit_body(step=0), headers=AUTH)  # a real update first
    before = snapshot(store)
    response = client.post("/commit", data=body, headers=AUTH)
    assert response.status_code == 400
    payload = response.get_json()
    assert payload["type"] in ("ProtocolError", "DataError")
    assert re.search(match, payload["error"]), payload["error"]
    assert snapshot(store) == before
    assert store.clock == 1


def test_stale_attempt_is_409():
    store, client = make()
    assert client.post("/commit", data=commit_body(attempt=9), headers=AUTH).status_code == 200
    response = client.post("/commit", data=commit_body(step=1, attempt=4, base_clock=1), headers=AUTH)
    assert response.status_code == 409
    assert response.get_json() == {
        "error": "commit (run run-a, epoch 0, partition 0, step 1, attempt 4) was superseded by task attempt 9 "
        "of the same partition",
        "type": "StaleAttemptError",
    }
    assert store.clock == 1


def test_round_timeout_is_504():
    store, client = make(mode="synchronous", optimizer=ModelAveraging(outer_momentum=0.0), round_timeout=0.1)
    before = snapshot(store)
    response = client.post("/commit", data=commit_body(), headers=AUTH)
    assert response.status_code == 504
    assert "missing: [1]" in response.get_json()["error"]
    assert snapshot(store) == before


def test_closed_store_is_503():
    store, client = make()
    store.close()
    response = client.get("/weights?worker=0", headers=AUTH)
    assert response.status_code == 503
    assert response.get_json()["type"] == "StoreClosedError"


class _Broken(Downpour):
    def apply(self, state, center, clock, worker, commit):
        raise RuntimeError("rule bug")


def test_rule_failure_is_500_with_reason():
    store, client = make(optimizer=_Broken())
    response = client.post("/commit", data=commit_body(), headers=AUTH)
    assert response.status_code == 500
    assert "the server rule of _Broken failed: RuntimeError('rule bug')" in response.get_json()["error"]
    assert store.clock == 0


def test_finish_and_its_validation():
    store, client = make(mode="synchronous", optimizer=ModelAveraging(outer_momentum=0.0))
    ok = client.post("/finish", json={"run": RUN, "epoch": 0, "partition": 1, "attempt": 3}, headers=AUTH)
    assert ok.status_code == 200 and ok.get_json() == {"status": "ok"}
    # partition 1 finished, so a round of partition 0 alone closes at once
    assert client.post("/commit", data=commit_body(), headers=AUTH).status_code == 200
    bad = client.post("/finish", json={"run": RUN, "epoch": 0}, headers=AUTH)
    assert bad.status_code == 400
    assert "finish expects a JSON object with run, epoch, partition, attempt" in bad.get_json()["error"]
    stale = client.post("/finish", json={"run": RUN, "epoch": 0, "partition": 1, "attempt": 2}, headers=AUTH)
    assert stale.status_code == 409


def test_health_and_metrics_json():
    store, client = make()
    assert client.get("/health", headers=AUTH).get_json() == {
        "status": "ok", "run": RUN, "clock": 0, "mode": "asynchronous"}
    client.post("/commit", data=commit_body(), headers=AUTH)
    client.post("/commit", data=commit_body(), headers=AUTH)  # replay
    client.post("/commit", data=commit_body(partition=1, base_clock=0), headers=AUTH)
    metrics = client.get("/metrics", headers=AUTH).get_json()
    assert metrics["commits_applied"] == 2 and metrics["replays_dropped"] == 1
    assert metrics["staleness"] == {"0": 1, "1": 1}
    assert metrics["staleness_max"] == 1 and metrics["bytes_in"] > 0 and metrics["bytes_out"] > 0


def test_unknown_route_is_json_404():
    _, client = make()
    response = client.get("/nothing", headers=AUTH)
    assert response.status_code == 404 and response.get_json()["type"] == "NotFound"


def test_never_debug_and_settings_validated():
    store, _ = make()
    app = create_app(store, TOKEN)
    assert app.debug is False and app.config["MAX_CONTENT_LENGTH"] == 1 << 30
    with pytest.raises(ConfigError, match="`token` must be a non-empty ASCII str"):
        create_app(store, "")
    with pytest.raises(ConfigError, match="`max_body_bytes` must be a positive int; received max_body_bytes=0"):
        create_app(store, TOKEN, 0)


# ------------------------------------------------------------------ the binary routes, outside Flask's machinery
@pytest.mark.parametrize("method, path, allow", [("get", "/commit", "POST"), ("put", "/commit", "POST"),
                                                 ("post", "/weights?worker=0", "GET")])
def test_another_method_on_a_binary_route_is_405(method, path, allow):
    store, client = make()
    response = getattr(client, method)(path, data=b"x", headers=AUTH)
    assert response.status_code == 405 and response.headers["Allow"] == allow
    assert response.get_json()["type"] == "MethodNotAllowed"
    assert store.metrics()["pulls"] == 0 and store.clock == 0


def test_a_binary_route_compares_the_token_in_constant_time(monkeypatch):
    calls = []
    real = app_module.hmac.compare_digest
    monkeypatch.setattr(app_module.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    _, client = make()
    assert client.post("/commit", data=commit_body(), headers=AUTH).status_code == 200
    assert client.get("/weights?worker=0", headers={"Authorization": "Bearer nope"}).status_code == 401
    expected = AUTH["Authorization"].encode()
    assert calls == [(expected, expected), (b"Bearer nope", expected)]


@pytest.mark.parametrize("query, status", [("worker=1&worker=9", 200), ("worker=9&worker=1", 400),
                                           ("worker=%C2%B2", 400), ("worker=1&epoch=", 400)])
def test_a_repeated_query_parameter_counts_its_first_value_and_odd_digits_are_400(query, status):
    _, client = make()
    response = client.get(f"/weights?{query}", headers=AUTH)
    assert response.status_code == status, response.data




def test_an_unexpected_failure_is_a_logged_500_naming_the_exception(monkeypatch, caplog):
    store, client = make()
    monkeypatch.setattr(store, "pull", lambda worker, epoch=None: {}["missing"])
    with caplog.at_level("ERROR", logger="elephant.ps.app"):
        response = client.get("/weights?worker=0", headers=AUTH)
    assert response.status_code == 500
    assert response.get_json() == {"error": "KeyError: 'missing'", "type": "InternalServerError"}
    assert "parameter server failed on GET /weights" in caplog.text and "KeyError" in caplog.text
