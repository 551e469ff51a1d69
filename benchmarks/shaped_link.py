"""A bandwidth-shaped link for benchmarks: a network namespace behind a veth pair with ``tc tbf``.

The server side lives in a namespace of its own; the two ends of a veth pair
join it to the host, and a token-bucket filter (``tbf``) on each end's egress
caps both directions at the same rate: the host end's shapes what clients send
(commits in), the namespace end's what the server sends back (replies out).
A process started with :meth:`ShapedLink.command` (``ip netns exec NS ...``)
runs inside it, under its own pid.

It needs ``ip`` and ``tc`` (iproute2), root or CAP_NET_ADMIN, and the kernel's
``veth`` and ``sch_tbf``. :func:`unavailable` says why not where they are
missing; :func:`parse_rate` and :func:`tbf_burst` are the pure decisions.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

__all__ = ["ShapedLink", "parse_rate", "tbf_burst", "unavailable"]

_UNITS = {"": 1, "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "k": 1e3, "m": 1e6, "g": 1e9}


def parse_rate(text: str) -> int:
    """Bits per second of a rate written as tc writes it: ``"100mbit"``, ``"1gbit"``, ``"500kbit"``, ``"2e8"``.

    Raises:
        ValueError: not a positive rate with one of the units bit, kbit, mbit, gbit (or k, m, g).
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", str(text).lower())
    if not match or match.group(2) not in _UNITS or float(match.group(1)) <= 0:
        raise ValueError(f"a rate must look like '100mbit' or '1gbit' (units bit, kbit, mbit, gbit); received {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def tbf_burst(rate_bits: int, seconds: float = 125e-6) -> int:
    """Bucket size in bytes for ``tbf`` at ``rate_bits``: ``seconds`` (0.125 ms) of the rate, at least 4 KiB.

    A wire has no bucket: a message goes at the line rate from its first
    byte. A large bucket lets a small message through at memory speed (a
    128 KiB bucket took 32 KB commits over "100 Mbit/s" at twice the wire's
    speed), while one too small for the timer caps the rate below the one
    asked for (4 KiB at 1 Gbit/s: 1 MB commits 1.6x their wire time, against
    1.2x with 16 KiB). tbf segments GSO packets larger than the bucket, so
    a bucket above one frame (1,514 bytes) is enough to pass traffic.
    """
    return max(4 << 10, int(rate_bits / 8 * seconds))


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=30)


def unavailable() -> str | None:
    """Why a shaped link cannot be made here, or None when it can (a namespace is added and deleted to check)."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found on PATH (iproute2 is needed)"
    if os.geteuid() != 0:
        return f"not root (uid {os.geteuid()}): network namespaces need CAP_NET_ADMIN"
    probe = f"eleph-probe-{os.getpid()}"
    added = _run("ip", "netns", "add", probe)
    if added.returncode:
        return f"`ip netns add` failed: {added.stderr.strip()}"
    _run("ip", "netns", "del", probe)
    return None


class ShapedLink:
    """A namespace ``eleph-ps-<pid>`` joined to the host by a veth pair shaped to ``rate_bits`` each way.

    Addresses: the host end ``10.213.X.1``, the namespace end ``10.213.X.2``
    (``X`` from the pid, so concurrent benchmarks do not clash). Use as a
    context manager; :meth:`close` deletes the pair and the namespace.

    Args:
        rate_bits: rate of each direction in bits per second.
        latency_ms: the longest a packet may wait in the bucket's queue
            (tbf's ``latency``) before it is dropped. Default 200.
    """

    def __init__(self, rate_bits: int, latency_ms: int = 200):
        pid = os.getpid()
        self.rate_bits = int(rate_bits)
        self.namespace = f"eleph-ps-{pid}"
        self._host_end, self._ns_end = f"eph{pid % 100000}h", f"eph{pid % 100000}n"
        subnet = f"10.213.{pid % 250 + 1}"
        self.host_address, self.server_address = f"{subnet}.1", f"{subnet}.2"
        self._latency_ms = latency_ms
        self._open = False

    def _check(self, *args: str) -> None:
        done = _run(*args)
        if done.returncode:
            raise OSError(f"`{' '.join(args)}` failed: {done.stderr.strip()}")

    def open(self) -> ShapedLink:
        ns, host, inner = self.namespace, self._host_end, self._ns_end
        tbf = ("tbf", "rate", f"{self.rate_bits}bit", "burst", str(tbf_burst(self.rate_bits)),
               "latency", f"{self._latency_ms}ms")
        self._open = True
        try:
            self._check("ip", "netns", "add", ns)
            self._check("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
            self._check("ip", "link", "set", inner, "netns", ns)
            self._check("ip", "addr", "add", f"{self.host_address}/30", "dev", host)
            self._check("ip", "link", "set", host, "up")
            self._check("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.server_address}/30", "dev", inner)
            self._check("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
            self._check("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            self._check("tc", "qdisc", "add", "dev", host, "root", *tbf)
            self._check("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", inner, "root", *tbf)
        except BaseException:
            self.close()
            raise
        return self

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace (``ip netns exec`` execs it: the pid is the command's own)."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def close(self) -> None:
        """Delete the veth pair and the namespace. Idempotent."""
        if self._open:
            _run("ip", "link", "del", self._host_end)
            _run("ip", "netns", "del", self.namespace)
            self._open = False

    def __enter__(self) -> ShapedLink:
        return self.open()

    def __exit__(self, *exc_info) -> None:
        self.close()
