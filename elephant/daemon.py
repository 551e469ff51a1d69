"""A PySpark worker daemon that imports Keras' framework before forking workers.

PySpark forks every Python worker from one daemon process. Importing the
framework (TensorFlow, JAX or torch) and Keras once in the daemon, instead of
in every worker, removes seconds from the first task of each worker. The
embedded local session uses it (``spark.python.daemon.module=elephant.daemon``);
on a cluster you may set the same option.

The framework is the one Keras would pick in the daemon's environment
(:func:`elephant.framework.configured_backend`): executors start the daemon
with the fit's ``KERAS_BACKEND`` (``spark.executorEnv.KERAS_BACKEND`` or the
``sc.environment`` elephant sets), one daemon per backend. Only imports
happen here, no device is started (:func:`elephant.framework.preload`; under
torch Keras itself is left to the task, because its import asks CUDA for
devices, which a forked child cannot use).

TensorFlow's C++ start-up lines are kept off the console:
``TF_CPP_MIN_LOG_LEVEL`` is set to 3 unless the user (or
``spark.executorEnv.TF_CPP_MIN_LOG_LEVEL``) set it, and the records that
TensorFlow writes before absl is initialised, which ignore that variable, are
filtered at the same threshold (:func:`elephant.console.quiet_tensorflow_import`).
"""

import os

from elephant import framework
from elephant.console import TF_LOG_ENV, TF_LOG_QUIET

os.environ.setdefault(TF_LOG_ENV, TF_LOG_QUIET)
framework.preload(framework.configured_backend())  # the daemon must start even without the framework

from pyspark import daemon  # noqa: E402

if __name__ == "__main__":
    daemon.manager()
