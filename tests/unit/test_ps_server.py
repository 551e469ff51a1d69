"""elephant.ps.server: lifecycle over real loopback sockets (fast, nothing left behind)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from flask import Flask

from elephant.errors import ConfigError, PSError
from elephant.optimizers import Commit, Downpour, ModelAveraging
from elephant.ps import wire
from elephant.ps.app import create_app
from elephant.ps.server import PSServer, default_threads
from elephant.ps.store import CommitKey, Store

RUN = "run-s"
TOKEN = "tok"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def make_app(mode="asynchronous", optimizer=None, num_workers=2, **kwargs):
    store = Store([np.zeros(4, dtype=np.float32)], optimizer or Downpour(), mode, num_workers, RUN, **kwargs)
    return store, create_app(store, TOKEN)


def get(port, path, headers=AUTH):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def port_is_free(port):
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_port_zero_gets_a_real_port_and_serves_with_auth():
    _, app = make_app()
    with PSServer(app) as server:
        assert server.port > 0
        assert server.url == f"http://127.0.0.1:{server.port}"
        assert server.running
        assert get(server.port, "/health")[0] == 200
        assert get(server.port, "/health", headers={})[0] == 401
        assert not port_is_free(server.port)


def test_connection_counts_are_zero_unless_running():
    names = ["accepted", "open", "refused", "expired", "unauthorized"]
    _, app = make_app()
    server = PSServer(app)
    assert [getattr(server, f"connections_{name}") for name in names] == [0] * 5
    with server:
        assert get(server.port, "/health", headers={})[0] == 401
        assert (server.connections_accepted, server.connections_unauthorized) == (2, 1)  # the probe's, then ours
    assert [getattr(server, f"connections_{name}") for name in names] == [0] * 5
    assert PSServer.connections_open.__doc__.startswith("Connections open now")


def test_second_start_is_refused():
    _, app = make_app()
    server = PSServer(app).start()
    try:
        with pytest.raises(PSError, match="already started"):
            server.start()
    finally:
        server.stop()
    with pytest.raises(PSError, match="already started"):
        server.start()


def test_stop_is_idempotent_and_leaves_no_thread_and_a_free_port():
    _, app = make_app()
    server = PSServer(app).start()
    port = server.port
    assert get(port, "/health")[0] == 200
    server.stop()
    server.stop()
    assert not server.running
    assert not [t for t in threading.enumerate() if t.name.startswith("elephant-ps")]
    assert port_is_free(port)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    _, app2 = make_app()
    with PSServer(app2, port=port) as again:  # the same port can be served again at once
        assert again.port == port


def test_stop_before_start_is_a_no_op_and_port_needs_start():
    _, app = make_app()
    server = PSServer(app)
    server.stop()
    with pytest.raises(PSError, match="not running"):
        server.port  # noqa: B018


def test_port_in_use_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _, app = make_app()
        with pytest.raises(PSError, match=f"could not bind the parameter server to 127.0.0.1:{port}"):
            PSServer(app, port=port).start()


def test_keep_alive_serves_many_requests_on_one_connection():
    store, app = make_app()
    with PSServer(app) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        try:
            sockets = []
            for step in range(3):
                body = wire.encode_commit(CommitKey(RUN, 0, 0, step), 1, Commit([np.ones(4, np.float32)], 1, 1, step))
                conn.request("POST", "/commit", body=body.tobytes(), headers=AUTH)
                response = conn.getresponse()
                reply = wire.decode_reply(response.read())
                assert response.status == 200 and response.getheader("Connection") is None
                sockets.append(conn.sock)
            assert sockets[0] is sockets[1] is sockets[2]  # one connection, never reconnected
            assert server.connections_accepted == 2  # the readiness probe's and this one
            assert reply.clock == 3
            conn.request("POST", "/commit", body=b"x" * 10, headers=AUTH)
            response = conn.getresponse()
            assert response.status == 400 and response.getheader("Connection") == "close"
            response.read()
        finally:
            conn.close()
    np.testing.assert_array_equal(store.center()[0], np.full(4, 3.0))


def test_stop_releases_a_commit_blocked_in_a_round():
    store, app = make_app(mode="synchronous", optimizer=ModelAveraging(outer_momentum=0.0))
    server = PSServer(app).start()
    body = wire.encode_commit(CommitKey(RUN, 0, 0, 0), 1, Commit([np.ones(4, np.float32)], 1, 1, 0)).tobytes()

    def blocked_commit():
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            conn.request("POST", "/commit", body=body, headers=AUTH)
            return conn.getresponse().status
        finally:
            conn.close()

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(blocked_commit)
        deadline = threading.Event()
        while store.metrics()["waiting"] == 0 and not deadline.wait(0.005):
            pass
        server.stop()
        assert future.result(timeout=10) == 503
    assert store.clock == 0


def test_handler_threads_are_bounded_and_extra_connections_queue():
    _, app = make_app()
    with PSServer(app, threads=2) as server:
        conns = [http.client.HTTPConnection("127.0.0.1", server.port, timeout=5) for _ in range(5)]
        try:
            for conn in conns:
                conn.request("GET", "/health", headers=AUTH)
            for conn in conns:  # keep-alive connections hold a thread until closed; the rest wait their turn
                assert conn.getresponse().read()
                handlers = [t for t in threading.enumerate() if t.name.startswith("elephant-ps-handler")]
                assert len(handlers) <= 2
                conn.close()
        finally:
            for conn in conns:
                conn.close()


@pytest.mark.parametrize("num_workers, expected", [(None, 8), (1, 8), (4, 8), (5, 9), (32, 36)])
def test_default_threads(num_workers, expected):
    assert default_threads(num_workers) == expected


def test_default_threads_follow_the_store_and_settings_are_validated():
    _, app = make_app(num_workers=20)
    assert PSServer(app).threads == 24
    with pytest.raises(ConfigError, match="`threads` must be a positive int; received threads=0"):
        PSServer(app, threads=0)
    with pytest.raises(ConfigError, match="must be made by elephant.ps.app.create_app"):
        PSServer(Flask("plain"))


def test_stop_does_not_wait_for_idle_keep_alive_connections():
    _, app = make_app()
    server = PSServer(app, idle_timeout=30.0).start()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request("GET", "/health", headers=AUTH)
        assert conn.getresponse().read()  # the connection stays open and idle in a handler thread
        started = time.monotonic()
        server.stop()
        assert time.monotonic() - started < 10.0  # far below the connection's idle timeout of 30 s, on a busy machine too
        assert not [t for t in threading.enumerate() if t.name.startswith("elephant-ps")]
    finally:
        conn.close()


def test_app_yields_bytes_under_a_plain_wsgi_server():
    from werkzeug.serving import make_server

    store, app = make_app()
    plain = make_server("127.0.0.1", 0, app)  # werkzeug's own handler asserts PEP 3333 bytes
    thread = threading.Thread(target=plain.serve_forever, name="elephant-ps-test-plain", daemon=True)
    thread.start()
    try:
        status, body = get(plain.port, "/weights?worker=0")
        assert status == 200
        np.testing.assert_array_equal(wire.decode_reply(body).center[0], np.zeros(4, dtype=np.float32))
    finally:
        plain.shutdown()
        thread.join()
        plain.server_close()


# ------------------------------------------------------------------ floods (T16)
def _commit_body(step):
    return wire.encode_commit(CommitKey(RUN, 0, 0, step), 1, Commit([np.ones(4, np.float32)], 1, 1, 0)).tobytes()


def _timed_commits(port, n, start=0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    times = []
    try:
        for step in range(start, start + n):
            t0 = time.perf_counter()
            conn.request("POST", "/commit", body=_commit_body(step), headers=AUTH)
            response = conn.getresponse()
            response.read()
            assert response.status == 200
            times.append(time.perf_counter() - t0)
    finally:
        conn.close()
    return times


def _statuses(reader, count):
    """The status codes of the next ``count`` HTTP responses on ``reader`` (bodies read and dropped)."""
    statuses = []
    for _ in range(count):
        status = reader.readline()
        length = 0
        while (line := reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        reader.read(length)
        statuses.append(status.split(b" ")[1])
    return statuses


def _handler_threads():
    return [t for t in threading.enumerate() if t.name.startswith("elephant-ps-handler")]


def test_idle_and_half_sent_connections_hold_no_handler_thread():
    """300 idle connections, 50 half-sent heads and 50 tokenless half-sent bodies: commits go on at their pace."""
    store, app = make_app()
    with PSServer(app, threads=2, header_timeout=30.0) as server:
        quiet = sorted(_timed_commits(server.port, 100))
        attackers = []
        try:
            for _ in range(300):
                attackers.append(socket.create_connection(("127.0.0.1", server.port)))
            for _ in range(50):  # a head that never ends
                s = socket.create_connection(("127.0.0.1", server.port))
                s.sendall(b"POST /commit HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n")
                attackers.append(s)
            tokenless = []
            for _ in range(50):  # a whole head without the token, then 10 of the 1,000 body bytes announced
                s = socket.create_connection(("127.0.0.1", server.port))
                s.sendall(b"POST /commit HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"\0" * 10)
                tokenless.append(s)
            for s in tokenless:  # refused at once from the head: no thread, no body buffer
                s.settimeout(5)
                assert s.recv(64).startswith(b"HTTP/1.1 401")
                s.close()
            wait_for = time.monotonic() + 5
            while server.connections_open < 350 and time.monotonic() < wait_for:
                time.sleep(0.01)
            assert server.connections_open >= 350  # the idle and half-sent ones, all held by the gate
            attacked = sorted(_timed_commits(server.port, 100, start=100))
            assert len(_handler_threads()) <= 2
        finally:
            for s in attackers:
                s.close()
    p99_quiet, p99_attacked = quiet[98], attacked[98]
    assert p99_attacked < max(5 * p99_quiet, 0.05), (p99_quiet, p99_attacked)
    assert store.clock == 200


def test_slow_requests_and_silent_connections_expire():
    _, app = make_app()
    with PSServer(app, threads=2, header_timeout=0.3) as server:
        silent = socket.create_connection(("127.0.0.1", server.port))
        slow = socket.create_connection(("127.0.0.1", server.port))
        slow.sendall(b"GET /health HTTP/1.1\r\n")  # never finishes its head
        silent.settimeout(5)
        slow.settimeout(5)
        assert silent.recv(10) == b"" and slow.recv(10) == b""  # closed by the server (the client's wait is 5 s)
        assert server.connections_expired == 2
        assert get(server.port, "/health")[0] == 200
        silent.close()
        slow.close()


def test_a_connect_close_loop_leaves_nothing_behind_and_does_not_spin():
    import os

    _, app = make_app()
    with PSServer(app, threads=2) as server:
        fds_before = len(os.listdir("/proc/self/fd"))
        for _ in range(1000):
            socket.create_connection(("127.0.0.1", server.port)).close()
        wait_for = time.monotonic() + 5
        while server.connections_open and time.monotonic() < wait_for:
            time.sleep(0.01)
        assert server.connections_open == 0
        cpu = time.process_time()
        time.sleep(1.0)
        assert time.process_time() - cpu < 0.2  # the gate sleeps in select(): no busy loop on closed sockets
        assert len(os.listdir("/proc/self/fd")) <= fds_before + 2
        assert get(server.port, "/health")[0] == 200


def test_connections_over_the_cap_are_closed_at_once():
    _, app = make_app()
    with PSServer(app, threads=2, max_connections=4) as server:
        wait_for = time.monotonic() + 5
        while server.connections_open and time.monotonic() < wait_for:  # the readiness probe's, closing
            time.sleep(0.01)
        held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]
        try:
            wait_for = time.monotonic() + 5
            while server.connections_open < 4 and time.monotonic() < wait_for:
                time.sleep(0.01)
            extra = socket.create_connection(("127.0.0.1", server.port))
            extra.settimeout(5)
            assert extra.recv(10) == b""
            extra.close()
            assert server.connections_refused == 1
        finally:
            for s in held:
                s.close()


@pytest.mark.parametrize("head, status", [
    (b"POST /commit HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", b"411"),
    (b"POST /commit HTTP/1.1\r\nContent-Length: -5\r\n\r\n", b"400"),
    (b"GET /health HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n", b"431"),
])
def test_the_gate_refuses_what_it_cannot_frame(head, status):
    _, app = make_app()
    with PSServer(app, threads=2) as server:
        s = socket.create_connection(("127.0.0.1", server.port))
        s.settimeout(5)
        try:
            s.sendall(head)
        except OSError:
            pass  # the server may close before the whole oversized head is sent
        assert s.recv(64).split(b" ")[1] == status
        s.close()


def test_expect_100_continue_and_a_pipelined_request_are_served():
    store, app = make_app()
    with PSServer(app, threads=2) as server:
        s = socket.create_connection(("127.0.0.1", server.port))
        s.settimeout(5)
        body = _commit_body(0)
        auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
        s.sendall(b"POST /commit HTTP/1.1\r\nHost: x\r\n" + auth + b"Expect: 100-continue\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode())
        reader = s.makefile("rb")
        assert reader.readline().startswith(b"HTTP/1.1 100 Continue") and reader.readline() == b"\r\n"
        health = b"GET /health HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n"
        s.sendall(body + health)  # the second request arrives with the first one's body
        assert _statuses(reader, 2) == [b"200", b"200"]
        s.close()
    assert store.clock == 1


def test_requests_without_the_token_are_refused_by_the_gate_with_the_apps_error():
    _, app = make_app()
    with PSServer(app, threads=2) as server:
        status, payload = get(server.port, "/health", headers={"Authorization": "Bearer wrong"})
        assert status == 401 and json.loads(payload) == {"error": "missing or wrong bearer token",
                                                         "type": "Unauthorized"}
        assert server.connections_unauthorized == 1


def test_requests_sent_in_one_packet_are_all_answered_in_order():
    store, app = make_app()
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    body = _commit_body(0)
    commit = b"POST /commit HTTP/1.1\r\nHost: x\r\n" + auth + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n"
    with PSServer(app, threads=2) as server:
        s = socket.create_connection(("127.0.0.1", server.port))
        s.settimeout(5)
        s.sendall(health + commit + health + health)  # pipelined: heads, a body and heads in one stream
        assert _statuses(s.makefile("rb"), 4) == [b"200"] * 4
        s.close()
    assert store.clock == 1


def test_large_allocations_are_mapped_unless_the_user_set_glibc_threshold(monkeypatch):
    import platform

    from elephant.ps.allocator import map_large_allocations

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "4096")
    assert map_large_allocations() is False  # the user's own setting stands
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert map_large_allocations() is True


def test_a_pinned_port_range_takes_the_first_free_port():
    from elephant.ps.server import start_server
    from elephant.session import PS_PORTS_KEY, parse_ports

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        ports = [port, port + 1] if port < 65535 else [port - 1, port]
        if not port_is_free(ports[-1]):
            pytest.skip("the neighbouring port is in use")
        server = start_server(make_app()[1], "127.0.0.1", ports, threads=2)
        try:
            assert server.port == ports[-1] != port
        finally:
            server.stop()
        with pytest.raises(PSError, match=r"could not bind .* \(tried 2 ports of spark.elephant.ps.ports\)"):
            start_server(make_app()[1], "127.0.0.1", [port, port], threads=2, ports_from=PS_PORTS_KEY)
    with pytest.raises(ConfigError, match=r"`spark.elephant.ps.ports` must be a port or a range .* received '80-70'"):
        parse_ports("80-70")
    assert parse_ports(None) == [0] and parse_ports("0") == [0] and parse_ports("5-7") == [5, 6, 7]


# ------------------------------------------------------------------ request heads parsed once
def _raw_status(port, request):
    """Status of the first response to ``request`` and whether the server then closed the connection."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(5)
    try:
        s.sendall(request)
        reader = s.makefile("rb")
        status = _statuses(reader, 1)[0]
        s.settimeout(0.5)
        try:
            closed = reader.read(1) == b""
        except (TimeoutError, socket.timeout):
            closed = False
        return status, closed
    finally:
        s.close()


@pytest.mark.parametrize("version, connection, closed", [
    (b"HTTP/1.1", b"", False), (b"HTTP/1.1", b"Connection: close\r\n", True),
    (b"HTTP/1.0", b"", True), (b"HTTP/1.0", b"Connection: keep-alive\r\n", False),
])
def test_a_plain_head_keeps_http_servers_connection_rules(version, connection, closed):
    _, app = make_app()
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    with PSServer(app, threads=2) as server:
        request = b"GET /weights?worker=0 " + version + b"\r\nHost: x\r\n" + auth + connection + b"\r\n"
        assert _raw_status(server.port, request) == (b"200", closed)


def test_a_head_that_is_not_plain_goes_to_http_servers_parser():
    extra = b"X-Folded: first\r\n continued\r\n"  # obsolete line folding: http.server's parser takes it
    store, app = make_app()
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    with PSServer(app, threads=2) as server:
        body = _commit_body(0)
        request = (b"POST /commit HTTP/1.1\r\nHost: x\r\n" + extra + auth
                   + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert _raw_status(server.port, request)[0] == b"200"
    assert store.clock == 1
