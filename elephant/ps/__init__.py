"""The parameter server: wire format, store, Flask app, server lifecycle and clients.

Layers, bottom up (each importable without the ones above it):

* :mod:`elephant.ps.wire` -- safetensors-layout messages, strict decoding, no pickle;
* :mod:`elephant.ps.store` -- center weights, clock, idempotency, rounds (no HTTP);
* :mod:`elephant.ps.app` -- Flask app factory, thin authenticated routes;
* :mod:`elephant.ps.server` -- thread-hosted WSGI server with a bounded pool;
* :mod:`elephant.ps.client` -- ``requests`` client with timeouts and safe retries,
  and an in-process client with the same methods.
"""

from elephant.ps.client import InProcessClient, PSClient
from elephant.ps.server import PSServer
from elephant.ps.app import create_app
from elephant.ps.store import CommitKey, RoundTimeoutError, StaleAttemptError, Store, StoreClosedError

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
