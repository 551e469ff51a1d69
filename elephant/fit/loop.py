"""The epochs of a fit: input checks, the plan, the store and its server, callbacks, validation, backups.

:func:`run_fit` is what ``SparkModel.fit`` calls. It checks the data it can
before Spark starts, picks the Spark side (:class:`~elephant.fit.classic.ClassicRun`
in a classic session, :class:`~elephant.fit.connect.HostedRun` under Spark
Connect), plans the fit (:mod:`elephant.fit.plan`) and runs each epoch's job
as a transaction (:func:`~elephant.fit.epoch.run_epoch`). What the fit learns
about itself goes into the caller's :class:`~elephant.fit.report.FitReport`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from elephant import checkpoint
from elephant import data as D
from elephant import framework, session
from elephant.config import FitArgs, Settings
from elephant.errors import ConfigError
from elephant.fit import copies
from elephant.fit.backup import (MidEpochBackup, built_optimizer, in_callback_order, resume_from_backup, save_backup,
                                 save_inside)
from elephant.fit.epoch import run_epoch
from elephant.fit.head import HeldState, train_head
from elephant.fit.plan import FitPlan, plan_fit
from elephant.fit.progress import (LiveProgress, aggregate_logs, batch_hook_warning, callback_list, staleness_mean,
                                   task_devices, validates_after)
from elephant.fit.report import FitReport
from elephant.fit.resident import ResidentJob, overlaps_validation
from elephant.fit.runner import SparkSide
from elephant.fit.validation import SparkValidation, Validation
from elephant.model_io import model_fingerprint, model_to_bytes, structure_fingerprint
from elephant.optimizers.local import inner_optimizer, settable_rate
from elephant.sources import Source, source
from elephant.stream import buffer_samples, describe_buffer, shuffle_key
from elephant.worker import TaskSpec

log = logging.getLogger(__name__)

__all__ = ["fit_session", "follow_learning_rate", "replica_structure", "run_fit", "settable_learning_rate"]


def check_inputs(model, data: Source, args: FitArgs) -> FitArgs:
    """Check what can be checked before Spark starts; the args with their weights checked.

    Raises:
        ConfigError: ``class_weight`` with sample weights, both ``validation_data`` and
            ``validation_split``, or an argument that does not apply to the input's kind.
        DataError: numpy data, weights or validation data that do not fit the model or each other.
    """
    class_weight, sample_weight, weight_col = args.class_weight, args.sample_weight, args.weight_col
    if class_weight is not None:
        class_weight = D.check_class_weight(class_weight)
        if sample_weight is not None or weight_col is not None:
            given = "sample_weight" if sample_weight is not None else "weight_col"
            raise ConfigError(f"pass either `class_weight` or `{given}`, not both (as in Keras): fold the class "
                              "weights into the sample weights")
    data.refuse(sample_weight=sample_weight, weight_col=weight_col, validation_split=args.validation_split)
    sample_weight = data.checked_weights(model, sample_weight, class_weight)
    if args.validation_data is not None:
        if args.validation_split:
            raise ConfigError("pass either `validation_data` or `validation_split`, not both; received "
                              f"validation_split={args.validation_split!r} and validation_data")
        if not _in_spark(args.validation_data):  # Spark data are checked in their tasks
            D.check_validation_data(model, args.validation_data)
    return dataclasses.replace(args, class_weight=class_weight, sample_weight=sample_weight)


def _in_spark(data) -> bool:
    return D.is_rdd(data) or D.is_dataframe(data)


def fit_session(data: Source, spark):
    """The Spark Connect session a fit of ``data`` runs in, else None (a classic session).

    ``spark`` is the session the SparkModel was given, if any.
    """
    for candidate in (data.spark, spark):
        if candidate is not None and session.is_connect(candidate):
            return candidate
    return None


def run_fit(model, settings: Settings, args: FitArgs, x, y, *, spark: Callable[[], Any], given_spark=None,
            custom_objects: Mapping[str, Any] | None = None, report: FitReport):
    """Train ``model`` on ``x``, ``y`` as ``settings`` and ``args`` say; returns Keras' ``History``.

    ``spark()`` gives the classic session (called only for a classic fit);
    ``given_spark`` is the session the user gave, which may be a Connect one.
    ``report`` is filled in as the fit goes, also when it fails.
    """
    from elephant.fit.classic import ClassicRun

    data = source(x, y)
    args = check_inputs(model, data, args)
    connect = fit_session(data, given_spark)
    if connect is not None:  # a Spark Connect client: the server is hosted by a task
        from elephant.fit.connect import HostedRun

        fit_spark = connect
        runner: SparkSide = HostedRun(model, settings, connect, data, args)
    else:
        fit_spark = spark()
        runner = ClassicRun(model, settings, fit_spark, data, args, report.job_group)
    try:
        validate = _validation(model, args, runner, fit_spark, custom_objects)
        return _train(model, settings, args, runner, custom_objects or {}, report, validate)
    finally:
        runner.close()


def replica_structure(model, custom_objects) -> str:
    """The key under which workers may share a training replica with other fits ("": never).

    Models given ``custom_objects`` never share (each fit builds its own replica): a
    custom layer redefined in a notebook keeps its name and config, and a shared
    replica would run its old code. A learning rate that is a number is left out
    of the key: every task sets it (``TaskSpec.learning_rate``), so fits that
    differ only in it (a sweep) share a replica and its traced train step.
    """
    if custom_objects:
        return ""
    return structure_fingerprint(model, settable_rate=settable_learning_rate(model.optimizer) is not None)


def settable_learning_rate(local: Any) -> float | None:
    """The current learning rate of a compiled Keras optimizer, or None if it is a schedule (not settable)."""
    import keras

    if not settable_rate(local):
        return None
    return float(np.asarray(keras.ops.convert_to_numpy(inner_optimizer(local)._learning_rate)))


def follow_learning_rate(local, previous: float | None, store) -> float | None:
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


def _start(model, settings: Settings, args: FitArgs, runner: SparkSide, backend: str) -> FitPlan:
    """Check the cluster (its task slots, its GPUs for ``backend``), plan the fit and log the plan and its warnings."""
    runner.check_slots()
    runner.check_devices(backend)
    plan = plan_fit(settings, model, runner.num_workers, args.batch_size, runner.samples,
                    hosted=runner.hosted)
    epochs = args.epochs - args.initial_epoch
    for warning in plan.warnings(settings.mode, epochs) + [batch_hook_warning(args.callbacks)]:
        if warning:
            log.warning(warning)
    log.info("%s; Keras backend %s, devices: %s", plan.describe(), backend, runner.devices)
    if plan.window_choice is not None:
        log.info("window decision: %s", plan.window_choice.describe())
    log.info("shard decision: %s", plan.shard_choice.describe())
    return plan


def _make_store(model, settings: Settings, plan: FitPlan, mode: str, run: str, rule_state):
    """The fit's store: one :class:`Store`, or a :class:`ShardedStore` of ``plan.ps_shards`` shards."""
    from elephant.ps.sharded_store import make_store

    try:
        return make_store(model.get_weights(), plan.rule, mode, plan.num_workers, run, shards=plan.ps_shards,
                          round_timeout=settings.read_timeout, state=rule_state, norm_guard=settings.norm_guard)
    except ConfigError as exc:
        if plan.ps_shards == 1:
            raise
        raise ConfigError(f"the parameter server cannot be split into ps_shards={plan.ps_shards} shards: "
                          f"{exc}") from None


def _recheck(plan: FitPlan, results, report: FitReport) -> FitPlan:
    """The plan for the next epochs: a decided window re-decided from the epoch's timings, logged when it changes."""
    rechecked = plan.rechecked(results)
    if rechecked is not plan:
        report.plan = dict(report.plan or {}, **rechecked.as_dict())  # the fit's own keys (shuffle_buffer...) kept
        if rechecked.window != plan.window:
            log.info("window decision, from the next epoch: %s", rechecked.window_choice.describe())
    return rechecked


def _inside_epochs(backup, shards: int, hosted: bool) -> int | None:
    """The global batches between a fit's backups inside an epoch (``BackupAndRestore(save_freq=N)``), None where
    it saves at epochs' ends only (``save_freq="epoch"``, or a server that is sharded or hosted by the tasks, whose
    state no one snapshot holds: logged)."""
    every = getattr(backup, "save_freq", "epoch") if backup is not None else "epoch"
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        return None
    if shards > 1 or hosted:
        where = "sharded" if shards > 1 else "hosted by the epoch's tasks"
        log.warning("BackupAndRestore(save_freq=%d) saves at the end of each epoch only: the parameter server is %s, "
                    "and no one snapshot holds its state inside an epoch (docs/reliability.md)", every, where)
        return None
    return every


def _resumed(resume, num_workers: int) -> tuple[int, ...]:
    """Each partition's steps of the resumed epoch trained before the fit stopped (empty: a new epoch)."""
    if resume.positions is None:
        return ()
    return tuple(resume.positions.get(k, 0) for k in range(num_workers))


def _validation(model, args: FitArgs, runner: SparkSide, spark, custom_objects) -> Validation | SparkValidation | None:
    """The fit's validation pass: on Spark for a DataFrame or an RDD, else on the driver (numpy ``validation_data``
    or the ``validation_split`` the runner held out); None without validation data."""
    given = args.validation_data
    if given is not None and _in_spark(given):
        return SparkValidation(model, given, args.validation_batch_size, spark, args, custom_objects)
    val = tuple(given) if given is not None else runner.val
    if val is None:
        return None
    return Validation(model, val, args.validation_batch_size, framework.current_backend())


def _train(model, settings: Settings, args: FitArgs, runner: SparkSide, custom_objects, report: FitReport,
           validate: Validation | SparkValidation | None):
    """The epochs of a fit whose data ``runner`` holds: server, callbacks, validation, backups."""
    mode, epochs, samples = settings.mode, args.epochs, runner.samples
    barrier = runner.barrier(mode)
    backend = framework.current_backend()
    plan = _start(model, settings, args, runner, backend)
    buffer = buffer_samples(args.shuffle_buffer, runner.row_bytes)
    if args.shuffle:
        log.info(describe_buffer(buffer, runner.partition_samples, runner.row_bytes))
    report.plan = dict(plan.as_dict(), shuffle_buffer=buffer if args.shuffle else None)
    rule, num_workers, run = plan.rule, plan.num_workers, report.run

    token = secrets.token_urlsafe(32)
    backup, callbacks = checkpoint.find_backup(args.callbacks)
    shards = plan.ps_shards
    resume = resume_from_backup(model, mode, backup, rule, num_workers, args.initial_epoch, shards)
    initial_epoch, rule_state, past = resume.initial_epoch, resume.rule_state, resume.history
    if resume.positions is not None:
        report.plan["resumed_steps"] = dict(resume.positions)
    key = shuffle_key(settings.seed, model.get_weights())
    # none in a resumed fit (nor a ramp); one resumed inside its first epoch skips the head it had trained
    head = plan.head_steps if initial_epoch == args.initial_epoch and resume.positions is None else 0
    built_optimizer(model)  # its archive holds every optimizer variable: a shared replica starts from them
    structure = replica_structure(model, custom_objects)
    # a copy of the model kept for its structure, traced by an earlier fit: the head trains and the passes validate on it
    kept_as = structure  # the workers' key below may add what their replicas change
    kept = copies.take(model, kept_as) if structure and (head or isinstance(validate, Validation)) else None
    if kept is not None and isinstance(validate, Validation):
        validate.evaluate_on(kept)
    held = HeldState(model) if head else None  # given back if the fit fails before its first epoch ends
    if head:  # before the store and the archive: the workers start from its weights and optimizer state
        order_key = (key or run) if args.shuffle else None
        try:
            train_head(model, runner.head_rows(order_key, initial_epoch, head, plan.worker_batch_size, buffer), head,
                       plan.worker_batch_size, plan.head_batch_size, kept)
        except BaseException:
            held.restore()
            raise
    store = _make_store(model, settings, plan, mode, run, rule_state)
    fingerprint = model_fingerprint(model)
    if structure and plan.learning_rate_scale != 1.0 and settable_learning_rate(model.optimizer) is None:
        structure += f"; rate x{plan.learning_rate_scale:.6g}"  # a replica's schedule is wrapped at that scale
    for change in (plan.local_moment, plan.local_momentum):  # a replica's optimizer traced with the workers' decays
        if structure and change is not None:
            structure += f"; {change.name} {change.decay!r}"
    steps = -(-samples // args.batch_size)  # Keras' steps of the global batch
    if backup is not None:
        def write_backup(epoch: int, logs: dict) -> None:  # where the BackupAndRestore stands, as Keras writes it
            for key, value in logs.items():
                past.setdefault(key, []).append(float(value))
            save_backup(model, mode, backup, store, rule, num_workers, epoch + 1, past, shards)

        callbacks = in_callback_order(args.callbacks, backup, write_backup)
    inside = _inside_epochs(backup, shards, runner.hosted)  # save_freq=N: the global batches between saves
    cbks, history = callback_list(model, callbacks, epochs, args.verbose, steps)
    model.stop_training = False
    try:
        model_bytes, urls = runner.open(store, token, report.job_group, model_to_bytes(model))
        url = urls[0] if urls else ""
        report.ps_url, report.ps_urls = url or None, tuple(urls)
        if url:
            log.info("parameter server for run %s at %s (%d workers, mode=%s, optimizer=%r, window=%s)",
                     run, ", ".join(urls), num_workers, mode, rule, plan.window)
        elif plan.hosted:
            log.info("parameter server for run %s in the first %d task(s) of each epoch (%d workers, mode=%s, "
                     "optimizer=%r, window=%s)", run, shards, num_workers, mode, rule, plan.window)
        report.plan["one_job"] = runner.one_job(buffer, spark_validation=isinstance(validate, SparkValidation))
        barrier = barrier or report.plan["one_job"]  # one barrier stage: a failed task fails it, the epoch is retried
        sharded = {"ps_urls": tuple(urls), "shard_plan": store.plan.as_data()} if shards > 1 else {}
        cbks.on_train_begin()
        metrics_before = store.metrics()
        rate = settable_learning_rate(model.optimizer)
        job = runner.job(store, barrier)
        ahead = None  # the next epoch's (spec, store snapshot, samples applied), opened while the driver validates
        overlap = isinstance(job, ResidentJob) and isinstance(validate, Validation)  # on the driver, as one job
        if overlap:
            why = overlaps_validation(args.callbacks, bool(inside))
            if why is not None:
                log.info("each epoch's validation runs between the epochs: %s", why)
            overlap = why is None
        report.plan["validation_overlap"] = overlap

        def epoch_spec(epoch: int, rate: float | None) -> TaskSpec:
            return TaskSpec(
                run=run, epoch=epoch, model_bytes=model_bytes, fingerprint=fingerprint,
                optimizer=rule, window=plan.window, batch_size=plan.worker_batch_size, mode=mode,
                ps_url=url, token=token, read_timeout=settings.read_timeout + 30.0,
                custom_objects=custom_objects or None, shuffle=args.shuffle,
                fault=os.environ.get("ELEPHANT_FAULT") or None, structure=structure, overlap=plan.overlap,
                learning_rate=rate, ps_run=store.run, backend=backend, last_epoch=epoch == epochs - 1,
                shuffle_key=key, learning_rate_scale=plan.learning_rate_scale,
                learning_rate_warmup=plan.learning_rate_warmup and epoch == args.initial_epoch,
                warmup_window=plan.warmup_window if epoch == args.initial_epoch else None,  # set where the rate ramps
                skip_steps=(head or resume.head_steps) if epoch == initial_epoch else 0,
                resume_steps=_resumed(resume, num_workers) if epoch == initial_epoch else (),
                local_moment=plan.local_moment, local_momentum=plan.local_momentum, shuffle_buffer=buffer,
                partition_samples=runner.partition_samples, **sharded,
            )

        for epoch in range(initial_epoch, epochs):
            cbks.on_epoch_begin(epoch)
            rate = follow_learning_rate(model.optimizer, rate, store)
            t0 = time.perf_counter()
            spec, start, since = ahead if ahead is not None else (epoch_spec(epoch, rate), None, None)
            ahead = None
            # trained by the driver's head, before the job, and by a resumed fit before it stopped
            head_samples = spec.skip_steps * args.batch_size + sum(spec.resume_steps) * spec.batch_size
            progress = LiveProgress(cbks._progbar, store, steps, samples, done=head_samples, since=since).start()
            saver = None
            if inside:
                def write_inside(snapshot, positions, epoch=epoch, skip=spec.skip_steps):
                    save_inside(model, mode, backup, snapshot, rule, num_workers, epoch, past, positions, skip)

                pass_steps = [max(0, -(-(n - spec.skip_steps * spec.batch_size) // spec.batch_size))
                              for n in runner.partition_samples]
                saver = MidEpochBackup(store, inside * args.batch_size, write_inside, spec, pass_steps).start()
            if validate is not None and validates_after(epoch, args.validation_freq):
                validate.warm_up()  # the first pass's set-up, while the driver waits for the job
            try:
                with runner.guard() as interrupted:
                    results = run_epoch(store, job, spec, epochs=epochs, barrier=barrier, settings=settings,
                                        model=model, interrupted=interrupted, snapshot=start)
            finally:
                progress.stop()
                if saver is not None:
                    saver.stop()
                if validate is not None:
                    validate.close()  # a warm-up pass reads the weights that set_weights replaces
            logs = aggregate_logs(results)
            if epoch == initial_epoch:
                log.info("the tasks ran on %s", task_devices(results))
            states = {r["partition"]: r["optimizer_state"] for r in results if "optimizer_state" in r}
            report.optimizer_states.append(states)
            report.epoch_stats.append(results)
            report.learning_rates.append({r["partition"]: r["learning_rate"] for r in results if "learning_rate" in r})
            stale = sorted(p for p, source in states.items() if source == "stale")
            if stale:
                log.info("epoch %d: partitions %s trained from an older optimizer state than their last epoch's (their "
                         "task moved to another executor)", epoch + 1, stale)
            plan = _recheck(plan, results, report)
            model.set_weights(store.center())
            held = None  # an epoch ended: a later failure leaves the model at its center
            metrics_after = store.metrics()
            if mode != "synchronous":
                mean_tau = staleness_mean(metrics_before, metrics_after)
                if mean_tau is not None:
                    logs["staleness"] = mean_tau
            metrics_before = metrics_after
            diverged = sorted(r["partition"] for r in results if r.get("diverged_at") is not None)
            validating = validate is not None and validates_after(epoch, args.validation_freq)
            if overlap and validating and not diverged and epoch + 1 < epochs:  # nothing after this can change it
                ahead = (epoch_spec(epoch + 1, rate), store.snapshot(), store.samples_applied)
                job.open_ahead(ahead[0], f"elephant fit {run}: epoch {epoch + 2} of {epochs}")
            if validating:
                logs.update({f"val_{k}": v for k, v in validate().items()})
            log.info("epoch %d: %d partitions, %.2fs, %s", epoch + 1, len(results), time.perf_counter() - t0, logs)
            cbks.on_epoch_end(epoch, logs)  # the backup is written among them (write_backup)
            if diverged:
                # The server refuses non-finite updates, so the center stays finite; going on
                # would only repeat the divergence. Stop, as Keras' TerminateOnNaN would.
                log.warning(
                    "training diverged in epoch %d (non-finite loss or weights on partitions %s); stopping "
                    "the fit with the last finite center weights. Lower the learning rate or clip gradients.",
                    epoch + 1, diverged,
                )
                model.stop_training = True
            if model.stop_training:
                if ahead is not None:  # opened for nothing: its commits are undone and its tasks cancelled
                    store.rollback(ahead[1], f"{ahead[0].run}.e{epoch + 1}stopped")
                    runner.cancel()
                break
        cbks.on_train_end()
        if backup is not None and backup.delete_checkpoint:
            checkpoint.remove(backup.backup_dir)
    except BaseException:
        runner.cancel()
        if held is not None and settings.on_failure != "keep":  # the head's steps go with the failed first epoch
            held.restore()
        _keep_server_record(report, store, failing=True)
        raise
    finally:
        if validate is not None:
            validate.close()
        if kept is not None:
            copies.give_back(kept_as, kept)
    _keep_server_record(report, store)
    return history


def _keep_server_record(report, store, failing: bool = False) -> None:
    """The server's final metrics and ledger into the report; a failing fit keeps its own error if they are lost."""
    try:
        report.metrics, report.ledger = store.metrics(), store.ledger()
    except Exception as exc:
        if not failing:
            raise
        log.warning("the parameter server's final metrics could not be read after the fit failed: %s", exc)
