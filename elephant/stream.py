"""A partition's samples as a stream: blocks in, shuffled batches out, in bounded memory.

A task reads its partition as an iterator of blocks (``(x, y)`` or ``(x, y, w)``,
:mod:`elephant.data`). :func:`shuffled` mixes them through a buffer of about
``buffer`` samples instead of concatenating the partition and permuting it: the
memory it holds is the buffer and one block, whatever the partition's size. Its
order is a function of the seed and of the blocks (their sizes and contents, in
the order they come), so a retried task that reads the same blocks trains the
same samples in the same order. A buffer larger than the partition is
one permutation of all of it, as a full shuffle. :func:`batches` cuts the
stream into the pass's batches; :func:`stream_order` is the order a stream
gives to a partition of known block sizes, for the simulator and the shuffle
benchmark (``benchmarks/shuffle_quality.py``).

How far a buffer's order is from a full shuffle depends on how the data are
laid out (label-sorted partitions are the worst case): docs/data.md has the
measurements.
"""

from __future__ import annotations

import hashlib
import sys
import zlib
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from elephant import data as D
from elephant.config import check_positive_int
from elephant.errors import ConfigError

__all__ = ["BUFFER_BYTES", "batches", "buffer_samples", "describe_buffer", "first_rows", "pass_blocks", "pass_order",
           "shuffle_key", "shuffle_order", "shuffle_seed", "shuffled", "skip_rows", "stream_order"]

#: The default shuffle buffer of a worker, in bytes of samples: a partition that fits in it is shuffled whole, as
#: one permutation (docs/data.md, "The shuffle buffer").
BUFFER_BYTES = 256 * 2**20


def buffer_samples(shuffle_buffer: int | None, row_bytes: float) -> int:
    """The samples a worker's shuffle buffer holds: ``fit(shuffle_buffer=)`` where given, else as many samples of
    ``row_bytes`` bytes as :data:`BUFFER_BYTES` holds (at least one)."""
    if shuffle_buffer is not None:
        return shuffle_buffer
    return max(1, int(BUFFER_BYTES // max(row_bytes, 1.0)))


def describe_buffer(buffer: int, partition_samples: Sequence[int], row_bytes: float) -> str:
    """The fit-start log line on the workers' shuffle buffer."""
    largest = max(partition_samples, default=0)
    size = f"{buffer} samples, {buffer * row_bytes / 2**20:.3g} MiB"
    if buffer >= largest:
        return f"shuffle: each partition (at most {largest} samples) shuffled whole every epoch (buffer of {size})"
    return (f"shuffle: each partition (at most {largest} samples) streamed through a shuffle buffer of {size} "
            "(fit(shuffle_buffer=); docs/data.md has how close that is to a full shuffle)")


def shuffled(blocks: Iterable[tuple], buffer: int, seed: int, carry: float = 0.5) -> Iterator[tuple]:
    """The samples of ``blocks``, each once, in blocks shuffled through a buffer of about ``buffer`` samples.

    Blocks join the buffer until it holds ``buffer`` samples or more; its rows
    are then permuted and all but ``int(carry * buffer)`` of them given out, the
    rest staying to mix with the next blocks. At the end what is left is
    permuted and given out. Memory held: the buffer and one block.

    Args:
        blocks: a partition's blocks, in the order they are read.
        buffer: samples the buffer fills to before it gives rows out (at least 1).
        seed: seeds the permutations (one generator for the whole stream).
        carry: the fraction of ``buffer`` kept back after each permutation, in ``[0, 1)``.

    Raises:
        ConfigError: ``buffer`` or ``carry`` out of range.
    """
    if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1:
        raise ConfigError(f"`buffer` must be a positive number of samples; received buffer={buffer!r}")
    if not 0.0 <= carry < 1.0:
        raise ConfigError(f"`carry` must be in [0, 1); received carry={carry!r}")
    rng = np.random.default_rng(seed)
    keep = int(carry * buffer)
    held: list[tuple] = []
    count = 0
    for block in blocks:
        n = D.num_samples(block[0])
        if n == 0:
            continue
        held.append(block)
        count += n
        if count < buffer:
            continue
        merged = next(D.concat_blocks(held))
        held = []  # the blocks go as soon as they are merged; the merged rows as soon as they are dealt
        order = rng.permutation(count)
        out = count - min(keep, count)
        given = D.take_block(merged, order[:out])
        held = [D.take_block(merged, order[out:])] if out < count else []
        del merged
        count -= out
        yield given
    if count:
        merged = next(D.concat_blocks(held))
        held = []
        given = D.take_block(merged, rng.permutation(count))
        del merged
        yield given


def batches(blocks: Iterable[tuple], batch_size: int) -> Iterator[tuple]:
    """Consecutive batches of ``batch_size`` rows cut from ``blocks`` in order (the last may be shorter)."""
    check_positive_int("batch_size", batch_size)
    pending: list[tuple] = []
    count = 0
    for block in blocks:
        n = D.num_samples(block[0])
        start = 0
        if count:  # top up the batch begun by the previous block
            start = min(batch_size - count, n)
            pending.append(D.take_block(block, slice(0, start)))
            count += start
            if count < batch_size:
                continue
            yield next(D.concat_blocks(pending))
            pending, count = [], 0
        while start + batch_size <= n:
            yield D.take_block(block, slice(start, start + batch_size))
            start += batch_size
        if start < n:
            pending, count = [D.take_block(block, slice(start, n))], n - start
    if count:
        yield next(D.concat_blocks(pending))


def skip_rows(blocks: Iterable[tuple], rows: int) -> Iterator[tuple]:
    """The blocks of a stream without its first ``rows`` rows."""
    for block in blocks:
        n = D.num_samples(block[0])
        if rows >= n:
            rows -= n
            continue
        yield D.take_block(block, slice(rows, n)) if rows else block
        rows = 0


def first_rows(blocks: Iterable[tuple], rows: int) -> tuple | None:
    """The first ``rows`` rows of a stream as one block (fewer where it ends first; None where it holds none);
    it reads no block past them."""
    taken: list[tuple] = []
    blocks = iter(blocks)
    while rows > 0 and (block := next(blocks, None)) is not None:
        n = D.num_samples(block[0])
        taken.append(block if n <= rows else D.take_block(block, slice(0, rows)))
        rows -= n
    return next(D.concat_blocks(taken), None)


def stream_order(block_sizes: Sequence[int], buffer: int, seed: int, carry: float = 0.5) -> np.ndarray:
    """The positions of a partition's samples (0 .. sum - 1, as read) in the order :func:`shuffled` gives them."""
    bounds = np.cumsum([0, *block_sizes])
    blocks = ((np.arange(a, b), None) for a, b in zip(bounds[:-1], bounds[1:], strict=True))
    parts = [block[0] for block in shuffled(blocks, buffer, seed, carry)]
    return np.concatenate(parts) if parts else np.arange(0)


def shuffle_key(seed: int | None, weights: list) -> str:
    """What seeds the workers' per-epoch shuffles: the fit's seed and the weights it starts from.

    The same seed from the same weights replays the same orders (a model built
    again with the same seed included: layer names play no part), so a fit is
    as reproducible as its rounds' timing allows, and
    :func:`~elephant.optimizers.simulate_fit` replays a Spark fit's orders; a
    later fit of the same model starts from other weights and shuffles anew,
    as a second ``model.fit`` does. A seed of None gives "": the run id then
    seeds the shuffles, new at every fit.
    """
    if seed is None:
        return ""
    digest = hashlib.blake2b(digest_size=8)
    for w in weights:
        digest.update(np.ascontiguousarray(w).tobytes())
    return f"seed{seed}/{digest.hexdigest()}"


def shuffle_seed(key: str, epoch: int, partition: int) -> int:
    """The seed of a partition's shuffle in one epoch of one fit (stable across processes, unlike ``hash``).

    ``key`` is the fit's ``TaskSpec.shuffle_key``: its ``SparkModel(seed=)``
    with a digest of the weights it starts from, so that the same seed
    and start replay the same samples in the same order, and a later fit of
    the same model shuffles anew; or the run id, when the seed is None.
    """
    return zlib.crc32(f"{key}/{epoch}/{partition}".encode())


def shuffle_order(key: str, epoch: int, partition: int, n: int) -> np.ndarray:
    """The order in which a partition of ``n`` samples is trained in one epoch (seeded by :func:`shuffle_seed`)."""
    return np.random.default_rng(shuffle_seed(key, epoch, partition)).permutation(n)


def pass_order(key: str | None, epoch: int, partition: int, n: int, buffer: int | None = None) -> np.ndarray:
    """The order in which a partition of ``n`` samples held as one block is trained in ``epoch``: shuffled with the
    fit's ``key`` through a buffer of ``buffer`` samples (None: the whole partition, :func:`shuffle_order`), as
    :func:`pass_blocks` gives it, or as it is where ``key`` is None (``shuffle=False``)."""
    if key is None:
        return np.arange(n)
    if buffer is None or buffer >= n:
        return shuffle_order(key, epoch, partition, n)
    return stream_order([n], buffer, shuffle_seed(key, epoch, partition))


def pass_blocks(blocks: Iterable[tuple], key: str | None, epoch: int, partition: int,
                buffer: int | None = None) -> Iterator[tuple]:
    """A partition's rows in the order its task trains them in ``epoch``, as a stream of blocks: shuffled with the
    fit's ``key`` through a buffer of ``buffer`` samples (None: the whole partition) seeded by
    :func:`shuffle_seed`, or as they are read where ``key`` is None (``shuffle=False``). The order is a function of
    the seed and of the blocks, so a retried task that reads the same blocks trains the same rows in the same
    order."""
    blocks = D.checked_blocks(blocks)
    if key is None:
        return blocks
    return shuffled(blocks, sys.maxsize if buffer is None else buffer, shuffle_seed(key, epoch, partition))
