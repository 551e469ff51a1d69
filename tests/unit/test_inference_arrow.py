"""The executor side of predict(df): batches grouped, whole batches predicted (no Spark)."""

import numpy as np

from elephant.inference import _grouped, padded_predict


def test_arrow_batches_are_grouped_in_order_up_to_the_row_count():
    columns = [list(range(n)) for n in (4, 3, 5, 1, 2)]
    groups = list(_grouped(iter(columns), rows=7))
    assert [[len(c) for c in g] for g in groups] == [[4, 3], [5, 1, 2]]
    assert [c for g in groups for c in g] == columns
    assert list(_grouped(iter([]), rows=7)) == []


def test_padded_predict_equals_predict_and_keeps_one_batch_shape():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    x = np.random.default_rng(0).normal(size=(11, 3)).astype(np.float32)
    shapes = []
    original = model.predict

    def spy(data, batch_size=None, verbose=0):
        shapes.append((len(data), batch_size))
        return original(data, batch_size=batch_size, verbose=verbose)

    model.predict = spy
    for n in (11, 8, 1):
        np.testing.assert_allclose(padded_predict(model, x[:n], 4), original(x[:n], verbose=0), rtol=1e-6)
    assert shapes == [(12, 4), (8, 4), (4, 4)]  # every call in whole batches of 4
