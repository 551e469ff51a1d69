"""The driver side of a fit.

================  ===========================================================
module            concern
================  ===========================================================
``plan``          workers, window, batch split and the rule: decided once
``shard_choice``  how many parameter-server shards, and when only one
``epoch``         one epoch's Spark job as a transaction; failure text
``loop``          the epochs: input checks, store, callbacks, validation
``progress``      Keras' callbacks and progress bar; the epoch's logs
``backup``        ``BackupAndRestore`` through elephant's checkpoints
``classic``       the Spark side in a classic session (server on the driver)
``connect``       the Spark side under Spark Connect (server in a task)
``runner``        the interface both Spark sides implement
``simulated``     a whole fit played in one process (no Spark, no HTTP)
``report``        what a fit reports back (:class:`FitReport`)
================  ===========================================================

The two Spark sides (``classic`` and ``connect``) implement one interface,
:class:`~elephant.fit.runner.SparkSide` (``runner``).

Importing the package costs nothing: each module is imported where it is used.
"""
