"""The parameter server: wire format, store, Flask app, server lifecycle and clients.

Layers, bottom up (each importable without the ones above it):

* :mod:`elephant.ps.wire` -- safetensors-layout messages, strict decoding, no pickle, built on
  :mod:`~elephant.ps.layout` (header constants, dtypes, checksums), :mod:`~elephant.ps.encoding` and
  :mod:`~elephant.ps.decoding`;
* :mod:`elephant.ps.store` -- center weights, clock, idempotency, rounds (no HTTP), composed of
  :mod:`~elephant.ps.rounds`, :mod:`~elephant.ps.ledger` (applied commits, fences),
  :mod:`~elephant.ps.guard` (the norm guard), :mod:`~elephant.ps.metrics` (counters),
  :mod:`~elephant.ps.waits` (the requests' waits), :mod:`~elephant.ps.view` (the workers' view
  of the center under compressed replies), :mod:`~elephant.ps.snapshots` (``Snapshot`` and
  ``Outcome``) and :mod:`~elephant.ps.checks` (the checks of a request, a commit and a rule's result);
* :mod:`elephant.ps.app` -- Flask app factory, thin authenticated routes;
* :mod:`elephant.ps.gate` -- one selector thread that reads request heads and checks the token;
* :mod:`elephant.ps.http` -- a bounded pool of keep-alive handlers behind the gate;
* :mod:`elephant.ps.server` -- the server's lifecycle in a driver thread (port 0, readiness, stop);
* :mod:`elephant.ps.transport` -- how a client's bytes travel (its own connections, or a session);
* :mod:`elephant.ps.client` -- HTTP client with timeouts and safe retries, and an
  in-process client with the same methods.
* :mod:`elephant.ps.shards` -- which rows of which tensors each shard of a sharded
  server holds, and how many shards (pure decisions);
* :mod:`elephant.ps.shard_client` -- one store per shard, and a client with the same
  methods that sends each request to every shard in parallel;
* :mod:`elephant.ps.sharded_store` -- the driver's view of the shards' stores, with the
  store methods a fit uses.
* :mod:`elephant.ps.shard_process` -- one shard in a process of its own on the driver
  host, steered over a pipe through the same store methods.

Names are loaded lazily, so a Spark task importing the client never imports Flask.
"""

from __future__ import annotations

import importlib

__all__ = [
    "CommitKey",
    "InProcessClient",
    "PSClient",
    "PSServer",
    "RoundTimeoutError",
    "StaleAttemptError",
    "Store",
    "StoreClosedError",
    "create_app",
]

_LAZY = {
    "CommitKey": "elephant.ps.wire",
    "InProcessClient": "elephant.ps.client",
    "PSClient": "elephant.ps.client",
    "PSServer": "elephant.ps.server",
    "RoundTimeoutError": "elephant.errors",
    "StaleAttemptError": "elephant.errors",
    "Store": "elephant.ps.store",
    "StoreClosedError": "elephant.errors",
    "create_app": "elephant.ps.app",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'elephant.ps' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
