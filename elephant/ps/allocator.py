"""Process memory of the parameter server: glibc's threshold for mapping large blocks on their own.

A parameter server reads every commit into a fresh buffer in whichever
handler thread serves it. With glibc's default, adaptive threshold those
buffers end up in per-thread arenas and stay resident after they are freed,
so a server whose rounds stream many commits at once grows to about one model
per partition. :func:`map_large_allocations` fixes the threshold (``mallopt``)
so that each large block goes back to the system when it is freed. It is a
process-wide setting, asked for by :meth:`elephant.ps.server.PSServer.start`
only where synchronous rounds stream; everywhere else the allocator is left
alone. Plain Python (``ctypes``); a no-op off glibc.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["MMAP_THRESHOLD", "map_large_allocations"]

#: Allocations from this size on get their own memory map (see :func:`map_large_allocations`).
MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def map_large_allocations(threshold: int = MMAP_THRESHOLD) -> bool:
    """Have glibc serve allocations of ``threshold`` bytes and more with their own memory maps.

    Each handler thread reads whole commits into fresh buffers. glibc starts by
    mapping such large blocks on their own, but after the first one is freed it
    raises its threshold (up to 32 MiB), and later blocks come from the arena of
    the thread that asked; freed, they stay resident there. A server of ``P``
    partitions then keeps about ``P`` models resident after one round, although
    it holds only about one at a time (``benchmarks/README.md``, "Synchronous
    rounds and driver memory (benchmarks/sync_memory.py)").
    A fixed threshold returns each large block to the system when it is freed.
    It is set by a server whose store streams synchronous rounds, and stays set
    for the process: it costs the asynchronous server commits per second
    (docs/parameter_server.md, "Guarantees"), which is why only synchronous
    rounds ask for it.

    Leaves the allocator alone where it is not glibc, or where the user set
    ``MALLOC_MMAP_THRESHOLD_`` (glibc's own variable) for this process.

    Returns:
        Whether the threshold was set.
    """
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (macOS, Windows, musl without mallopt)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, int(threshold)))
