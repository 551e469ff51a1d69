"""A lost reply and a stalled server, through a small fault proxy on loopback (reliability plan T13, T14)."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from elephant.errors import PSError
from elephant.optimizers import Commit, Downpour
from elephant.ps.app import create_app
from elephant.ps.client import PSClient
from elephant.ps.server import PSServer
from elephant.ps.store import CommitKey, Store

RUN, TOKEN = "run-f", "tok"


class FaultProxy:
    """Forwards TCP between clients and a server; can drop the next reply, or stall everything."""

    def __init__(self, upstream_port: int):
        self._upstream = ("127.0.0.1", upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.drop_next_reply = threading.Event()
        self.stalled = threading.Event()
        self.replies_dropped = 0
        self._closing = False
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._upstream)
            for src, dst, replies in ((client, server, False), (server, client, True)):
                t = threading.Thread(target=self._pump, args=(src, dst, replies), daemon=True)
                t.start()
                self._threads.append(t)

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                while self.stalled.is_set() and not self._closing:  # nothing moves while stalled
                    time.sleep(0.01)
                if replies and self.drop_next_reply.is_set():
                    self.drop_next_reply.clear()
                    self.replies_dropped += 1
                    break  # the server applied it; the client never hears
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self._closing = True
        self.stalled.clear()
        self._listener.close()


@pytest.fixture()
def served():
    store = Store([np.zeros(4, np.float32)], Downpour(), "asynchronous", 1, RUN)
    server = PSServer(create_app(store, TOKEN), threads=4).start()
    proxy = FaultProxy(server.port)
    yield store, proxy
    proxy.close()
    server.stop()


def _commit(step):
    return CommitKey(RUN, 0, 0, step), Commit([np.full(4, 1.0, np.float32)], 1, 1, step)


def test_a_reply_lost_after_the_apply_is_acknowledged_on_retry_not_applied_twice(served):
    """T13: the server applied the commit, the reply never arrived; the client's retry is a replay."""
    store, proxy = served
    with PSClient(f"http://127.0.0.1:{proxy.port}", TOKEN, read_timeout=5, retries=3, backoff=0.01) as client:
        for step in range(2):
            client.commit(*_commit(step)[:1], 1, _commit(step)[1])
        proxy.drop_next_reply.set()
        key, commit = _commit(2)
        reply = client.commit(key, 1, commit)
    assert proxy.replies_dropped == 1
    metrics = store.metrics()
    assert metrics["commits_applied"] == 3 and metrics["replays_dropped"] == 1
    assert reply.clock == 3
    np.testing.assert_array_equal(store.center()[0], np.full(4, 3.0))
    assert [k.step for k, _ in store.ledger()] == [0, 1, 2]


def test_a_stalled_server_fails_the_call_within_timeout_times_retries_and_training_goes_on(served):
    """T14: a stall never hangs a task; after it ends, the same commit (Spark's task retry) applies once."""
    store, proxy = served
    url = f"http://127.0.0.1:{proxy.port}"
    read_timeout, retries = 0.4, 2
    with PSClient(url, TOKEN, read_timeout=read_timeout, retries=retries, backoff=0.01) as client:
        client.commit(*_commit(0)[:1], 1, _commit(0)[1])
        proxy.stalled.set()
        key, commit = _commit(1)
        started = time.monotonic()
        with pytest.raises(PSError, match="failed after 3 attempts"):
            client.commit(key, 1, commit)
        elapsed = time.monotonic() - started
    assert elapsed < (retries + 1) * (read_timeout + 0.3) + 5.0, elapsed  # bounded, with room for a busy machine
    proxy.stalled.clear()
    time.sleep(0.1)  # requests forwarded late are applied (or not) once each
    with PSClient(url, TOKEN, read_timeout=5, retries=3, backoff=0.01) as client:
        reply = client.commit(key, 2, commit)  # the task's next attempt sends the same key
        client.commit(*_commit(2)[:1], 2, _commit(2)[1])
    keys = [k.step for k, _ in store.ledger()]
    assert keys == [0, 1, 2]  # step 1 applied exactly once, whichever request carried it
    assert reply.clock >= 2
    np.testing.assert_array_equal(store.center()[0], np.full(4, 3.0))
