"""One small Spark fit per Keras backend: each mode's default ends where the user's own ``model.fit`` does.

Under TensorFlow (the default suite) the integration tests cover this, so the module
runs only when the process's backend is another one (``.ci/run`` runs ``tests/backends``
under JAX and under torch). One ``local[2]`` session, its Python workers forked from
elephant's daemon, which preloads the configured framework.
"""

from __future__ import annotations

import keras
import pytest

from tests.integration.helpers import accuracy, digits_model, digits_split, local_session, plain_keras_accuracy

BACKEND = keras.config.backend()

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(BACKEND == "tensorflow", reason="TensorFlow's Spark fits are tests/integration's"),
    # JAX warns at every fork of a process where it has started, and PySpark starts the driver's JVM by a
    # fork that execs at once (subprocess with a preexec_fn): harmless there, and this module's only fork
    pytest.mark.filterwarnings(r"ignore:os\.fork\(\) was called:RuntimeWarning"),
]

EPOCHS = 4


@pytest.fixture(scope="module")
def spark():
    session = local_session("local[2]", f"elephant-backend-{BACKEND}")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def digits():
    return digits_split()


@pytest.fixture(scope="module")
def plain_accuracy(digits):
    return plain_keras_accuracy(digits, EPOCHS)


def test_python_workers_run_the_drivers_backend(spark):
    def probe(_):
        import keras as worker_keras

        yield worker_keras.config.backend()

    seen = spark.sparkContext.parallelize(range(2), 2).mapPartitions(probe).collect()
    assert seen == [BACKEND, BACKEND]


@pytest.mark.parametrize("mode", ["synchronous", "asynchronous"])
def test_default_matches_plain_keras(spark, digits, plain_accuracy, mode):
    from elephant import SparkModel

    x_train, x_test, y_train, y_test = digits
    sm = SparkModel(digits_model(), mode=mode, num_workers=2, spark=spark)
    history = sm.fit(x_train, y_train, epochs=EPOCHS, batch_size=32, verbose=0)
    acc = accuracy(sm.model, x_test, y_test)
    assert len(history.history["loss"]) == EPOCHS
    assert history.history["loss"][-1] < history.history["loss"][0]
    # 3 points: 13-14 of the 450 test samples
    assert acc >= plain_accuracy - 0.03, f"{BACKEND}/{mode}: {acc:.3f} against plain Keras' {plain_accuracy:.3f}"
