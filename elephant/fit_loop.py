"""The driver side of one fit: data to cached blocks, PS lifecycle, one Spark job per epoch."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import secrets
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from elephant import checkpoint
from elephant import data as D
from elephant import session
from elephant import weights as W
from elephant.errors import ConfigError, DataError, ElephantError, FitError, PSError
from elephant.inference import mean_logs
from elephant.model_io import model_fingerprint, model_to_bytes, structure_fingerprint
from elephant.optimizers.base import overlap_warning, settable_learning_rate, worker_batch_size
from elephant.worker import TaskSpec

log = logging.getLogger(__name__)

__all__ = ["run_fit", "training_rdd", "aggregate_logs"]


def _shape_summary(block) -> list[tuple]:
    return [tuple(a.shape[1:]) for a in D._leaves(block[0])]


def checked_samples(model, parts: Sequence[tuple[int, Sequence[Sequence[int]]]]) -> int:
    """The training samples of the partitions that hold data, ``(samples, feature shapes)`` each, checked.

    Raises:
        DataError: no samples at all, or features whose shapes do not fit the model.
    """
    total = sum(n for n, _ in parts)
    if total == 0:
        raise DataError("`x` holds no samples; elephant needs at least one sample to train")
    shapes = [tuple(s) for s in parts[0][1]]
    D.check_features(model, [np.empty((0,) + s) for s in shapes] if len(shapes) > 1 else np.empty((0,) + shapes[0]))
    return total


def max_body_bytes(template) -> int:
    """The request-body limit of a fit's server: four models (the largest commit) and a MiB of headroom."""
    return 4 * W.nbytes(template) + (1 << 20)


def training_rdd(sm, sc, x, y, *, features_col, label_col, validation_split, sample_weight=None,
                 class_weight=None, weight_col=None):
    """``(rdd_of_blocks, num_workers, validation_data_or_None)``, cached and checked.

    The RDD's ``elephant_samples`` is the number of training samples.

    Sample weights travel in the blocks (``(x, y, w)``); ``class_weight`` is
    turned into sample weights of the training data, as Keras does.
    """
    model = sm.model
    val = None
    if D.is_rdd(x) or D.is_dataframe(x):
        if validation_split:
            raise ConfigError(
                "`validation_split` works with numpy inputs only; for an RDD or DataFrame pass "
                f"validation_data=(x_val, y_val); received validation_split={validation_split!r}"
            )
        if y is not None:
            raise DataError("`y` must be None when `x` is an RDD or a DataFrame (labels travel inside `x`)")
        if sample_weight is not None:
            raise DataError("`sample_weight` must be None when `x` is an RDD or a DataFrame: weights travel inside "
                            "`x`, as (features, label, weight) records or (x, y, w) blocks of an RDD, or a "
                            "DataFrame column named by `weight_col`")
        if weight_col is not None and not D.is_dataframe(x):
            raise DataError(f"`weight_col` names a DataFrame column, but `x` is an RDD; received weight_col={weight_col!r}")
        if D.is_rdd(x):
            num_workers = sm.num_workers or x.getNumPartitions()
            if x.getNumPartitions() != num_workers:
                x = x.repartition(num_workers)
            rdd = x.mapPartitions(D.partition_to_blocks(D.model_input_shapes(model)))
        else:
            num_workers = sm.num_workers or max(1, sc.defaultParallelism)
            df = x if x.rdd.getNumPartitions() == num_workers else x.repartition(num_workers)
            rdd = D.dataframe_blocks(df, features_col, label_col, weight_col)
        if class_weight is not None:
            rdd = rdd.map(D.add_class_weights(class_weight))
        rdd = rdd.cache()
        try:
            with session.job_description(rdd.context, "elephant fit: check and cache the training data"):
                summary = _data_job(rdd.mapPartitions(lambda it: [[(D.num_samples(b[0]), _shape_summary(b)) for b in it]]))
        except DataError:
            D.release(rdd)
            raise
        try:
            rdd.elephant_samples = checked_samples(model, [s[0] for s in summary if s])
        except DataError:
            D.release(rdd)
            raise
        return rdd, num_workers, None

    n = D.check_xy(x, y)
    D.check_features(model, x)
    w = sample_weight  # checked by run_fit (D.check_sample_weight)
    if validation_split:
        cut = int(n * (1.0 - validation_split))
        if cut == 0 or cut == n:
            raise DataError(f"validation_split={validation_split} leaves no training or no validation samples out of {n}")
        val = (D.take(x, slice(cut, None)), D.take(y, slice(cut, None))) + (() if w is None else (w[cut:],))
        x, y, w = D.take(x, slice(0, cut)), D.take(y, slice(0, cut)), D.take(w, slice(0, cut))
        n = cut
    if class_weight is not None:
        w = D.class_weights_to_sample_weights(y, class_weight)
    num_workers = sm.num_workers or max(1, sc.defaultParallelism)
    num_workers = min(num_workers, n)
    blocks = D.split_numpy(x, y, num_workers, seed=sm.seed, sample_weight=w)
    rdd = D.shipped_blocks(sc, blocks)
    rdd.elephant_samples = n
    return rdd, num_workers, val


def start_server(app, host: str, ports: Sequence[int], threads: int):
    """A started :class:`~elephant.ps.server.PSServer` on the first free port of ``ports``.

    Raises:
        PSError: no port of ``ports`` could be bound (the last error names why).
    """
    from elephant.ps.server import PSServer

    *others, last = ports
    for port in others:
        try:
            return PSServer(app, host=host, port=port, threads=threads).start()
        except PSError as exc:
            if "could not bind" not in str(exc):
                raise
    try:
        return PSServer(app, host=host, port=last, threads=threads).start()
    except PSError as exc:
        if others and "could not bind" in str(exc):
            raise PSError(f"{exc} (tried {len(ports)} ports of {session.PS_PORTS_KEY})") from None
        raise


def _data_job(rdd) -> list:
    """``rdd.collect()``, with a ``DataError`` raised in a task raised again on the driver as itself."""
    try:
        return rdd.collect()
    except Exception as exc:  # Py4JJavaError / PythonException carry the task's traceback as text
        raise_task_data_error(exc)
        raise


def raise_task_data_error(exc: BaseException) -> None:
    """Raise a ``DataError`` that a task of a failed Spark job raised again as itself; else return."""
    cause = spark_failure_cause(exc)
    if cause.startswith("DataError: "):
        raise DataError(cause[len("DataError: "):]) from exc


def aggregate_logs(results: list[dict[str, Any]]) -> dict[str, float]:
    """The epoch's training logs from the partitions' own (see :func:`elephant.inference.mean_logs`)."""
    return mean_logs([(r["samples"], r.get("logs"), r.get("weight_sum", r["samples"]), r.get("weighted_keys", ()))
                      for r in results])


def _staleness_mean(before: dict, after: dict) -> float | None:
    hist_a = {int(k): v for k, v in (after.get("staleness") or {}).items()}
    hist_b = {int(k): v for k, v in (before.get("staleness") or {}).items()}
    diff = {k: hist_a.get(k, 0) - hist_b.get(k, 0) for k in hist_a}
    count = sum(diff.values())
    return (sum(k * v for k, v in diff.items()) / count) if count else None


def replica_structure(model, custom_objects) -> str:
    """The key under which workers may share a training replica with other fits ("": never).

    Models given ``custom_objects`` never share (each fit builds its own replica): a
    custom layer redefined in a notebook keeps its name and config, and a shared
    replica would run its old code.
    """
    return "" if custom_objects else structure_fingerprint(model)


def _epoch_job(rdd, spec: TaskSpec, barrier: bool) -> list[dict[str, Any]]:
    def task(iterator):
        from pyspark import BarrierTaskContext, TaskContext

        from elephant import worker
        from elephant.ps.client import PSClient

        ctx = BarrierTaskContext.get() if barrier else TaskContext.get()
        with PSClient(spec.ps_url, spec.token, read_timeout=spec.read_timeout) as client:
            return worker.run_partition(spec, ctx.partitionId(), ctx.taskAttemptId(), iterator, client, ctx.cpus())

    stage = rdd.barrier() if barrier else rdd
    return stage.mapPartitions(task).collect()


class ClassicRun:
    """The Spark side of a fit in a classic session: cached blocks, a broadcast model, the server here.

    The training data become an RDD of numpy blocks cached on the executors,
    the model archive one broadcast, and the parameter server runs in this
    process on :func:`elephant.session.ps_host`; each epoch is one job
    (a barrier stage in synchronous mode) in the fit's job group.
    """

    def __init__(self, sm, spark, x, y, **data):
        self.sc = spark.sparkContext
        self.rdd, self.num_workers, self.val = training_rdd(sm, self.sc, x, y, **data)
        self.samples = self.rdd.elephant_samples
        self._sm, self._server, self._broadcast, self._group = sm, None, None, None

    def check_slots(self) -> None:
        sm = self._sm
        session.check_barrier_slots(self.num_workers, session.task_slots(self.sc), sm.optimizer.staleness_bound,
                                    sm.mode)

    def open(self, store, token: str, run: str, model_bytes: bytes) -> tuple[Any, str]:
        """Broadcast the model and start the server: ``(the tasks' model_bytes, the server's url)``."""
        from elephant.ps.app import create_app

        sc = self.sc
        self._broadcast = sc.broadcast(model_bytes)
        self._group = self._sm.job_group = f"elephant-{run}"
        sc.setJobGroup(self._group, f"elephant fit {run}", interruptOnCancel=True)
        app = create_app(store, token, max_body_bytes=max_body_bytes(store.template))
        self._server = start_server(app, session.ps_host(sc), session.ps_ports(sc), 2 * self.num_workers + 4)
        return self._broadcast, self._server.url

    def epoch(self, store, spec: TaskSpec, barrier: bool, epochs: int) -> list[dict[str, Any]]:
        def job(spec: TaskSpec, text: str) -> list[dict[str, Any]]:
            with session.job_description(self.sc, text):
                return _epoch_job(self.rdd, spec, barrier)

        with session.interrupt_cancels(self.sc, self._group) as interrupted:
            return run_epoch(self._sm, store, job, spec, barrier, epochs, interrupted)

    def cancel(self) -> None:
        """Stop the fit's running jobs (an interrupted or failed fit must not train against a dead server)."""
        if self._group is not None:
            self.sc.cancelJobGroup(self._group)

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
        if self._group is not None:
            self.sc.setLocalProperty("spark.jobGroup.id", None)
        if self._broadcast is not None:
            self._broadcast.unpersist()
        D.release(self.rdd)


_CAUSE = re.compile(r"^((?:\w+\.)*(\w+(?:Error|Exception|Interrupt))): (.+)$", re.MULTILINE)


def spark_failure_cause(exc: BaseException) -> str:
    """The innermost ``SomeError: message`` line of a Spark job failure (the task's own error), else its first line.

    The error is named by its class alone (``elephant.errors.DataError`` -> ``DataError``).
    """
    text = str(exc)
    causes = [m for m in _CAUSE.finditer(text) if not m.group(2).startswith(("Py4J", "Spark", "Task", "Python"))]
    if causes:
        return f"{causes[-1].group(2)}: {causes[-1].group(3).strip()[:500]}"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return f"{type(exc).__name__}: {first[:500]}"


def epoch_failure(exc: BaseException, epoch: int, epochs: int, tries: int = 1, undone: int | None = None,
                  kept: bool = False) -> FitError:
    """One clear error for a failed epoch job: which epoch, the task's error, the tries, what ``sm.model`` holds."""
    after = f" {tries} times" if tries > 1 else ""
    if kept:
        state = ("on_failure='keep': sm.model holds the center with the failed epoch's partial progress; "
                 f"fit again to go on (initial_epoch={epoch + 1} counts the failed epoch as done)")
    else:
        held = f"the weights after epoch {epoch}" if epoch else "the weights it had before the fit"
        rolled = (f"the epoch was rolled back ({undone} commits undone; the center and the rule's state are as at "
                  "its start) and " if undone is not None else "")
        state = (f"The fit stopped: {rolled}sm.model holds {held}; fit again to go on "
                 f"(initial_epoch={epoch} keeps Keras' epoch numbers)")
    return FitError(f"epoch {epoch + 1} of {epochs} failed in Spark{after}: {spark_failure_cause(exc)}. {state}")


#: Task errors that training the epoch again cannot fix.
_NOT_RETRIED = ("DataError", "ConfigError", "FitError", "ProtocolError")


def run_epoch(sm, store, job, spec: TaskSpec, barrier: bool, epochs: int,
              interrupted: threading.Event | None = None) -> list[dict[str, Any]]:
    """One epoch's Spark job, ``job(spec, description)``, as a transaction; returns the partitions' stats.

    If the job fails, the store returns to the epoch's start (center, rule
    state, bookkeeping) under a new run id that fences out the failed try's
    tasks, and a synchronous (barrier) epoch is trained again, up to
    ``sm.epoch_retries`` times: Spark retries failed tasks of an ordinary
    stage itself, but never a barrier stage. With ``sm.on_failure == "keep"``
    nothing is rolled back or retried: ``sm.model`` takes the partial center.

    Raises:
        FitError: the epoch failed for good (the last Spark error is its cause).
        KeyboardInterrupt: Ctrl-C cancelled the job (``interrupted`` is set); nothing
            is rolled back, as for an interrupt anywhere else in the fit.
    """
    snapshot = store.snapshot()
    tries = 0
    while True:
        try:
            text = f"elephant fit {spec.run}: epoch {spec.epoch + 1} of {epochs}" + (f", try {tries + 1}" if tries else "")
            return job(spec, text)
        except ElephantError:
            raise
        except Exception as exc:  # a Spark job failure (Py4JJavaError, PythonException, ...)
            if interrupted is not None and interrupted.is_set():  # Ctrl-C cancelled the job
                raise KeyboardInterrupt() from None
            tries += 1
            if sm.on_failure == "keep":
                sm.model.set_weights(store.center())
                raise epoch_failure(exc, spec.epoch, epochs, tries, kept=True) from exc
            cause = spark_failure_cause(exc)
            undone = store.rollback(snapshot, f"{spec.run}.e{spec.epoch}t{tries}")
            if not barrier or tries > sm.epoch_retries or cause.split(":", 1)[0] in _NOT_RETRIED:
                raise epoch_failure(exc, spec.epoch, epochs, tries, undone) from exc
            log.warning("epoch %d: the synchronous job failed (%s); %d commits rolled back, training the epoch "
                        "again (retry %d of %d)", spec.epoch + 1, cause, undone, tries, sm.epoch_retries)
            spec = dataclasses.replace(spec, ps_run=store.run)


def _rule_identity(sm, rule, num_workers) -> dict[str, Any]:
    return {"name": rule.name, "config": rule.get_config(), "mode": sm.mode, "num_workers": num_workers}


def resume_from_backup(sm, backup, rule, num_workers: int, initial_epoch: int):
    """Start from ``backup``'s checkpoint, if it holds one: ``(initial_epoch, rule_state, history)``.

    ``sm.model`` takes the checkpoint's center and optimizer variables; the
    fit starts after the last saved epoch (as Keras' own ``BackupAndRestore``
    sets it), and the rule's server state is restored when the rule, mode and
    number of workers are those it was saved with.

    Raises:
        ConfigError: the checkpoint's weights do not fit the model.
    """
    if backup is None:
        return initial_epoch, None, {}
    saved = checkpoint.load(backup.backup_dir, type(rule).__module__)
    if saved is None:
        return initial_epoch, None, {}
    model = sm.model
    weights = model.get_weights()
    if [w.shape for w in weights] != [c.shape for c in saved.center]:
        raise ConfigError(f"the backup in {backup.backup_dir!r} holds weights of another model (shapes "
                          f"{[c.shape for c in saved.center][:4]}..., the model's {[w.shape for w in weights][:4]}...); "
                          "remove it or pass another backup_dir")
    model.set_weights(saved.center)
    optimizer = _built_optimizer(model)
    variables = optimizer.variables
    if [tuple(v.shape) for v in variables] == [a.shape for a in saved.optimizer_variables]:
        for v, a in zip(variables, saved.optimizer_variables):
            v.assign(a)
    else:
        log.warning("the backup's optimizer variables do not fit %s; it keeps its own", type(optimizer).__name__)
    state = saved.rule_state if saved.state_saved and saved.rule == _rule_identity(sm, rule, num_workers) else None
    if state is None:
        log.warning("resuming without the rule's saved server state (saved for %s); the rule starts afresh",
                    saved.rule)
    log.info("resuming from the backup in %s after epoch %d", backup.backup_dir, saved.epochs_done)
    return saved.epochs_done or initial_epoch, state, saved.history


def _built_optimizer(model):
    """The model's optimizer with its variables made (as Keras' own BackupAndRestore builds it to load them)."""
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    return model.optimizer


def _save_backup(sm, backup, store, rule, num_workers, epochs_done, history) -> None:
    checkpoint.save(backup.backup_dir, checkpoint.Checkpoint(
        epochs_done=epochs_done, center=store.center(),
        optimizer_variables=[np.asarray(v) for v in _built_optimizer(sm.model).variables],
        rule_state=store.snapshot().state, rule=_rule_identity(sm, rule, num_workers), history=history,
    ))


def _callback_list(sm, callbacks, epochs, verbose, steps):
    """The fit's callbacks with History, and Keras' own ProgbarLogger unless ``verbose`` is 0."""
    import keras

    level = 1 if verbose in ("auto", True) else int(verbose)
    cbks = keras.callbacks.CallbackList(
        list(callbacks or []), add_history=True, add_progbar=level != 0, model=sm.model, epochs=epochs,
        verbose=level, steps=steps,
    )
    history = next(c for c in cbks.callbacks if isinstance(c, keras.callbacks.History))
    return cbks, history


class LiveProgress:
    """Moves Keras' progress bar within an epoch as the workers' commits arrive.

    The epoch's Spark job blocks the driver, so a thread polls the store's
    ``samples_applied`` every ``interval`` seconds and shows the samples trained
    as Keras' steps of the global batch (``steps`` per epoch for ``samples``
    samples), never the last one: :meth:`stop`, then the epoch's end, finish the
    line with the epoch's logs, as ``model.fit`` does. Only ``verbose=1`` shows it.
    """

    def __init__(self, progbar, store, steps: int, samples: int, interval: float = 0.5):
        self._progbar, self._store, self._steps, self._samples = progbar, store, steps, max(samples, 1)
        self._interval = interval
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> LiveProgress:
        if self._progbar is not None and self._progbar.verbose == 1 and self._steps > 1:
            self._start_samples = self._store.samples_applied
            self._thread = threading.Thread(target=self._run, name="elephant-progress", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        shown = 0
        while not self._done.wait(self._interval):
            trained = self._store.samples_applied - self._start_samples
            step = min(self._steps - 1, trained * self._steps // self._samples)
            if step > shown:
                self._progbar.on_train_batch_end(step - 1)  # the step count, one-indexed by Keras
                shown = step

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()


_BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end")


def _acts_per_batch(callback) -> bool:
    """Whether ``callback`` would do something in a batch hook (Keras' own ones only when set to)."""
    import keras

    base = keras.callbacks.Callback
    if not any(getattr(type(callback), h, None) is not getattr(base, h) for h in _BATCH_HOOKS):
        return False
    if isinstance(callback, (keras.callbacks.ProgbarLogger, keras.callbacks.TerminateOnNaN)):
        return False  # elephant shows its own progress and stops a diverging fit itself
    if isinstance(callback, keras.callbacks.TensorBoard):
        return getattr(callback, "update_freq", "epoch") != "epoch"
    if isinstance(callback, (keras.callbacks.ModelCheckpoint, keras.callbacks.BackupAndRestore)):
        return getattr(callback, "save_freq", "epoch") != "epoch"
    return True


def batch_hook_warning(callbacks) -> str | None:
    """The fit-start warning for callbacks that act in batch hooks, which a distributed fit never calls."""
    names = [type(c).__name__ for c in callbacks or [] if _acts_per_batch(c)]
    if not names:
        return None
    return (
        f"callbacks {names} act on training batches, but the batches run in Spark tasks and the driver sees "
        "epochs only: on_train_batch_begin/end (and on_batch_*) are not called. Their epoch hooks run as usual; "
        "use epoch-level settings (e.g. save_freq='epoch', update_freq='epoch')."
    )


def validates_after(epoch: int, freq: int | tuple[int, ...]) -> bool:
    """Whether Keras would validate after ``epoch`` (0-based) with ``validation_freq=freq``."""
    return (epoch + 1) % freq == 0 if isinstance(freq, int) else epoch + 1 in freq


def _follow_learning_rate(local, previous: float | None, store) -> float | None:
    """The compiled optimizer's rate for this epoch; a change since the last one is passed to the rule.

    Callbacks such as ``LearningRateScheduler`` and ``ReduceLROnPlateau`` set the
    driver's rate between epochs; the workers get it in their task, and the
    rule's server state is scaled by new / old (``on_learning_rate_change``).
    """
    rate = settable_learning_rate(local)
    if rate is not None and previous is not None and rate != previous:
        log.info("learning rate changed from %g to %g: the workers train with it from this epoch", previous, rate)
        store.learning_rate_changed(rate / previous if previous > 0 else 1.0)
    return rate


def run_fit(sm, x, y, *, epochs, batch_size, validation_data, validation_split, callbacks, verbose,
            features_col, label_col, shuffle, initial_epoch=0, validation_freq=1, validation_batch_size=None,
            sample_weight=None, class_weight=None, weight_col=None):

    D.check_input_kind(x)
    if class_weight is not None:
        class_weight = D.check_class_weight(class_weight)
        if sample_weight is not None or weight_col is not None:
            given = "sample_weight" if sample_weight is not None else "weight_col"
            raise ConfigError(f"pass either `class_weight` or `{given}`, not both (as in Keras): fold the class "
                              "weights into the sample weights")
    if not (D.is_rdd(x) or D.is_dataframe(x)):  # numpy: check everything before Spark starts
        if y is None:
            raise DataError("`y` is required when `x` is a numpy array (or a list/dict of arrays)")
        if weight_col is not None:
            raise DataError(f"`weight_col` names a DataFrame column, but `x` is numpy; pass sample_weight= instead "
                            f"(received weight_col={weight_col!r})")
        n = D.check_xy(x, y)
        D.check_features(sm.model, x)
        if sample_weight is not None:
            sample_weight = D.check_sample_weight(sample_weight, n)  # training_rdd takes it as checked
        if class_weight is not None:
            D.class_weight_labels(y)  # refuses multi-output labels before Spark starts
    if validation_data is not None:
        if validation_split:
            raise ConfigError(
                "pass either `validation_data` or `validation_split`, not both; received "
                f"validation_split={validation_split!r} and validation_data of {len(validation_data)} items"
            )
        D.check_validation_data(sm.model, validation_data)
    data = dict(features_col=features_col, label_col=label_col, validation_split=validation_split,
                sample_weight=sample_weight, class_weight=class_weight, weight_col=weight_col)
    connect = fit_session(sm, x)
    if connect is not None:  # a Spark Connect client: the server is hosted by a task
        from elephant.connect_fit import HostedRun

        runner = HostedRun(sm, connect, x, y, **data)
    else:
        runner = ClassicRun(sm, sm.spark, x, y, **data)
    try:
        return _train(sm, runner, epochs=epochs, batch_size=batch_size, validation_data=validation_data,
                      callbacks=callbacks, verbose=verbose, shuffle=shuffle, initial_epoch=initial_epoch,
                      validation_freq=validation_freq, validation_batch_size=validation_batch_size)
    finally:
        runner.close()


def fit_session(sm, x):
    """The Spark Connect session a fit of ``x`` runs in, else None (a classic session)."""
    for spark in (x.sparkSession if D.is_dataframe(x) else None, sm._spark):
        if spark is not None and session.is_connect(spark):
            return spark
    return None


def _train(sm, runner, *, epochs, batch_size, validation_data, callbacks, verbose, shuffle, initial_epoch,
           validation_freq, validation_batch_size):
    """The epochs of a fit whose data ``runner`` holds: server, callbacks, validation, backups."""
    from elephant.ps.store import Store

    num_workers, samples = runner.num_workers, runner.samples
    val = tuple(validation_data) if validation_data is not None else runner.val
    barrier = sm.mode == "synchronous"
    runner.check_slots()

    rule = sm.optimizer.for_fit(sm.model.optimizer, num_workers, sm.splits_batch, sm.window)
    warning = rule.setup_warning(sm.window, num_workers, sm.splits_batch)
    if warning:
        log.warning(warning)
    for warning in (overlap_warning(sm.overlap, sm.mode, sm.window, num_workers), batch_hook_warning(callbacks)):
        if warning:
            log.warning(warning)

    worker_batch = worker_batch_size(batch_size, num_workers, sm.splits_batch)
    sm.fit_plan = {"num_workers": num_workers, "batch_size": batch_size, "worker_batch_size": worker_batch,
                   "window": sm.window, "optimizer": rule.get_config(), "overlap": sm.overlap}
    log.info(
        "elephant fit: %d workers, %s, window=%s; %s; %s", num_workers, rule.describe(num_workers), sm.window,
        f"batch_size={batch_size} is the global batch: each worker trains batches of {worker_batch} "
        "(pass SparkModel(batch_split=False) for full batches per worker)" if worker_batch != batch_size
        else f"each worker trains batches of {batch_size}",
        "workers train on while a commit is in flight (overlap=False waits for each reply)" if sm.overlap
        else "workers wait for each commit's reply",
    )

    run = uuid.uuid4().hex[:12]
    token = secrets.token_urlsafe(32)
    backup, callbacks = checkpoint.find_backup(callbacks)
    initial_epoch, rule_state, past = resume_from_backup(sm, backup, rule, num_workers, initial_epoch)
    center = sm.model.get_weights()
    store = Store(center, rule, sm.mode, num_workers, run, round_timeout=sm.read_timeout, state=rule_state,
                  norm_guard=sm.norm_guard)
    fingerprint = model_fingerprint(sm.model)
    structure = replica_structure(sm.model, sm.custom_objects)
    steps = -(-samples // batch_size)  # Keras' steps of the global batch
    cbks, history = _callback_list(sm, callbacks, epochs, verbose, steps)
    sm.model.stop_training = False
    try:
        model_bytes, url = runner.open(store, token, run, model_to_bytes(sm.model))
        sm.ps_url = url or None
        if url:
            log.info("parameter server for run %s at %s (%d workers, mode=%s, optimizer=%r, window=%s)",
                     run, url, num_workers, sm.mode, rule, sm.window)
        cbks.on_train_begin()
        metrics_before = store.metrics()
        rate = settable_learning_rate(sm.model.optimizer)
        for epoch in range(initial_epoch, epochs):
            cbks.on_epoch_begin(epoch)
            rate = _follow_learning_rate(sm.model.optimizer, rate, store)
            t0 = time.perf_counter()
            spec = TaskSpec(
                run=run, epoch=epoch, model_bytes=model_bytes, fingerprint=fingerprint,
                optimizer=rule, window=sm.window, batch_size=worker_batch, mode=sm.mode,
                ps_url=url, token=token, read_timeout=sm.read_timeout + 30.0,
                custom_objects=sm.custom_objects or None, shuffle=shuffle,
                fault=os.environ.get("ELEPHANT_FAULT") or None, structure=structure, overlap=sm.overlap,
                learning_rate=rate, ps_run=store.run,
            )
            progress = LiveProgress(cbks._progbar, store, steps, samples).start()
            try:
                results = runner.epoch(store, spec, barrier, epochs)
            finally:
                progress.stop()
            logs = aggregate_logs(results)
            sm.model.set_weights(store.center())
            if val is not None and validates_after(epoch, validation_freq):
                val_logs = sm.model.evaluate(
                    val[0], val[1], sample_weight=val[2] if len(val) > 2 else None,
                    batch_size=validation_batch_size or batch_size, verbose=0, return_dict=True,
                )
                logs.update({f"val_{k}": float(v) for k, v in val_logs.items()})
            metrics_after = store.metrics()
            if sm.mode != "synchronous":
                mean_tau = _staleness_mean(metrics_before, metrics_after)
                if mean_tau is not None:
                    logs["staleness"] = mean_tau
            metrics_before = metrics_after
            log.info("epoch %d: %d partitions, %.2fs, %s", epoch + 1, len(results), time.perf_counter() - t0, logs)
            diverged = sorted(r["partition"] for r in results if r.get("diverged_at") is not None)
            cbks.on_epoch_end(epoch, logs)
            if backup is not None:  # after the callbacks: a rate they set is saved with the epoch
                for key, value in logs.items():
                    past.setdefault(key, []).append(float(value))
                _save_backup(sm, backup, store, rule, num_workers, epoch + 1, past)
            if diverged:
                # The server refuses non-finite updates, so the center stays finite; going on
                # would only repeat the divergence. Stop, as Keras' TerminateOnNaN would.
                log.warning(
                    "training diverged in epoch %d (non-finite loss or weights on partitions %s); stopping "
                    "the fit with the last finite center weights. Lower the learning rate or clip gradients.",
                    epoch + 1, diverged,
                )
                sm.model.stop_training = True
            if sm.model.stop_training:
                break
        cbks.on_train_end()
        if backup is not None and backup.delete_checkpoint:
            checkpoint.remove(backup.backup_dir)
    except BaseException:
        runner.cancel()
        raise
    finally:
        sm.last_metrics = store.metrics()
        sm.last_ledger = store.ledger()
    return history
