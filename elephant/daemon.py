"""A PySpark worker daemon that imports TensorFlow before forking workers.

PySpark forks every Python worker from one daemon process. Importing
TensorFlow and Keras once in the daemon, instead of in every worker, removes
several seconds from the first task of each worker. The embedded local session
uses it (``spark.python.daemon.module=elephant.daemon``); on a cluster you may
set the same option.

TensorFlow's C++ start-up lines are kept off the console:
``TF_CPP_MIN_LOG_LEVEL`` is set to 3 unless the user (or
``spark.executorEnv.TF_CPP_MIN_LOG_LEVEL``) set it, and the records that
TensorFlow writes before absl is initialised, which ignore that variable, are
filtered at the same threshold (:func:`elephant.console.quiet_tensorflow_import`).
"""

import os

from elephant.console import TF_LOG_ENV, TF_LOG_QUIET, quiet_tensorflow_import

os.environ.setdefault(TF_LOG_ENV, TF_LOG_QUIET)

try:  # importing is enough: no TensorFlow threads or devices are started here
    with quiet_tensorflow_import():
        import keras  # noqa: F401
        import tensorflow  # noqa: F401
except ImportError:  # pragma: no cover - the daemon must start even without TF
    pass

from pyspark import daemon  # noqa: E402

if __name__ == "__main__":
    daemon.manager()
