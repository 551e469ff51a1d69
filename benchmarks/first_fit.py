"""The first fit of a fresh session: how long ``fit`` takes from call to return.

Each scenario runs in a fresh Python process (nothing imported, no JVM, no Python
workers), builds a small MLP on 2,000 samples of scikit-learn's digits and fits
1 epoch on 2 workers, then fits again (the warm figure):

* ``no session``: the script never makes a session; ``SparkModel(model)`` then
  ``fit``, at once or after G s (elephant makes the embedded session);
* ``session, fit at once``: the script makes its session, then ``SparkModel``
  and ``fit`` at once;
* ``session, fit after G s``: as above with G seconds between ``SparkModel(...)``
  and ``fit`` (the user preparing data, or the next notebook cell);
* the same two with ``spark.elephant.warmUp=false`` (what a first fit cost before
  the warm-up existed).

Reported: seconds from the ``fit`` call to its return, from ``SparkModel(...)`` to
the return, and the second fit. Writes ``benchmarks/results/first_fit.json``.

Usage::

    python benchmarks/first_fit.py [--gap 10] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

SCENARIOS = [
    ("no session, fit at once", dict(session=False, gap=0.0, warm=True)),
    ("no session, fit after gap", dict(session=False, gap=None, warm=True)),
    ("session, fit at once", dict(session=True, gap=0.0, warm=True)),
    ("session, fit after gap", dict(session=True, gap=None, warm=True)),
    ("session, fit at once, no warm-up", dict(session=True, gap=0.0, warm=False)),
    ("session, fit after gap, no warm-up", dict(session=True, gap=None, warm=False)),
]

CHILD = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["PYSPARK_PYTHON"] = sys.executable
args = json.loads(sys.argv[1])
import numpy as np
import keras
from sklearn.datasets import load_digits
from elephant import SparkModel
spark = None
if args["session"]:
    from pyspark.sql import SparkSession
    builder = SparkSession.builder.master("local[2]").appName("first-fit")
    for key, value in {"spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1",
                       "spark.driver.bindAddress": "127.0.0.1", "spark.ui.showConsoleProgress": "false",
                       "spark.elephant.warmUp": str(args["warm"]).lower()}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
x, y = load_digits(return_X_y=True)
x = np.concatenate([x, x])[:2000].astype("float32") / 16.0
y = np.concatenate([y, y])[:2000]
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
t0 = time.perf_counter()
sm = SparkModel(model, num_workers=2, spark=spark)
time.sleep(args["gap"])
t1 = time.perf_counter()
history = sm.fit(x, y, epochs=1, batch_size=64, verbose=0)
t2 = time.perf_counter()
sm.fit(x, y, epochs=1, batch_size=64, verbose=0)
t3 = time.perf_counter()
print("RESULT " + json.dumps({"fit": t2 - t1, "from_spark_model": t2 - t0, "second_fit": t3 - t2,
                              "accuracy": float(history.history["accuracy"][-1])}))
"""


def run(settings: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(settings)], capture_output=True, text=True, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"scenario {settings} failed:\n{out.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gap", type=float, default=10.0, help="seconds between SparkModel(...) and fit")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    rows = []
    for repeat in range(args.repeats):
        for name, settings in SCENARIOS:
            settings = dict(settings, gap=args.gap if settings["gap"] is None else settings["gap"])
            result = run(settings)
            label = name.replace("gap", f"{settings['gap']:g} s")
            rows.append(dict(name=label, repeat=repeat, **settings, **result))
            print(f"{label:42s} fit {result['fit']:6.2f} s   from SparkModel() {result['from_spark_model']:6.2f} s"
                  f"   second fit {result['second_fit']:5.2f} s", flush=True)
    summary: dict[str, dict[str, float]] = {}
    for row in rows:
        entry = summary.setdefault(row["name"], {"fit": [], "from_spark_model": [], "second_fit": []})
        for key in entry:
            entry[key].append(row[key])
    summary = {name: {key: min(values) for key, values in entry.items()} for name, entry in summary.items()}
    print("\nbest of", args.repeats)
    for name, entry in summary.items():
        print(f"{name:42s} fit {entry['fit']:6.2f} s   from SparkModel() {entry['from_spark_model']:6.2f} s")
    os.makedirs(RESULTS, exist_ok=True)
    env = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
           "date": time.strftime("%Y-%m-%d")}
    with open(os.path.join(RESULTS, "first_fit.json"), "w") as f:
        json.dump({"environment": env, "gap": args.gap, "rows": rows, "best": summary}, f, indent=2)


if __name__ == "__main__":
    main()
