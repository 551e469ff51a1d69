"""numpy / record / block conversions (no Spark, no TF)."""

import numpy as np
import pytest

from elephant import arrow as A
from elephant import data as D
from elephant.errors import DataError


def test_split_numpy_keeps_every_row_once_and_pairs_x_with_y():
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    y = np.arange(10)
    blocks = D.split_numpy(x, y, 3, seed=1)
    assert [len(b[1]) for b in blocks] == [4, 3, 3]
    ys = np.concatenate([b[1] for b in blocks])
    assert sorted(ys.tolist()) == list(range(10))
    for xb, yb in blocks:
        np.testing.assert_array_equal(xb[:, 0], 2 * yb)


def test_split_numpy_without_seed_keeps_order():
    x = np.arange(7)
    blocks = D.split_numpy(x, x, 2, seed=None)
    np.testing.assert_array_equal(np.concatenate([b[0] for b in blocks]), x)


def test_split_numpy_multi_input_dict():
    x = {"a": np.zeros((6, 2)), "b": np.ones((6, 3))}
    blocks = D.split_numpy(x, np.arange(6), 2)
    assert set(blocks[0][0]) == {"a", "b"} and blocks[0][0]["b"].shape == (3, 3)


@pytest.mark.parametrize(
    "x, y, match",
    [
        (np.zeros((0, 3)), np.zeros(0), r"`x` is empty \(0 samples\)"),
        (np.zeros((5, 3)), np.zeros(4), "x has 5 samples, y has 4"),
        ([np.zeros((5, 3)), np.zeros((4, 3))], np.zeros(5), "arrays of `x` have different lengths"),
        (np.array([object(), object()]), np.zeros(2), "object array"),
    ],
)
def test_check_xy_errors(x, y, match):
    with pytest.raises(DataError, match=match):
        D.check_xy(x, y)


class _FakeTensor:
    def __init__(self, shape):
        self.shape = shape


class _FakeModel:
    def __init__(self, *shapes):
        self.inputs = [_FakeTensor(s) for s in shapes]


def test_check_features_names_argument_and_shapes():
    with pytest.raises(DataError, match=r"`x` has feature shape \(5,\) but the model expects \(4,\)"):
        D.check_features(_FakeModel((None, 4)), np.zeros((3, 5)))
    D.check_features(_FakeModel((None, None, 3)), np.zeros((3, 7, 3)))  # None matches any size
    with pytest.raises(DataError, match="the model has 2 inputs but `x` provides 1 arrays"):
        D.check_features(_FakeModel((None, 4), (None, 2)), np.zeros((3, 4)))


def test_records_vs_blocks_decided_by_model_rank():
    record = (np.zeros(4), 1)
    block = (np.zeros((8, 4)), np.zeros(8))
    assert not D.records_are_blocks(record, [(4,)])
    assert D.records_are_blocks(block, [(4,)])
    assert not D.records_are_blocks((np.zeros(4), 1, 0.5), [(4,)])
    assert D.records_are_blocks(block + (np.ones(8),), [(4,)])
    with pytest.raises(DataError, match="must hold \\(features, label\\) or \\(features, label, weight\\) records"):
        D.records_are_blocks(np.zeros(4), [(4,)])
    with pytest.raises(DataError, match="its first element is a tuple of 4 items"):
        D.records_are_blocks((1, 2, 3, 4), [(4,)])


def test_stack_records_and_concat_blocks():
    (x, y), = list(D.stack_records([([1, 2], 0), ([3, 4], 1)]))
    assert x.dtype == np.float32 and x.shape == (2, 2) and y.tolist() == [0, 1]
    assert list(D.stack_records([])) == []
    merged = list(D.concat_blocks([(np.zeros((2, 3)), np.zeros(2)), (np.ones((3, 3)), np.ones(3))]))
    assert len(merged) == 1 and merged[0][0].shape == (5, 3)
    assert list(D.concat_blocks([(np.zeros((0, 3)), np.zeros(0))])) == []


class _Alive:
    count = peak = 0


class _Feature(list):
    """A feature vector that counts how many of its kind exist at once."""

    def __init__(self, values):
        super().__init__(values)
        _Alive.count += 1
        _Alive.peak = max(_Alive.peak, _Alive.count)

    def __del__(self):
        _Alive.count -= 1


def test_records_are_streamed_as_blocks_chunk_by_chunk_never_as_one_list(monkeypatch):
    from elephant import data as D

    monkeypatch.setattr(D, "CHUNK_ROWS", 100)
    _Alive.count = _Alive.peak = 0
    records = ((_Feature([float(i), -float(i)]), i % 3) for i in range(1000))
    stream = D.stack_records(records)
    first = next(stream)  # given out before the rest are read
    assert _Alive.peak <= 2 * 100 + 1 and len(first[0]) == 100
    blocks = [first, *stream]
    assert [len(b[0]) for b in blocks] == [100] * 10
    np.testing.assert_array_equal(np.concatenate([b[0] for b in blocks])[:, 0], np.arange(1000, dtype=np.float32))
    np.testing.assert_array_equal(np.concatenate([b[1] for b in blocks]), np.arange(1000) % 3)
    assert _Alive.peak <= 2 * 100 + 1  # at most the chunk being built and the one just converted
    assert [len(c) for c in D.chunked(range(250), 100)] == [100, 100, 50]


def test_split_numpy_keeps_each_weight_with_its_sample():
    x = np.arange(10, dtype=np.float32)[:, None]
    blocks = D.split_numpy(x, np.arange(10), 3, seed=4, sample_weight=np.arange(10) / 10)
    for xb, yb, wb in blocks:
        np.testing.assert_array_equal(xb[:, 0], yb)
        np.testing.assert_allclose(wb, yb / 10)
    assert D.unpack((x, None))[2] is None and D.unpack(blocks[0])[2] is blocks[0][2]


def test_weighted_records_and_blocks_become_weighted_blocks():
    ((x, y, w),) = D.stack_records([([1, 2], 0, 0.5), ([3, 4], 1, 2.0)])
    assert x.shape == (2, 2) and y.tolist() == [0, 1] and w.dtype == np.float32 and w.tolist() == [0.5, 2.0]
    merged = list(D.concat_blocks([(np.zeros((2, 3)), np.zeros(2), np.ones(2)), (np.ones((1, 3)), np.ones(1), np.zeros(1))]))
    assert merged[0][2].tolist() == [1.0, 1.0, 0.0]
    with pytest.raises(DataError, match="mixes \\(features, label\\) and \\(features, label, weight\\) records"):
        list(D.stack_records([([1, 2], 0, 0.5), ([3, 4], 1)]))
    with pytest.raises(DataError, match="mixes blocks with and without sample weights"):
        list(D.concat_blocks([(np.zeros((2, 3)), np.zeros(2), np.ones(2)), (np.ones((1, 3)), np.ones(1))]))
    with pytest.raises(DataError, match="records hold None, NaN or infinite sample weights"):
        list(D.stack_records([([1, 2], 0, None)]))


@pytest.mark.parametrize("y", [
    np.array([0, 2, 1, 2]),  # sparse
    np.array([[0], [2], [1], [2]]),  # sparse, one column
    np.eye(3)[[0, 2, 1, 2]],  # one-hot
    np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.2, 0.5, 0.3], [0.0, 0.4, 0.6]]),  # probabilities: the arg-max
])
def test_class_weights_are_keras_own(y):
    from keras.src.trainers.data_adapters.data_adapter_utils import class_weight_to_sample_weights

    weights = {0: 1.5, 2: 4.0}  # class 1 missing: weight 1
    mine = D.class_weights_to_sample_weights(y, weights)
    np.testing.assert_array_equal(mine, [1.5, 4.0, 1.0, 4.0])
    np.testing.assert_array_equal(mine, class_weight_to_sample_weights(y, weights))


def test_class_weights_refuse_a_block_that_already_has_weights():
    add = D.add_class_weights({0: 2.0})
    x, y, w = add((np.zeros((2, 3)), np.array([0, 1])))
    assert w.tolist() == [2.0, 1.0]
    with pytest.raises(DataError, match="carries sample weights and `class_weight` was given"):
        add((np.zeros((2, 3)), np.array([0, 1]), np.ones(2)))


# ------------------------------------------------------------------ Arrow columns
def test_arrow_tensor_turns_list_nested_and_scalar_columns_into_sample_arrays():
    import pyarrow as pa

    rows = [[float(i), float(i) + 0.5, -1.0] for i in range(5)]
    column = pa.array(rows, pa.list_(pa.float64()))
    x = A.arrow_tensor(column.slice(1, 3), "features")  # a slice keeps its offsets
    assert x.dtype == np.float32
    np.testing.assert_array_equal(x, np.asarray(rows[1:4], dtype=np.float32))
    images = pa.array([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], pa.list_(pa.list_(pa.int32())))
    np.testing.assert_array_equal(A.arrow_tensor(images, "image"), np.arange(1, 9).reshape(2, 2, 2))
    assert A.arrow_tensor(pa.array([1.5, 2.5]), "x").shape == (2, 1)
    labels = A.arrow_tensor(pa.array([3, 1, 2], pa.int64()), "label", dtype=None)
    assert labels.dtype == np.int64 and labels.tolist() == [3, 1, 2]
    one_hot = A.arrow_tensor(pa.array([[0.0, 1.0], [1.0, 0.0]]), "label", dtype=None)
    assert one_hot.shape == (2, 2)


def test_arrow_tensor_refuses_ragged_arrays_and_nulls_naming_the_column():
    import pyarrow as pa

    with pytest.raises(DataError, match=r"column 'features' holds arrays of different lengths \(2 to 3\)"):
        A.arrow_tensor(pa.array([[1.0, 2.0], [1.0, 2.0, 3.0]]), "features")
    with pytest.raises(DataError, match=r"column 'label' holds 1 null"):
        A.arrow_tensor(pa.array([1, None, 3]), "label", dtype=None)
    with pytest.raises(DataError, match=r"column 'features' holds 1 null element"):
        A.arrow_tensor(pa.array([[1.0, None], [1.0, 2.0]]), "features")


def test_packed_arrays_round_trip_without_pickle():
    x = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    y = np.array([1, 0, 2], dtype=np.int64)
    w = np.array([0.5, 1.0, 2.0], dtype=np.float32)
    for block in [(x, y), (x, None), (x, y, w), (x[:0], y[:0])]:
        back = A.unpack_arrays(A.pack_arrays(block))
        assert len(back) == len(block)
        for a, b in zip(block, back, strict=True):
            if a is None:
                assert b is None
            else:
                assert b.dtype == a.dtype and b.shape == a.shape and b.flags.writeable
                np.testing.assert_array_equal(a, b)


def test_arrow_tensor_refuses_text_columns():
    import pyarrow as pa

    with pytest.raises(DataError, match=r"column 'label' holds string values; expected numbers"):
        A.arrow_tensor(pa.array(["cat", "dog"]), "label", dtype=None)
