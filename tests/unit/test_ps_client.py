"""elephant.ps.client: retries, timeouts, error messages; most tests without a socket."""

from __future__ import annotations

import io
import pickle
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
from requests.adapters import BaseAdapter

from elephant.errors import ConfigError, PSError, StaleAttemptError
from elephant.optimizers import Commit, Downpour, ModelAveraging
from elephant.ps import wire
from elephant.ps.app import create_app
from elephant.ps.client import InProcessClient, PSClient
from elephant.ps.server import PSServer
from elephant.ps.store import CommitKey, Store

RUN = "r"
TOKEN = "tok"
URL = "http://127.0.0.1:40123"
TEMPLATE = [np.zeros(3, dtype=np.float32)]


class AppAdapter(BaseAdapter):
    """Transport seam: route requests to a Flask app in memory, with scripted faults.

    ``faults`` is consumed one entry per request: None (deliver), "drop" (deliver,
    then lose the response), "refuse" (never deliver), "timeout" (never deliver,
    read timeout) or an int (answer that HTTP status without delivering).
    """

    def __init__(self, app, faults=()):
        super().__init__()
        self.client = app.test_client()
        self.faults = list(faults)
        self.calls = []

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):
        self.calls.append((request.method, request.path_url, timeout))
        fault = self.faults.pop(0) if self.faults else None
        if fault == "refuse":
            raise requests.ConnectionError("connection refused (scripted)")
        if fault == "timeout":
            raise requests.ReadTimeout("read timed out (scripted)")
        response = requests.Response()
        response.request, response.url = request, request.url
        if isinstance(fault, int):
            response.status_code, body = fault, b'{"error": "scripted failure", "type": "X"}'
        else:
            body = request.body if request.body is None or isinstance(request.body, bytes) else b"".join(request.body)
            result = self.client.open(request.path_url, method=request.method, data=body, headers=dict(request.headers))
            if fault == "drop":
                raise requests.ConnectionError("connection reset after the request was delivered (scripted)")
            response.status_code, body = result.status_code, result.data
        response.headers["Content-Length"] = str(len(body))
        response.raw = io.BytesIO(body)
        return response

    def close(self):
        pass


def make(faults=(), mode="asynchronous", optimizer=None, num_workers=2, **client_kwargs):
    store = Store(TEMPLATE, optimizer or Downpour(), mode, num_workers, RUN)
    adapter = AppAdapter(create_app(store, TOKEN), faults)
    session = requests.Session()
    session.mount("http://", adapter)
    client_kwargs.setdefault("backoff", 0.0)
    return store, adapter, PSClient(URL, TOKEN, session=session, **client_kwargs)


def commit(value=1.0, base_clock=0):
    return Commit([np.full(3, value, dtype=np.float32)], num_steps=1, num_samples=4, base_clock=base_clock)


KEY = CommitKey(RUN, 1, 1, 7)


def test_pull_commit_finish_metrics_health_through_the_seam():
    store, adapter, client = make()
    assert client.health()["run"] == RUN
    pulled = client.pull(0, template=TEMPLATE)
    assert pulled.clock == 0
    reply = client.commit(KEY, 3, commit(2.0), template=TEMPLATE)
    assert reply.clock == 1
    np.testing.assert_array_equal(reply.center[0], np.full(3, 2.0, dtype=np.float32))
    client.finish(RUN, 1, 1, 3)
    assert client.metrics()["commits_applied"] == 1
    assert all(timeout == (5.0, 120.0) for _, _, timeout in adapter.calls)  # explicit (connect, read)


def test_a_commit_whose_response_was_dropped_is_retried_and_applied_once():
    store, adapter, client = make(faults=["drop"])
    reply = client.commit(KEY, 3, commit(2.0))
    assert len(adapter.calls) == 2
    assert reply.clock == 1
    np.testing.assert_array_equal(store.center()[0], np.full(3, 2.0))
    assert store.ledger() == [(KEY, 3)]
    assert store.metrics()["replays_dropped"] == 1


@pytest.mark.parametrize("faults", [["refuse"], ["timeout"], [503], [502], ["refuse", 503, "timeout"]])
def test_transient_failures_are_retried(faults):
    store, adapter, client = make(faults=faults)
    assert client.pull(0).clock == 0
    assert len(adapter.calls) == len(faults) + 1


def test_retries_are_bounded_and_the_error_names_what_and_where():
    store, adapter, client = make(faults=["timeout"] * 10, retries=2)
    with pytest.raises(PSError, match=r"^commit \(run r, epoch 1, partition 1, step 7, attempt 3\) to parameter "
                                      r"server 127\.0\.0\.1:40123 failed after 3 attempts: ReadTimeout: read timed out"):
        client.commit(KEY, 3, commit())
    assert len(adapter.calls) == 3 and store.clock == 0


@pytest.mark.parametrize("status", [400, 401, 404, 413, 500, 504])
def test_final_statuses_are_not_retried(status):
    _, adapter, client = make(faults=[status])
    with pytest.raises(PSError, match=rf"pull \(worker 0\) rejected by parameter server 127\.0\.0\.1:40123, "
                                      rf"HTTP {status}: scripted failure"):
        client.pull(0)
    assert len(adapter.calls) == 1


def test_bad_commit_is_rejected_once_with_the_server_reason():
    store, adapter, client = make()
    bad = Commit([np.full(4, 1.0, dtype=np.float32)], 1, 1, 0)
    with pytest.raises(PSError, match=r"^commit \(run r, epoch 1, partition 1, step 7, attempt 3\) rejected by "
                                      r"parameter server 127\.0\.0\.1:40123, HTTP 400: tensor 0: expected shape "
                                      r"\(3,\), received \(4,\)$"):
        client.commit(KEY, 3, bad)
    assert len(adapter.calls) == 1 and store.clock == 0


def test_stale_attempt_is_stale_attempt_error():
    store, adapter, client = make()
    client.commit(KEY, 9, commit())
    with pytest.raises(StaleAttemptError, match="superseded by task attempt 9 .*HTTP 409"):
        client.commit(KEY._replace(step=8), 4, commit(base_clock=1))
    with pytest.raises(StaleAttemptError, match="HTTP 409"):
        client.finish(RUN, 1, 1, 4)
    assert len(adapter.calls) == 3


def test_reply_against_the_wrong_template_is_a_ps_error():
    _, _, client = make()
    with pytest.raises(PSError, match="pull \\(worker 0\\): parameter server 127.0.0.1:40123 sent an invalid reply: "
                                      "expected 2 center tensors, received 1"):
        client.pull(0, template=TEMPLATE * 2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"url": "127.0.0.1:80"}, "`url` must look like 'http://host:port'; received url='127.0.0.1:80'"),
        ({"url": "http://host"}, "`url` must look like"),
        ({"retries": -1}, "`retries` must be an int >= 0; received retries=-1"),
        ({"read_timeout": 0}, "`read_timeout` must be > 0 seconds; received read_timeout=0"),
        ({"backoff": -1}, "`backoff` must be >= 0 seconds; received backoff=-1"),
    ],
)
def test_invalid_client_settings(kwargs, match):
    args = {"url": URL, "token": TOKEN, **kwargs}
    with pytest.raises(ConfigError, match=match):
        PSClient(**args)


def test_client_refuses_to_pickle():
    with PSClient(URL, TOKEN) as client, pytest.raises(TypeError, match="build one inside each Spark task"):
        pickle.dumps(client)


# ------------------------------------------------------------ real sockets
def test_a_server_that_never_answers_is_a_timeout_error_not_a_hang():
    with socket.socket() as silent:  # accepts connections (backlog) but never reads or answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        with PSClient(f"http://127.0.0.1:{port}", TOKEN, read_timeout=0.2, retries=1, backoff=0.0) as client:
            started = time.monotonic()
            with pytest.raises(PSError, match=rf"pull \(worker 2\) to parameter server 127\.0\.0\.1:{port} failed "
                                              r"after 2 attempts: .*(timed out|Timeout)"):
                client.pull(2)
            assert time.monotonic() - started < 10  # two reads of 0.2 s and their connections, on a busy machine too


def test_a_closed_port_is_a_connection_error_naming_host_and_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with PSClient(f"http://127.0.0.1:{port}", TOKEN, retries=1, backoff=0.0) as client:
        with pytest.raises(PSError, match=rf"health check to parameter server 127\.0\.0\.1:{port} failed after "
                                          r"2 attempts: ConnectionRefusedError: .*Connection refused"):
            client.health()


def _scripted_server(answers):
    """A loopback HTTP server answering one request per connection from ``answers`` (raw bytes or None = hang up)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    received = []

    def serve():
        for answer in answers:
            conn, _ = listener.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    body += conn.recv(65536)
                received.append(head.split(b"\r\n")[0])
                if answer is not None:
                    conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread, received


@pytest.mark.parametrize("first", [None, b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\npartial"],
                         ids=["hung-up", "truncated-body"])
def test_a_lost_connection_on_the_real_socket_path_is_retried_on_a_new_one(first):
    store = Store(TEMPLATE, Downpour(), "asynchronous", 2, RUN)
    good = wire.encode_reply(store.commit(KEY, 3, commit(2.0))).tobytes()
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(good), good)
    listener, thread, received = _scripted_server([first, ok])
    with listener, PSClient(f"http://127.0.0.1:{listener.getsockname()[1]}", TOKEN, backoff=0.0) as client:
        reply = client.commit(KEY, 3, commit(2.0), template=TEMPLATE)
    thread.join(timeout=5)
    assert received == [b"POST /commit HTTP/1.1"] * 2  # the same commit, re-sent on a second connection
    assert reply.clock == 1
    np.testing.assert_array_equal(reply.center[0], np.full(3, 2.0, dtype=np.float32))


def test_end_to_end_over_http_reuses_one_connection():
    store = Store([np.zeros((64, 64), dtype=np.float32)], Downpour(), "asynchronous", 1, RUN)
    with PSServer(create_app(store, TOKEN)) as server, PSClient(server.url, TOKEN) as client:
        base = client.pull(0).clock
        for step in range(5):
            reply = client.commit(CommitKey(RUN, 0, 0, step), 1, Commit([np.ones((64, 64), np.float32)], 1, 1, base))
            base = reply.clock
        replay = client.commit(CommitKey(RUN, 0, 0, 4), 1, Commit([np.ones((64, 64), np.float32)], 1, 1, 0))
        metrics = client.metrics()
        assert server.connections_accepted == 2  # the readiness probe's, then one keep-alive for eight requests
    assert replay.clock == 5 and metrics["replays_dropped"] == 1 and metrics["commits_applied"] == 5
    np.testing.assert_array_equal(store.center()[0], np.full((64, 64), 5.0))
    with pytest.raises(ValueError, match="read-only"):
        reply.center[0][0, 0] = 1.0


# -------------------------------------------------------------- in-process
def test_in_process_client_has_the_same_methods_and_errors():
    store = Store(TEMPLATE, Downpour(), "asynchronous", 2, RUN)
    client = InProcessClient(store)
    for name in ("health", "pull", "commit", "finish", "metrics", "close"):
        assert callable(getattr(client, name)) and callable(getattr(PSClient, name))
    assert client.health()["run"] == RUN
    sent = commit(2.0)
    reply = client.commit(KEY, 3, sent, template=TEMPLATE)
    sent.tensors[0][:] = 100.0  # the store took a copy
    np.testing.assert_array_equal(store.center()[0], np.full(3, 2.0))
    assert reply.clock == client.pull(0).clock == 1
    with pytest.raises(PSError, match=r"commit \(run r, epoch 1, partition 1, step 8, attempt 3\): tensor 0: "
                                      r"expected float32\[3\], received float64\[3\] \(rejected by in-process"):
        client.commit(KEY._replace(step=8), 3, Commit([np.ones(3)], 1, 1, 0))
    with pytest.raises(StaleAttemptError, match="superseded"):
        client.commit(KEY._replace(step=9), 1, commit())
    with pytest.raises(PSError, match="expected 2 center tensors, received 1"):
        client.pull(0, template=TEMPLATE * 2)
    with InProcessClient(store) as other:
        other.finish(RUN, 1, 0, 1)
    assert client.metrics()["commits_applied"] == 1


def test_in_process_and_http_clients_agree_on_a_synchronous_round():
    results = []
    for kind in ("in-process", "http-seam"):
        store = Store(TEMPLATE, ModelAveraging(outer_momentum=0.0), "synchronous", 1, RUN)
        if kind == "in-process":
            client = InProcessClient(store)
        else:
            session = requests.Session()
            session.mount("http://", AppAdapter(create_app(store, TOKEN)))
            client = PSClient(URL, TOKEN, session=session)
        reply = client.commit(CommitKey(RUN, 0, 0, 0), 1, commit(3.0))
        results.append((reply.clock, reply.center[0].tobytes()))
    assert results[0] == results[1]


def test_an_oversized_commit_over_http_is_a_clear_413():
    store = Store([np.zeros(300_000, dtype=np.float32)], Downpour(), "asynchronous", 1, RUN)
    app = create_app(store, TOKEN, max_body_bytes=100_000)
    with PSServer(app) as server, PSClient(server.url, TOKEN, backoff=0.0) as client:
        with pytest.raises(PSError, match=r"HTTP 413: request body of 1200\d+ bytes exceeds the limit of 100000 bytes"):
            client.commit(CommitKey(RUN, 0, 0, 0), 1, Commit([np.ones(300_000, np.float32)], 1, 1, 0))
        assert client.health()["clock"] == 0  # the server and the client's connection pool still work


def test_a_synchronous_round_over_http_with_three_clients():
    store = Store(TEMPLATE, ModelAveraging(outer_momentum=0.0), "synchronous", 3, RUN, round_timeout=10)
    with PSServer(create_app(store, TOKEN)) as server:

        def worker(p):
            with PSClient(server.url, TOKEN) as client:
                base = client.pull(p, epoch=0).clock
                reply = client.commit(CommitKey(RUN, 0, p, 0), 10 + p, commit(float(p + 1), base_clock=base))
                client.finish(RUN, 0, p, 10 + p)
                return reply

        with ThreadPoolExecutor(3) as pool:
            replies = list(pool.map(worker, range(3)))
    assert [r.clock for r in replies] == [1, 1, 1]
    for reply in replies:  # equal sample counts: the mean of 1, 2 and 3
        np.testing.assert_array_equal(reply.center[0], np.full(3, 2.0, dtype=np.float32))
    assert store.metrics()["rounds_applied"] == 1


def test_the_client_side_imports_neither_flask_nor_spark_nor_tensorflow():
    import subprocess
    import sys

    code = ("import sys; from elephant.ps import PSClient, CommitKey, InProcessClient; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('flask', 'pyspark', 'tensorflow', 'keras')); "
            "assert not bad, bad")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_public_names_of_the_package():
    import elephant.ps as ps

    assert sorted(ps.__all__) == ["CommitKey", "InProcessClient", "PSClient", "PSServer", "RoundTimeoutError",
                                  "StaleAttemptError", "Store", "StoreClosedError", "create_app"]
    for name in ps.__all__:  # each resolves (lazily) to the object of that name, and shows in dir()
        assert getattr(ps, name).__name__ == name and name in dir(ps)
    with pytest.raises(AttributeError, match="module 'elephant.ps' has no attribute 'nothing'"):
        ps.nothing  # noqa: B018


# ------------------------------------------------------------ the default transport (http.client)
def _real_server(idle_timeout=60.0, num_workers=2):
    store = Store([np.zeros(4, dtype=np.float32)], Downpour(), "asynchronous", num_workers, "run-d")
    return store, PSServer(create_app(store, TOKEN), idle_timeout=idle_timeout).start()


def test_the_default_transport_reuses_one_connection_and_replaces_one_the_server_closed(caplog):
    store, server = _real_server(idle_timeout=0.2)
    try:
        with PSClient(server.url, TOKEN, backoff=5.0) as client, caplog.at_level("INFO", logger="elephant.ps.client"):
            for step in range(3):
                client.commit(CommitKey("run-d", 0, 0, step), 1, Commit([np.ones(4, np.float32)], 1, 1, step))
            assert server.connections_accepted == 2  # the readiness probe's and the client's one
            time.sleep(0.6)  # the server drops the idle keep-alive connection
            reply = client.pull(0)
            assert reply.clock == 3 and server.connections_accepted == 3
        assert "retry" not in caplog.text  # noticed before reuse: no failed try, no backoff
    finally:
        server.stop()


def test_the_default_transport_gives_concurrent_callers_their_own_connection():
    store, server = _real_server(num_workers=4)
    try:
        with PSClient(server.url, TOKEN) as client:
            barrier = threading.Barrier(4)

            def commits(partition):
                barrier.wait()
                return [client.commit(CommitKey("run-d", 0, partition, s), 1, Commit([np.ones(4, np.float32)], 1, 1, 0))
                        for s in range(20)]

            with ThreadPoolExecutor(4) as pool:
                replies = [r for rs in pool.map(commits, range(4)) for r in rs]
            assert len(replies) == 80 and 2 < server.connections_accepted <= 5
        np.testing.assert_array_equal(store.center()[0], np.full(4, 80.0))
        assert store.metrics()["commits_applied"] == 80
    finally:
        server.stop()
