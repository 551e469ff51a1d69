"""A coverage-guided fuzz campaign of the parameter server's wire decoder (reliability plan T22).

The harness hands each input to ``decode_commit`` (against a two-tensor
template), to ``decode_reply`` and to ``decode`` with the checksum check off:
a sender who has the token can compute a valid checksum (XXH3 detects
corruption, it is not a signature), so the parser behind it must hold on its
own, and without the check the fuzzer's mutations reach it. The only failure allowed is
:class:`elephant.errors.ProtocolError`; any other exception is a crash, and an
input that takes over 50 ms or allocates over 1 MiB beyond the input is one
too. The corpus starts from valid commits and replies, so the fuzzer explores
near-valid messages, which a purely random byte stream would almost never
produce. Not part of CI (the short property tests in
``tests/unit/test_ps_wire_fuzz.py`` are).

Needs atheris (``pip install atheris``; libFuzzer inside, coverage of the
instrumented ``elephant.ps.wire`` and the decoder it uses). Writes ``benchmarks/results/fuzz_wire.json``.

Usage::

    python benchmarks/fuzz_wire.py --seconds 600
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np

STATS: Counter = Counter()
SLOWEST = {"ms": 0.0, "alloc_bytes": 0}
CRASH: list[str] = []
LIMIT_MS, LIMIT_ALLOC = 50.0, 1 << 20


def seeds() -> list[bytes]:
    from elephant.optimizers.base import Commit, Reply
    from elephant.ps import wire

    out = []
    for n in (0, 1, 7, 300):
        tensors = [np.arange(n, dtype=np.float32), np.ones((2, 3), dtype=np.float64)]
        out.append(wire.encode_commit(wire.CommitKey("run", 1, 0, n), 5, Commit(tensors, 2, 64, 3)).tobytes())
        out.append(wire.encode_reply(Reply(clock=n, center=tensors, tensors=None if n % 2 else tensors[:1])).tobytes())
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "fuzz_wire.json"))
    args = parser.parse_args(argv)
    try:
        import atheris
    except ImportError:
        print("atheris is not installed: pip install atheris", file=sys.stderr)
        return 2
    with atheris.instrument_imports():
        from elephant.errors import ProtocolError
        from elephant.ps import decoding, wire

    template = [np.zeros(7, np.float32), np.zeros((2, 3), np.float64)]

    decoders = (lambda b: wire.decode_commit(b, template), wire.decode_reply, lambda b: decoding.decode(b, checksum=False))

    def run_once(data: bytes, count: bool) -> tuple[float, int]:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        started = time.perf_counter()
        for decoder in decoders:
            try:
                decoder(data)
                STATS["accepted"] += count
            except ProtocolError:
                STATS["ProtocolError"] += count
        return (time.perf_counter() - started) * 1e3, tracemalloc.get_traced_memory()[1] - base - len(data)

    def one_input(data: bytes) -> None:
        if time.time() - started > args.seconds:  # libFuzzer's own time limit exits without Python's atexit
            report()
            os._exit(0)
        try:
            checked(data)
        except Exception as exc:  # a crash: say it here, libFuzzer then saves the input and stops
            CRASH.append(f"{type(exc).__name__}: {exc}")
            report()
            raise

    def checked(data: bytes) -> None:
        ms, alloc = run_once(data, True)
        STATS["inputs"] += 1
        if ms > LIMIT_MS:  # a scheduling hiccup is not the input's fault: only a repeatable time counts
            ms = min(run_once(data, False)[0] for _ in range(3))
            STATS["retimed"] += 1
        SLOWEST["ms"], SLOWEST["alloc_bytes"] = max(SLOWEST["ms"], ms), max(SLOWEST["alloc_bytes"], alloc)
        if ms > LIMIT_MS or alloc > LIMIT_ALLOC:
            raise RuntimeError(f"input of {len(data)} bytes took {ms:.1f} ms and {alloc} bytes")

    corpus = tempfile.mkdtemp(prefix="wire-corpus-")
    for i, seed in enumerate(seeds()):
        Path(corpus, f"seed{i}").write_bytes(seed)
    tracemalloc.start()
    started = time.time()

    def report() -> None:
        result = {"seconds": round(time.time() - started, 1), "inputs": STATS["inputs"],
                  "outcomes": {k: v for k, v in STATS.items() if k not in ("inputs", "retimed")},
                  "retimed_after_a_slow_first_run": STATS["retimed"],
                  "max_ms": round(SLOWEST["ms"], 3), "max_alloc_bytes": SLOWEST["alloc_bytes"],
                  "crash": CRASH[0] if CRASH else None, "limits": {"ms": LIMIT_MS, "alloc_bytes": LIMIT_ALLOC}}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))

    atheris.Setup([sys.argv[0], "-rss_limit_mb=2048", "-max_len=8192", corpus], one_input)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
