"""elephant.ml: Spark ML pipeline stages around SparkModel (Pipeline, CrossValidator, persistence)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from elephant.errors import ConfigError

from .helpers import digits_model

FEATURES = [f"p{i}" for i in range(64)]


@pytest.fixture(scope="module")
def frames(spark, digits):
    import pandas as pd

    def frame(x, y):
        pdf = pd.DataFrame(x, columns=FEATURES)
        pdf["label"] = y
        pdf["id"] = np.arange(len(y))
        return spark.createDataFrame(pdf)

    x_train, x_test, y_train, y_test = digits
    return frame(x_train, y_train), frame(x_test, y_test)


def pipeline(estimator):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import StandardScaler, VectorAssembler

    return Pipeline(stages=[VectorAssembler(inputCols=FEATURES, outputCol="raw"),
                            StandardScaler(inputCol="raw", outputCol="scaled"), estimator])


def test_a_pipeline_trains_predicts_class_indices_and_round_trips_through_save_and_load_in_a_new_session(spark, frames, tmp_path):
    from pyspark.ml import PipelineModel
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator

    from elephant.ml import KerasEstimator

    train, test = frames
    user_model = digits_model(lr=3e-3)
    before = [w.copy() for w in user_model.get_weights()]
    est = KerasEstimator(model=user_model, featuresCol="scaled", epochs=4, batchSize=32, numWorkers=2,
                         validationSplit=0.1, mode="synchronous", frequency=4)
    fitted = pipeline(est).fit(train)
    assert all((a == b).all() for a, b in zip(before, user_model.get_weights(), strict=True))  # the user's model is untouched
    stage = fitted.stages[-1]
    assert len(stage.history["loss"]) == 4 and "val_accuracy" in stage.history  # epochs, validationSplit
    assert stage.fit_plan["mode"] == "synchronous" and stage.fit_plan["window"] == 4  # mode, frequency
    assert stage.fit_plan["num_workers"] == 2 and stage.fit_plan["batch_size"] == 32  # numWorkers, batchSize
    predicted = fitted.transform(test)
    assert predicted.columns == test.columns + ["raw", "scaled", "prediction", "probability"]
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(predicted)
    assert accuracy > 0.85  # 0.95 in a trial run
    rows = predicted.orderBy("id").select("prediction", "probability").toPandas()
    probabilities = np.stack([v.toArray() for v in rows["probability"]])
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(rows["prediction"].to_numpy(), probabilities.argmax(axis=1).astype(float))

    fitted.write().overwrite().save(str(tmp_path / "pipeline"))
    loaded = PipelineModel.load(str(tmp_path / "pipeline"))
    again = loaded.transform(test).orderBy("id").select("prediction", "probability").toPandas()
    np.testing.assert_array_equal(again["prediction"].to_numpy(), rows["prediction"].to_numpy())
    np.testing.assert_allclose(np.stack([v.toArray() for v in again["probability"]]), probabilities, atol=1e-6)

    # ... and in a new session of another process, as a scoring job would load it
    test.write.parquet(str(tmp_path / "test"))
    run = subprocess.run([sys.executable, "-c", RELOAD, str(tmp_path)], capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYSPARK_PYTHON": sys.executable, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert run.returncode == 0, run.stderr[-3000:]
    fresh = spark.read.parquet(str(tmp_path / "scored")).orderBy("id").toPandas()
    np.testing.assert_array_equal(fresh["prediction"].to_numpy(), rows["prediction"].to_numpy())
    np.testing.assert_allclose(np.stack(fresh["probability"].to_numpy()), probabilities, atol=1e-6)


RELOAD = """
import sys
from pyspark.ml import PipelineModel
from pyspark.ml.functions import vector_to_array
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
model = PipelineModel.load(sys.argv[1] + "/pipeline")
scored = model.transform(spark.read.parquet(sys.argv[1] + "/test"))
scored.select("id", "prediction", vector_to_array("probability").alias("probability")).write.parquet(sys.argv[1] + "/scored")
"""


def test_cross_validation_and_train_validation_split_pick_from_a_grid(spark, frames):
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder, TrainValidationSplit

    from elephant.ml import KerasEstimator

    train, _ = frames
    est = KerasEstimator(model=digits_model(lr=3e-3), featuresCol="scaled", batchSize=64, numWorkers=2,
                         predictionCol="label_hat", probabilityCol="")
    grid = ParamGridBuilder().addGrid(est.epochs, [1, 4]).build()
    evaluator = MulticlassClassificationEvaluator(metricName="accuracy", predictionCol="label_hat")
    cv = CrossValidator(estimator=pipeline(est), estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, seed=0)
    model = cv.fit(train)
    assert len(model.avgMetrics) == 2 and model.avgMetrics[1] > model.avgMetrics[0]  # more epochs, better
    assert len(model.bestModel.stages[-1].history["loss"]) == 4
    tvs = TrainValidationSplit(estimator=pipeline(est), estimatorParamMaps=grid, evaluator=evaluator, seed=0)
    assert len(tvs.fit(train).validationMetrics) == 2
    assert "probability" not in model.transform(train).columns  # probabilityCol="" adds none


def test_regression_predicts_a_double_that_the_regression_evaluator_reads(spark, capsys):
    import keras
    import pandas as pd
    from pyspark.ml.evaluation import RegressionEvaluator
    from pyspark.ml.feature import VectorAssembler
    from sklearn.datasets import load_diabetes

    from elephant.ml import KerasEstimator

    x, y = load_diabetes(return_X_y=True)
    df = spark.createDataFrame(pd.DataFrame(np.c_[x, y], columns=[f"f{i}" for i in range(10)] + ["target"]))
    df = VectorAssembler(inputCols=[f"f{i}" for i in range(10)], outputCol="features").transform(df)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.05), "mse")
    capsys.readouterr()
    fitted = KerasEstimator(model=model, task="regression", labelCol="target", epochs=30, batchSize=32,
                            numWorkers=2, verbose=2).fit(df)
    assert "Epoch 30/30" in capsys.readouterr().out  # verbose reaches Keras' progress display
    predicted = fitted.transform(df)
    assert dict(predicted.dtypes)["prediction"] == "double"
    rmse = RegressionEvaluator(labelCol="target", metricName="rmse").evaluate(predicted)
    assert rmse < 0.8 * float(np.std(y))  # better than predicting the mean


def test_bad_params_and_models_are_refused_naming_them(spark, frames):
    from elephant.ml import KerasEstimator

    train, _ = frames
    with pytest.raises(ConfigError, match=r"`epochs` must be a positive int; received epochs=0"):
        KerasEstimator(model=digits_model(), epochs=0).fit(train)
    with pytest.raises(ConfigError, match=r"`task` must be one of .*received task='clustering'"):
        KerasEstimator(model=digits_model(), task="clustering").fit(train)
    with pytest.raises(ConfigError, match="nonsense"):  # optimizer reaches SparkModel
        KerasEstimator(model=digits_model(), optimizer="nonsense").fit(train)
    with pytest.raises(ConfigError,
                       match=r"`ps_placement` must be one of .*received ps_placement='gpu' \(the Param psPlacement\)"):
        KerasEstimator(model=digits_model(), psPlacement="gpu").fit(train)
    with pytest.raises(ConfigError,
                       match=r"`ps_shards` must be a positive int or None .*ps_shards=-1 \(the Param psShards\)"):
        KerasEstimator(model=digits_model(), psShards=-1).fit(train)
    with pytest.raises(ConfigError, match="needs `model`"):
        KerasEstimator().fit(train)
    with pytest.raises(ConfigError, match="not both"):
        KerasEstimator(model=digits_model(), build_fn=digits_model)
    with pytest.raises(ConfigError, match="cannot be saved"):
        KerasEstimator(build_fn=digits_model).write().save("/nonexistent/elephant-estimator")


def test_the_parameter_server_params_reach_the_fit(spark, frames):
    """psShards and psPlacement: two shards served from the tasks of each epoch, as SparkModel takes them."""
    from elephant.ml import KerasEstimator

    train, _ = frames
    est = KerasEstimator(model=digits_model(), featuresCol="scaled", epochs=1, numWorkers=2, psShards=2,
                         psPlacement="executors")
    stage = pipeline(est).fit(train).stages[-1]
    assert stage.fit_plan["ps_shards"] == 2 and stage.fit_plan["ps_placement"] == "executors"
    assert len(stage.history["loss"]) == 1 and np.isfinite(stage.history["loss"][0])
    default = KerasEstimator(model=digits_model(), featuresCol="scaled", epochs=1, numWorkers=2)
    assert pipeline(default).fit(train).stages[-1].fit_plan["ps_placement"] == "driver"
