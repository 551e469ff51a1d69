"""A PySpark worker daemon that imports TensorFlow before forking workers.

PySpark forks every Python worker from one daemon process. Importing
TensorFlow and Keras once in the daemon, instead of in every worker, removes
several seconds from the first task of each worker. The embedded local session
uses it (``spark.python.daemon.module=elephant.daemon``); on a cluster you may
set the same option.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

try:  # importing is enough: no TensorFlow threads or devices are started here
    import keras  # noqa: F401
    import tensorflow  # noqa: F401
except ImportError:  # pragma: no cover - the daemon must start even without TF
    pass

from pyspark import daemon  # noqa: E402

if __name__ == "__main__":
    daemon.manager()
