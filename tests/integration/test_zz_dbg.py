import time, os, numpy as np
from elephant.ensemble import Ensemble
from .test_ensemble import members  # noqa
def test_dbg(spark, digits, members):
    _, x_test, _, y_test = digits
    ens = Ensemble(members, spark=spark)
    sc = spark.sparkContext
    records = sc.parallelize(list(zip(x_test, y_test.tolist())), 3)
    T = time.monotonic
    for i in range(3):
        t = T(); r = ens.predict(records).collect(); print("collect", round(T() - t, 2))
