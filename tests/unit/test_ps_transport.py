"""elephant.ps.transport: which transport a client gets, and the session path over a real socket."""

from __future__ import annotations

import numpy as np
import pytest
import requests

from elephant.errors import PSError
from elephant.optimizers import Commit, Downpour
from elephant.ps.app import create_app
from elephant.ps.client import PSClient
from elephant.ps.server import PSServer
from elephant.ps.store import CommitKey, Store
from elephant.ps.transport import DirectTransport, SessionTransport, open_transport

RUN = "run-t"
TOKEN = "tok"
TIMEOUT = (5.0, 120.0)


def test_a_plain_http_url_without_a_session_gets_direct_connections():
    transport = open_transport("http://127.0.0.1:40123", TIMEOUT)
    assert isinstance(transport, DirectTransport)
    transport.close()


def test_a_given_session_is_used_and_left_open(monkeypatch):
    closed = []
    monkeypatch.setattr(requests.Session, "close", lambda self: closed.append(self))
    transport = open_transport("http://127.0.0.1:40123", TIMEOUT, requests.Session())
    assert isinstance(transport, SessionTransport)
    transport.close()
    assert closed == []


def test_https_without_a_session_gets_its_own_session_without_proxies_and_closes_it(monkeypatch):
    closed = []
    monkeypatch.setattr(requests.Session, "close", lambda self: closed.append(self))
    transport = open_transport("https://127.0.0.1:40123", TIMEOUT)
    assert isinstance(transport, SessionTransport)
    assert transport._session.trust_env is False
    transport.close()
    assert closed == [transport._session]


def test_the_pooled_session_path_talks_to_a_real_server():
    store = Store([np.zeros(3, dtype=np.float32)], Downpour(), "asynchronous", 1, RUN)
    with PSServer(create_app(store, TOKEN)) as server, \
            PSClient(server.url, TOKEN, session=requests.Session()) as client:
        base = client.pull(0).clock
        reply = client.commit(CommitKey(RUN, 0, 0, 0), 1, Commit([np.ones(3, np.float32)], 1, 1, base))
        assert client.health()["clock"] == reply.clock == 1
    np.testing.assert_array_equal(reply.center[0], np.ones(3, np.float32))
    with pytest.raises(ValueError, match="read-only"):
        reply.center[0][0] = 2.0


def test_a_failure_that_retrying_cannot_mend_is_reported_at_once():
    session = requests.Session()
    session.adapters.clear()  # no adapter for http://
    with PSClient("http://127.0.0.1:40123", TOKEN, session=session, backoff=0.0) as client:
        with pytest.raises(PSError, match=r"health check to parameter server 127\.0\.0\.1:40123 failed: "
                                          r"InvalidSchema: No connection adapters"):
            client.health()
