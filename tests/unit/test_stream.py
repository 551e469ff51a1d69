"""The streaming shuffle: every sample once, bounded memory, a seeded order, batches cut across blocks."""

import numpy as np
import pytest

from elephant import stream
from elephant.errors import ConfigError


def _blocks(sizes, weighted=False, start=0):
    out, offset = [], start
    for size in sizes:
        x = np.arange(offset, offset + size, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
        y = np.arange(offset, offset + size)
        out.append((x, y, y.astype(np.float32) / 10) if weighted else (x, y))
        offset += size
    return out


@pytest.mark.parametrize("sizes", [[10], [7, 1, 30, 2], [0, 5, 0, 64], [100] * 9])
@pytest.mark.parametrize("buffer", [1, 8, 50, 1000])
@pytest.mark.parametrize("carry", [0.0, 0.5, 0.9])
def test_every_sample_comes_out_once_with_its_label(sizes, buffer, carry):
    out = list(stream.shuffled(_blocks(sizes, weighted=True), buffer, seed=3, carry=carry))
    x = np.concatenate([b[0] for b in out]) if out else np.zeros((0, 3))
    y = np.concatenate([b[1] for b in out]) if out else np.zeros(0)
    w = np.concatenate([b[2] for b in out]) if out else np.zeros(0)
    assert sorted(y.tolist()) == list(range(sum(sizes)))
    assert (x[:, 0] == y).all() and (x[:, 2] == y).all() and np.allclose(w, y / 10)  # rows stay whole


def test_the_buffer_holds_at_most_itself_and_one_block():
    sizes = [40] * 50
    seen = []

    def counted(blocks):
        for block in blocks:
            seen.append(("in", len(block[1])))
            yield block

    held = 0
    peak = 0
    for block in stream.shuffled(counted(_blocks(sizes)), buffer=100, seed=0):
        held += sum(n for kind, n in seen if kind == "in")
        seen.clear()
        peak = max(peak, held)
        held -= len(block[1])
    assert held == 0 and peak <= 100 + 40  # the buffer, and the block that filled it


def test_the_order_is_a_function_of_the_seed_and_the_blocks():
    first = stream.stream_order([30, 30, 30], buffer=40, seed=7)
    assert (first == stream.stream_order([30, 30, 30], buffer=40, seed=7)).all()  # a retried task replays it
    assert (first != stream.stream_order([30, 30, 30], buffer=40, seed=8)).any()
    assert sorted(first.tolist()) == list(range(90))


def test_a_buffer_larger_than_the_partition_is_one_permutation_of_it():
    order = stream.stream_order([25, 25, 25, 25], buffer=101, seed=1)
    assert (order == np.random.default_rng(1).permutation(100)).all()


def test_a_small_buffer_keeps_samples_near_where_they_were_read():
    order = stream.stream_order([10] * 100, buffer=50, seed=0, carry=0.0)
    displacement = np.abs(order - np.arange(1000))
    assert displacement.max() < 60  # each buffer of 50 (+ the block that filled it) shuffled on its own
    mixed = stream.stream_order([10] * 100, buffer=50, seed=0, carry=0.5)
    assert np.abs(mixed - np.arange(1000)).max() > 60  # what a buffer keeps back travels further


@pytest.mark.parametrize("sizes", [[5, 5, 5], [32], [1] * 70, [0, 33, 31, 0], [100, 3]])
def test_batches_are_cut_across_blocks_in_order(sizes):
    out = list(stream.batches(_blocks(sizes), 32))
    lengths = [len(b[1]) for b in out]
    total = sum(sizes)
    assert lengths == [32] * (total // 32) + ([total % 32] if total % 32 else [])
    assert np.concatenate([b[1] for b in out]).tolist() == list(range(total)) if out else total == 0


@pytest.mark.parametrize("kwargs, message", [
    ({"buffer": 0}, r"`buffer` must be a positive number of samples; received buffer=0"),
    ({"buffer": 2.5}, r"received buffer=2.5"),
    ({"buffer": 10, "carry": 1.0}, r"`carry` must be in \[0, 1\); received carry=1.0"),
])
def test_bad_settings_are_refused_by_name(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        list(stream.shuffled(_blocks([4]), seed=0, **kwargs))


def test_a_bad_batch_size_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"`batch_size` must be a positive int; received batch_size=0"):
        list(stream.batches(_blocks([4]), 0))


def test_the_memory_a_stream_holds_does_not_grow_with_the_partition():
    import tracemalloc

    def blocks(count):  # made as they are read, as a task reads a cached partition: 1 MiB each
        for i in range(count):
            yield np.full((1024, 256), i, dtype=np.float32), np.full(1024, i)

    peaks = []
    for count in (16, 64):  # 16 MiB and 64 MiB partitions, through a buffer of 4 MiB of samples
        tracemalloc.start()
        rows = 0
        for batch in stream.batches(stream.shuffled(blocks(count), buffer=4096, seed=0), 64):
            rows += len(batch[1])
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert rows == count * 1024
    assert peaks[1] < 1.25 * peaks[0] and peaks[1] < 20 * 2**20  # a few buffers, not the 64 MiB partition
