"""One picklable exception tree for elephant.

Only text crosses reliably from a Spark task to the driver, so every message
stands on its own: it names the argument, the partition and attempt, or the
parameter-server address it concerns.
"""

from __future__ import annotations

__all__ = [
    "ElephantError",
    "ConfigError",
    "ScheduleError",
    "DataError",
    "PSError",
    "StaleAttemptError",
    "RolledBackError",
    "RoundTimeoutError",
    "StoreClosedError",
    "Transient",
    "TransportFailed",
    "ProtocolError",
    "NormGuardError",
    "FitError",
]


class ElephantError(Exception):
    """Base class of every error raised by elephant."""

    def __reduce__(self):
        # Keep pickling trivial (Spark ships exceptions between processes):
        # subclasses take a single message argument.
        return (type(self), (str(self),))


class ConfigError(ElephantError, ValueError):
    """A setting is unknown, out of range, or cannot be combined with another."""


class ScheduleError(ConfigError):
    """A schedule is malformed, an event is impossible, or a blocked worker's event came up."""


class DataError(ElephantError, ValueError):
    """Input data is empty, mis-shaped, or does not match the model."""


class PSError(ElephantError, RuntimeError):
    """The parameter server could not be reached or refused a request."""


class StaleAttemptError(PSError):
    """A commit or finish came from a Spark task attempt superseded by a newer one."""


class RolledBackError(StaleAttemptError):
    """The request belongs to an epoch try that the driver rolled back (HTTP 409, as a superseded attempt)."""


class RoundTimeoutError(PSError):
    """A synchronous round or an SSP admission waited longer than ``round_timeout``."""


class StoreClosedError(PSError):
    """The store was closed: the parameter server is stopping."""


class Transient(PSError):
    """A transport failure worth retrying (connection refused or reset, timeout, short body).

    Internal to the HTTP client: raised by a transport's ``send``
    (:mod:`elephant.ps.transport`) and caught by
    :class:`~elephant.ps.client.PSClient`, which retries and, when the retries
    run out, raises a :class:`PSError` naming the request and the server.
    """


class TransportFailed(PSError):
    """A transport failure that retrying cannot mend (a malformed URL, no adapter for the scheme).

    Internal to the HTTP client, as :class:`Transient`:
    :class:`~elephant.ps.client.PSClient` raises it again as a :class:`PSError`
    naming the request and the server.
    """


class ProtocolError(ElephantError, ValueError):
    """A message on the wire is malformed (bad header, count, shape, dtype or value)."""


class NormGuardError(ProtocolError):
    """A commit whose norm is far beyond the run's recent ones (``norm_guard``); nothing was applied."""


class FitError(ElephantError, RuntimeError):
    """An epoch's Spark job failed; the message names the epoch, the cause and what the model holds."""
