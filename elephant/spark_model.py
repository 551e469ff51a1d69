"""SparkModel: fit, predict, evaluate, save and load on the driver."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any


from elephant import framework, session
from elephant.config import FitArgs, Settings, check_verbose, refuse_unsupported
from elephant.errors import ConfigError
from elephant.fit.report import FitReport
from elephant.fit.plan import decide_workers
from elephant.fit.shard_choice import check_requested_shards
from elephant.model_io import load_with_settings, save_with_settings
from elephant.sources import Source, source
from elephant.warmup import WarmUp

log = logging.getLogger(__name__)

__all__ = ["SparkModel", "load"]

def _driver_callbacks(model, callbacks: Sequence[Any] | None):
    """Keras' CallbackList for the begin/end hooks ``evaluate`` and ``predict`` run on the driver."""
    import keras

    if callbacks is not None and not isinstance(callbacks, (list, tuple)):
        raise ConfigError(f"`callbacks` must be a list of keras.callbacks.Callback; received {type(callbacks).__name__}")
    return keras.callbacks.CallbackList(list(callbacks or []), model=model)


def _check_model(model: Any) -> None:
    try:
        import keras
    except ImportError as exc:  # pragma: no cover
        raise ConfigError("elephant needs Keras 3 and a backend for it: pip install 'elephant[tensorflow]' "
                          "(or elephant[jax], elephant[torch])") from exc
    if not isinstance(model, keras.Model):
        raise ConfigError(f"`model` must be a keras.Model; received {type(model).__name__}")
    framework.check_supported(keras.config.backend())
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        raise ConfigError(
            "`model` must be compiled before it is given to SparkModel: call "
            "model.compile(optimizer=..., loss=..., metrics=...) first"
        )


def _reported(field: str, doc: str) -> property:
    """A read-only attribute of the running or last fit's :class:`FitReport` (None before the first fit)."""
    return property(lambda self: None if self.last_report is None else getattr(self.last_report, field), doc=doc)


class SparkModel:
    """Train a compiled Keras model data-parallel on Spark.

    Args:
        model: a compiled ``keras.Model``. After :meth:`fit` it holds the trained
            weights (``sm.model``).
        mode: ``"synchronous"`` (barrier rounds), ``"asynchronous"`` (default;
            commits applied one at a time under a lock) or ``"hogwild"`` (no
            lock; racy by design).
        frequency: ``"epoch"`` (one commit per partition pass), ``"batch"``
            (every step), a positive int (local steps per commit) or None
            (default: the optimizer's own window; for the synchronous and
            asynchronous defaults, decided at the start of each fit from the
            model's size and the cost of a step and a commit, re-decided from
            the first epoch's timings, and logged: see ``comm_budget``).
        optimizer: a name, config dict or :class:`elephant.optimizers.DistributedOptimizer`;
            None (default) means model averaging with block momentum in
            synchronous mode, :class:`~elephant.optimizers.DelayedNesterov` in
            asynchronous mode and DOWNPOUR in hogwild mode; under an adaptive
            optimizer (Adam, RMSprop...) and 2 to 4 workers the first two train the workers at
            ``√K`` times its learning rate instead of the block momentum
            (``sqrt_scaling``; the model keeps its rate), and at 5 to 64 workers with a numeric
            rate the same ramped up over the first epoch (the asynchronous one with windows only);
            where the rate is scaled, the workers' optimizer averages its running magnitude of
            the gradient over ``K`` times the steps (``decay_scaling``: RMSprop's ``rho``, Adam's
            ``beta_2``).
        num_workers: number of partitions trained in parallel; default: the
            input RDD's partitions, else Spark's default parallelism.
        spark: a SparkSession; default: the active one, else an embedded local one.
            Creating a SparkModel starts Spark's Python workers (Keras and its
            backend's framework imported) in the background, once per SparkContext, so the first
            fit does not wait for them (:mod:`elephant.warmup`; the conf
            ``spark.elephant.warmUp=false`` turns it off).
        custom_objects: custom layers/losses needed to rebuild the model on workers.
        read_timeout: seconds a worker waits for a parameter-server reply
            (default 600: a synchronous commit waits for the whole round).
        seed: seed of the shuffle that splits numpy data into shards and of the
            workers' per-epoch shuffles (default 0; None: new shuffles every fit).
        batch_split: whether ``fit(batch_size=B)`` is the global batch, each of
            ``K`` workers training batches of ``ceil(B / K)`` (as Keras'
            distribution strategies read ``batch_size``), or every worker's
            batch. None (default) lets the rule decide: averaging rules
            (``optimizer.splits_batch``: model averaging, EASGD family, DynSGD)
            split, so that the workers together take as many optimizer steps per
            epoch as ``model.fit`` would; DOWNPOUR-like rules, which add every
            delta whole, do not. The choice is logged at the start of each fit.
        overlap: whether a worker keeps training while its commit is in flight
            (the reply is merged when it arrives: the rule's answer plus the
            local progress made meanwhile) instead of waiting for it. Default
            False. True needs a rule that allows it (``optimizer.overlaps``) and
            no ``staleness_bound`` (an SSP admission must stop the worker). It
            hides the round trip of short windows (in synchronous mode, the wait
            for the round to close as well); each delta is then one flight
            staler (docs/architecture.md).
        epoch_retries: how many times an epoch whose barrier Spark job failed
            is trained again from its start (default 2): a synchronous epoch,
            or any epoch of a fit whose epochs run as one job (every worker at
            once, docs/architecture.md). Spark does not retry a barrier stage,
            so a lost executor or task would otherwise end the fit; the
            epochs of a job per epoch that is an ordinary stage are not retried
            here, since Spark already retried their tasks.
        on_failure: what a failed epoch leaves in the center: ``"rollback"``
            (default) returns the center and the rule's server state to the
            epoch's start, and ``sm.model`` keeps the last completed epoch's
            weights; ``"keep"`` keeps the failed epoch's partial progress in
            ``sm.model`` (and does not retry). Either way ``fit`` then raises
            :class:`elephant.FitError`, and the SparkModel can fit again.
        norm_guard: refuse a commit whose L2 norm is over ``norm_guard`` times
            the median of the run's last 64 accepted commits (a corrupted or
            malicious update that passed every other check); None (default)
            turns it off. Refused commits are counted in
            ``sm.last_metrics["commits_norm_refused"]``, and fail their task.
        comm_budget: the share of a worker's time that commits may take when
            the window is decided from the fit's costs (default 0.1): the
            window is the fewest local steps whose compute time is at least
            ``(1 - comm_budget) / comm_budget`` times a commit's, within the
            bounds accuracy needs (at least the rule's own window, at most 128
            steps and at least 8 synchronisations per pass over a partition).
            The decision and its inputs are logged and in ``sm.fit_plan``.
        ps_shards: how many shards the parameter server is split into, each
            serving a slice of the model's tensors to every commit
            (docs/parameter_server.md, "Scaling out: shards"). None (default)
            decides at the start of each fit from the model's bytes, the
            workers and the estimated time between a worker's commits
            (:func:`elephant.ps.shards.choose_shards`: 1 for models of a few
            MB), logged and in ``sm.fit_plan``; an int fixes it. More than 1
            needs a rule whose server step is elementwise (every registered
            rule) and no ``norm_guard`` (else 1 is decided, and a larger
            ``ps_shards`` is refused here). On the driver each shard runs in
            a process of its own (about 50 MB and under a second to start),
            so the shards' commits do not share one interpreter; on the
            executors (``ps_placement``) each in one of the epoch's tasks, at
            most one per worker.
        ps_placement: where the parameter server runs. None (default): on the
            driver in a classic session, in the epoch's tasks under Spark
            Connect. ``"driver"``; or ``"executors"``: each epoch is one
            barrier stage whose first ``ps_shards`` tasks serve the server's
            shards on their executors (train as well), so its CPU and bytes
            are spread over the cluster rather than one host, and a failed
            task fails the epoch, which is trained again
            (docs/parameter_server.md, "Servers on the executors").

    The fit runs on the driver's Keras backend (TensorFlow, JAX or torch); the
    executors' Python workers get the same one (:mod:`elephant.framework`),
    and GPUs that Spark assigns tasks are placed as :mod:`elephant.gpu` says.

    Raises:
        ConfigError: ``model`` is not a compiled ``keras.Model``, Keras runs an
            inference-only backend (numpy, openvino), or a setting is invalid.
    """

    def __init__(
        self,
        model,
        mode: str = "asynchronous",
        frequency: str | int | None = None,
        optimizer: Any = None,
        num_workers: int | None = None,
        spark=None,
        *,
        custom_objects: Mapping[str, Any] | None = None,
        read_timeout: float = 600.0,
        seed: int | None = 0,
        batch_split: bool | None = None,
        overlap: bool = False,
        epoch_retries: int = 2,
        on_failure: str = "rollback",
        norm_guard: float | None = None,
        comm_budget: float = 0.1,
        ps_shards: int | None = None,
        ps_placement: str | None = None,
    ):
        _check_model(model)
        self.model = model
        self.settings = Settings.of(locals())  # the arguments named as Settings' fields
        check_requested_shards(self.settings)
        mismatch = self.optimizer.local_optimizer_mismatch(model.optimizer)
        if mismatch:
            log.warning(mismatch)
        self.custom_objects = dict(custom_objects or {})
        self._spark = spark
        self.job_group: str | None = None  # the running or last fit's Spark job group
        self.last_report: FitReport | None = None  # the running or last fit's report, filled in as it goes
        self._warm_up = WarmUp.start(spark, self.num_workers)  # Python workers start while the user prepares data

    def __getattr__(self, name: str) -> Any:
        """The settings read as attributes (``sm.mode``, ``sm.optimizer``, ``sm.window``, ...)."""
        settings = self.__dict__.get("settings")
        if settings is not None and (name in Settings.names() or name in ("window", "splits_batch")):
            return getattr(settings, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------------ setup
    @property
    def spark(self):
        warm, self._warm_up = self._warm_up, None
        chosen = self._spark is None  # none given: elephant takes the active session, else makes the embedded one
        if warm is not None and chosen:  # it may be making the embedded session: take that one
            warm.ready.wait()
            if warm.made_session:
                session.install_interrupt_handler(warm.session.sparkContext)
            self._spark = warm.session
        if self._spark is None:
            self._spark = session.get_or_create()
        if chosen:  # made by the warm-up's thread (or another): the caller's thread sees it as active too
            session.make_active(self._spark)
        return self._spark

    def get_settings(self) -> dict[str, Any]:
        return self.settings.to_config()

    def __reduce__(self):
        raise TypeError(
            "SparkModel lives on the driver and cannot be pickled into a Spark task; "
            "use sm.model (a keras.Model) or sm.save(path) instead"
        )

    # -------------------------------------------------------------------- fit
    def fit(
        self,
        x,
        y=None,
        batch_size: int | None = None,
        epochs: int = 1,
        verbose: str | int = "auto",
        callbacks: Sequence[Any] | None = None,
        validation_split: float = 0.0,
        validation_data=None,
        shuffle: bool = True,
        class_weight=None,
        sample_weight=None,
        initial_epoch: int = 0,
        steps_per_epoch=None,
        validation_steps=None,
        validation_batch_size: int | None = None,
        validation_freq: int | Sequence[int] = 1,
        *,
        features_col: str | Sequence[str] = "features",
        label_col: str = "label",
        weight_col: str | None = None,
        shuffle_buffer: int | None = None,
        cache=None,
    ):
        """Train on Spark; returns a ``keras.callbacks.History``.

        The arguments are ``keras.Model.fit``'s, in its order and with its
        meaning, for data split across Spark tasks:

        ``x`` may be numpy arrays (``y`` given), a list/dict of arrays for
        multi-input models, an RDD of ``(features, label)`` records or of
        ``(x_block, y_block)`` pairs, or a DataFrame (``features_col``,
        ``label_col``). Sample weights weigh the loss and the compiled
        ``weighted_metrics`` as in Keras: ``sample_weight`` for numpy,
        ``(features, label, weight)`` records or ``(x, y, w)`` blocks in an
        RDD, ``weight_col`` for a DataFrame; ``class_weight`` (a dict from
        class index to weight, single-output models) works with every input
        kind and is turned into sample weights of the training data from the
        labels (sparse or one-hot). ``batch_size`` (default 32) is the global batch when
        the rule splits it among the workers (see ``SparkModel(batch_split=)``).
        Standard Keras callbacks run on the driver at each epoch's end; a
        learning rate they set reaches the workers from the next epoch.
        ``validation_data`` (``(x_val, y_val[, val_sample_weight])``) or
        ``validation_split`` (numpy only; the split keeps its sample weights) is evaluated
        on the driver's copy of the model after every ``validation_freq``-th
        epoch (a DataFrame or an RDD as ``validation_data`` is evaluated on
        Spark instead, read with the fit's column names) (an int, or a list of 1-based epoch numbers), in batches of
        ``validation_batch_size`` (default ``batch_size``). ``initial_epoch``
        starts the epoch count there, as when resuming a run (epochs
        ``initial_epoch`` to ``epochs - 1`` are trained, and History and the
        callbacks see those numbers).

        Each worker reads its partition as a stream and shuffles it every
        epoch through a buffer of ``shuffle_buffer`` samples (default: as many
        as fit in 256 MiB, so a partition that fits is shuffled whole, as one
        permutation); its memory holds the buffer, not the partition. Data
        sorted by label want a buffer that holds the partition, or a shuffle
        before the fit (docs/data.md). Data that live in Spark are read once
        and cached on the executors for the fit at ``cache``, a pyspark
        ``StorageLevel`` (default ``MEMORY_AND_DISK``: what the executors'
        storage memory cannot hold spills to their disks); ``cache=False``
        reads them from their source every epoch, which must then give the
        same rows each time. An RDD or DataFrame with more partitions than
        workers is coalesced (each worker reads several partitions in turn,
        without a shuffle) where the epochs are ordinary stages; otherwise,
        and with fewer partitions, it is repartitioned.

        With a Spark Connect session ``x`` must be a DataFrame: each epoch is
        one barrier stage whose first task hosts the parameter server
        (:mod:`elephant.fit.connect`).

        Raises:
            ConfigError: an invalid setting, ``class_weight`` with sample weights,
                or an argument elephant does not support: ``steps_per_epoch`` and
                ``validation_steps`` (the error says what to do instead), or
                numpy or RDD inputs with a Spark Connect session.
            DataError: data or weights that do not fit the model or each other.
        """
        from elephant.fit.loop import run_fit

        refuse_unsupported("fit", steps_per_epoch=steps_per_epoch, validation_steps=validation_steps)
        args = FitArgs.of(locals())  # the arguments named as FitArgs' fields
        self.last_report = report = FitReport()  # read live by the properties below, during the fit too
        self.job_group = report.job_group
        return run_fit(self.model, self.settings, args, x, y, spark=self._fit_spark, given_spark=self._spark,
                       custom_objects=self.custom_objects, report=report)

    fit_plan = _reported("plan", "Workers, global and per-worker batch, window, the rule's config and "
                                 "``overlap`` of the last fit.")
    ps_url = _reported("ps_url", "The address of the last fit's parameter server (None: not started, or hosted "
                                 "under Spark Connect).")
    last_metrics = _reported("metrics", "The parameter server's ``/metrics`` at the end of the last fit (None while "
                                        "a fit runs).")
    last_ledger = _reported("ledger", "The applied ``(commit key, attempt)`` pairs of the last fit, in order (None "
                                      "while a fit runs).")

    def _fit_spark(self):
        """The session a classic fit runs in (a function: a Connect fit never makes one)."""
        return self.spark

    # ------------------------------------------------------- predict/evaluate
    def predict(self, x, batch_size: int | None = None, verbose: str | int = "auto", steps=None, callbacks=None, *,
                features_col: str | Sequence[str] = "features", prediction_col: str = "prediction"):
        """Predict on Spark, keeping the input order (``keras.Model.predict``'s arguments, in its order).

        numpy in -> numpy out; RDD in -> RDD of predictions (one per record, or
        one array per block); DataFrame in -> the same DataFrame with a
        ``prediction_col`` column. ``callbacks`` get ``on_predict_begin`` and
        ``on_predict_end`` on the driver (the batches run on executors, so no
        batch hooks); ``verbose`` is accepted, and nothing is printed.

        Raises:
            ConfigError: ``steps`` (every sample is predicted), or an invalid ``verbose``.
        """
        from elephant.inference import predict

        refuse_unsupported("predict", steps=steps)
        check_verbose(verbose)
        cbks = _driver_callbacks(self.model, callbacks)
        cbks.on_predict_begin()
        data = source(x)
        out = predict(self.model, x, batch_size, num_workers=self._inference_workers(data),
                      spark=data.spark or self.spark, custom_objects=self.custom_objects,
                      features_col=features_col, prediction_col=prediction_col)
        cbks.on_predict_end()
        return out

    def evaluate(self, x, y=None, batch_size: int | None = None, verbose: str | int = "auto", sample_weight=None,
                 steps=None, callbacks=None, return_dict: bool = False, *,
                 features_col: str | Sequence[str] = "features", label_col: str = "label",
                 weight_col: str | None = None):
        """Loss and metrics computed on Spark (``keras.Model.evaluate``'s arguments and returns).

        Sample weights come as in :meth:`fit`: ``sample_weight`` for numpy,
        records or blocks with weights in an RDD, ``weight_col`` for a
        DataFrame. Partitions are evaluated separately and combined as Keras
        would average them (the loss and plain metrics over the samples,
        ``weighted_metrics`` over the weights): exact for mean-type metrics
        (loss, accuracy, MAE, MSE), not for AUC, precision, recall or F1
        (compute those from :meth:`predict`).
        ``callbacks`` get ``on_test_begin`` and ``on_test_end(logs)`` on the
        driver; ``verbose`` is accepted, and nothing is printed.

        Raises:
            ConfigError: ``steps`` (every sample is evaluated), or an invalid ``verbose``.
            DataError: data or weights that do not fit the model or each other.
        """
        from elephant.inference import evaluate, keras_evaluate_result

        refuse_unsupported("evaluate", steps=steps)
        data = source(x, y)
        data.refuse(sample_weight=sample_weight, weight_col=weight_col)  # before Spark starts
        sample_weight = data.checked_weights(self.model, sample_weight)
        check_verbose(verbose)
        cbks = _driver_callbacks(self.model, callbacks)
        cbks.on_test_begin()
        logs = evaluate(self.model, x, y, batch_size, return_dict=True,
                        num_workers=self._inference_workers(data), spark=data.spark or self.spark,
                        custom_objects=self.custom_objects, features_col=features_col, label_col=label_col,
                        sample_weight=sample_weight, weight_col=weight_col)
        cbks.on_test_end(logs)
        return keras_evaluate_result(logs, return_dict)

    def _inference_workers(self, data: Source) -> int:
        """The partitions numpy is split into (an RDD or a DataFrame keeps its own)."""
        if self.num_workers is not None or data.distributed:
            return decide_workers(self.num_workers, 1)
        if session.is_connect(self.spark):
            return 1  # predict and evaluate say what works under Connect
        return decide_workers(None, data.available_workers(self.spark.sparkContext))

    # ------------------------------------------------------------- save/load
    def save(self, filepath: str) -> None:
        """Write the trained model and the elephant settings to one ``.keras`` file."""
        save_with_settings(self.model, filepath, self.get_settings())


def load(filepath: str, spark=None, custom_objects: Mapping[str, Any] | None = None) -> SparkModel:
    """Rebuild a :class:`SparkModel` saved with :meth:`SparkModel.save`."""
    model, saved = load_with_settings(filepath, custom_objects)
    settings = Settings.from_config(saved)
    return SparkModel(model, spark=spark, custom_objects=custom_objects,
                      **{name: getattr(settings, name) for name in Settings.names()})
