"""The executor side of predict: Arrow batches grouped, whole batches predicted (no Spark)."""

import numpy as np

from elephant.inference import _grouped
from elephant.replicas import predict_block


def test_arrow_batches_are_grouped_in_order_up_to_the_row_count():
    columns = [list(range(n)) for n in (4, 3, 5, 1, 2)]
    groups = list(_grouped(iter(columns), rows=7))
    assert [[len(c) for c in g] for g in groups] == [[4, 3], [5, 1, 2]]
    assert [c for g in groups for c in g] == columns
    assert list(_grouped(iter([]), rows=7)) == []


def test_predict_block_equals_predict_and_keeps_one_batch_shape():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    x = np.random.default_rng(0).normal(size=(11, 3)).astype(np.float32)
    shapes = []
    original = model.predict_on_batch

    def spy(data):
        shapes.append(len(data))
        return original(data)

    expected = {n: model.predict(x[:n], batch_size=4, verbose=0) for n in (11, 8, 1)}
    model.predict_on_batch = spy
    for n in (11, 8, 1):
        np.testing.assert_allclose(predict_block(model, x[:n], 4), expected[n], rtol=1e-6)
    assert shapes == [4, 4, 4] + [4, 4] + [4]  # every call a whole batch of 4, the last ones filled up


def test_predict_block_keeps_the_structure_of_inputs_and_outputs():
    import keras

    keras.utils.set_random_seed(0)
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    joined = keras.layers.Concatenate()([a, b])
    model = keras.Model({"a": a, "b": b}, [keras.layers.Dense(2)(joined), keras.layers.Dense(1)(joined)])
    rng = np.random.default_rng(0)
    x = {"a": rng.normal(size=(7, 3)).astype(np.float32), "b": rng.normal(size=(7, 2)).astype(np.float32)}
    got, expected = predict_block(model, x, 4), model.predict(x, batch_size=4, verbose=0)
    assert len(got) == 2 and [g.shape for g in got] == [(7, 2), (7, 1)]
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-6)
