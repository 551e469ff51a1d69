"""The search loop, free of Spark: an Optuna study as the ledger, trials in driver threads, pruning at epoch ends.

:func:`run_search` owns ask and tell: whenever one of ``parallelism`` slots is
free, the calling thread asks the study for a trial, suggests the space's
labels on it (:mod:`elephant.search.compile`) and submits
``objective(point, job)`` to a thread pool; when the trial's thread returns it
tells the study COMPLETE, PRUNED or FAIL. Trial threads only report: each
epoch end calls ``job.report(epoch, logs)``, which records the metric at step
``epoch + 1`` (epochs trained) and returns the pruner's decision, all under
one lock over the study. With a hyperopt algorithm the point comes from
hyperopt's ``suggest`` and is enqueued, so the study records it all the same;
a hyperopt ``Trials`` mirrors the study for ``hp`` spaces either way.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from elephant.errors import ConfigError
from elephant.search.compile import CallableSpace, compile_space
from elephant.search.job import POLL_S, FitJob, cancel_all
from elephant.search.result import SearchResult, Trial
from elephant.search.study import (BACKUP_DIR, INTERRUPTED, RESUMED_FROM, HyperoptAlgo, continued_seed, get_pruner,
                                   get_sampler, get_storage, open_study)

log = logging.getLogger(__name__)

__all__ = ["ALGOS", "HyperoptMirror", "resolve_sampler", "run_search", "trial_from_frozen"]

ALGOS = ("tpe", "rand", "anneal")
STATUS = "elephant.status"  # trial user attrs written before each tell
EPOCHS, ERROR, POINT = "elephant.epochs", "elephant.error", "elephant.point"
MLFLOW_RUN_ID = "elephant.mlflow_run_id"  # the trial's child run, when the search logs to MLflow


def resolve_sampler(sampler: Any = "tpe", algo: Any = None, *, seed: int | None = None, conditional: bool = False):
    """``sampler`` (see :func:`elephant.search.study.get_sampler`), or hyperopt's ``algo`` as before.

    ``algo="tpe"``, ``"rand"``, ``"anneal"`` or a hyperopt suggest function
    means ``sampler="hyperopt-tpe"`` and so on.
    """
    if algo is None:
        return get_sampler(sampler, seed=seed, conditional=conditional)
    if sampler not in ("tpe", None):
        raise ConfigError(f"pass either `sampler` or hyperopt's `algo`, not both; received sampler={sampler!r} and "
                          f"algo={algo!r}")
    if isinstance(algo, str) and algo in ALGOS:
        return get_sampler(f"hyperopt-{algo}")
    if callable(algo):
        return HyperoptAlgo(getattr(algo, "__module__", "hyperopt"), algo)
    raise ConfigError(f"`algo` must be one of {list(ALGOS)} or a hyperopt suggest function; received algo={algo!r}")


class HyperoptMirror:
    """A hyperopt ``Trials`` that mirrors the study (trial ids are the study's numbers), and hyperopt's proposals."""

    def __init__(self, compiled, seed: int | None):
        import hyperopt
        from hyperopt.base import Domain

        self.compiled, self.trials = compiled, hyperopt.Trials()
        self.domain, self.rstate = Domain(lambda params: None, compiled.space), np.random.default_rng(seed)

    def propose(self, suggest: Callable) -> dict:
        """hyperopt's next point given the trials so far, as Optuna parameters."""
        ids = self.trials.new_trial_ids(1)
        self.trials.refresh()
        docs = suggest(ids, self.domain, self.trials, self.rstate.integers(2**31 - 1))
        return self.compiled.snap(docs[0]["misc"]["vals"])

    def add(self, number: int, values: Mapping[str, Any]) -> None:
        from hyperopt.base import JOB_STATE_RUNNING
        from hyperopt.utils import coarse_utcnow

        vals = self.compiled.hyperopt_vals(values)
        misc = {"tid": number, "cmd": self.domain.cmd, "workdir": self.domain.workdir,
                "idxs": {label: [number] if v else [] for label, v in vals.items()}, "vals": vals}
        doc = self.trials.new_trial_docs([number], [None], [{"status": "new"}], [misc])[0]
        doc["state"], doc["book_time"] = JOB_STATE_RUNNING, coarse_utcnow()
        self.trials.insert_trial_docs([doc])
        self.trials.refresh()

    def finish(self, number: int, status: str, score: float | None, mode: str, error: str | None) -> None:
        import hyperopt
        from hyperopt.base import JOB_STATE_DONE
        from hyperopt.utils import coarse_utcnow

        doc = next(d for d in self.trials._dynamic_trials if d["tid"] == number)
        if status in ("ok", "pruned") and score is not None:  # a pruned trial's score is its last epoch's
            doc["result"] = {"status": hyperopt.STATUS_OK, "loss": score if mode == "min" else -score}
        else:
            doc["result"] = {"status": hyperopt.STATUS_FAIL, "failure": error}
        doc["state"], doc["refresh_time"] = JOB_STATE_DONE, coarse_utcnow()
        self.trials.refresh()


def trial_from_frozen(frozen, space) -> Trial:
    """A finished trial of an earlier call, as the result's :class:`Trial` (no model, no history)."""
    state = frozen.state.name
    status = frozen.user_attrs.get(STATUS) or {"COMPLETE": "ok", "PRUNED": "pruned"}.get(state, "failed")
    if frozen.user_attrs.get(INTERRUPTED):
        status = "failed"
    point = frozen.user_attrs.get(POINT)
    if point is None:
        try:
            point = space.point(frozen.params)
        except Exception:  # a trial stopped before all its labels were suggested: its raw parameters
            point = dict(frozen.params)
    error = frozen.user_attrs.get(ERROR) or ("interrupted: the driver stopped while it ran"
                                             if frozen.user_attrs.get(INTERRUPTED) else None)
    duration = (frozen.datetime_complete - frozen.datetime_start).total_seconds() \
        if frozen.datetime_complete and frozen.datetime_start else 0.0
    return Trial(frozen.number, point, status=status, score=frozen.value if status in ("ok", "pruned") else None,
                 duration=duration, error=error, epochs=frozen.user_attrs.get(EPOCHS, len(frozen.intermediate_values)),
                 resumed_from=frozen.user_attrs.get(RESUMED_FROM))


def _jsonable(point: Any) -> Any:
    try:
        json.dumps(point)
    except (TypeError, ValueError):
        return None
    return point


def run_search(objective: Callable[[dict, Any], Mapping[str, Any]], space: Any, *, max_evals: int,
               parallelism: int = 1, sampler: Any = "tpe", algo: Any = None, pruner: Any = None,
               metric: str = "score", mode: str = "min", storage: Any = None, study_name: str | None = None,
               retry_interrupted: bool = True, artifacts_dir: str | None = None, timeout: float | None = None,
               trial_timeout: float | None = None, seed: int | None = None, verbose: Any = 0,
               make_job: Callable[[int], Any] | None = None, tracker: Any = None) -> SearchResult:
    """Run ``max_evals`` trials of ``objective(point, job)`` in pool threads, recorded in an Optuna study.

    ``objective`` returns ``{"score", "history", "model", "ps_url"}``
    (``score`` required) and may call ``job.report(epoch, logs, final)`` at
    each epoch end: a True answer means the trial is pruned and should stop (it
    still returns, with ``score`` its last value). The last epoch
    (``final=True``) is recorded but not put to the pruner: the trial has
    trained all its epochs, and a rung at that step (ASHA's at 9 of 9 epochs)
    would otherwise drop a finished result from the best. An exception marks the
    trial failed. A trial past its deadline gets ``job.cancel()`` every 0.2 s
    until its thread returns (status ``"timeout"``). Finished trials already in
    ``storage``'s study count toward ``max_evals``. ``tracker`` gets each
    trial's start, epochs and end (:mod:`elephant.search.tracking`). Returns
    once every trial thread has ended.
    """
    import optuna
    from tqdm.auto import tqdm

    compiled = compile_space(space)
    chosen = resolve_sampler(sampler, algo, seed=seed, conditional=compiled.conditional)
    hyper = isinstance(chosen, HyperoptAlgo)
    if hyper and isinstance(compiled, CallableSpace):
        raise ConfigError("hyperopt's algorithms need an hp space; a callable space(trial) works with Optuna's "
                          f"samplers {['tpe', 'random', 'qmc', 'cmaes', 'gp', 'nsga2']}")
    make_job = make_job or (lambda number: FitJob(label=f"trial{number}"))
    study, interrupted = open_study(get_storage(storage), study_name,
                          optuna.samplers.RandomSampler(seed=seed) if hyper else chosen, get_pruner(pruner),
                          space=compiled, metric=metric, mode=mode, retry_interrupted=retry_interrupted)
    stored = len(study.get_trials(deepcopy=False))
    if stored and seed is not None:  # a continued study: the same seed would replay the first call's points
        seed = continued_seed(seed, stored)
        log.info("study %r holds %d trials: sampler seeded with %d, derived from the given seed", study.study_name,
                 stored, seed)
        if not hyper and not isinstance(sampler, optuna.samplers.BaseSampler):
            study.sampler = resolve_sampler(sampler, algo, seed=seed, conditional=compiled.conditional)
    mirror = None if isinstance(compiled, CallableSpace) else HyperoptMirror(compiled, seed)
    if tracker is not None:
        tracker.start_search(study, interrupted)
    lock, t0 = threading.Lock(), time.monotonic()
    stop_at = None if timeout is None else t0 + timeout
    finished = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL
    records: list[Trial] = []
    earlier = 0  # finished trials of earlier calls that count toward max_evals (not the interrupted ones)
    for frozen in study.get_trials(deepcopy=False, states=finished):
        records.append(trial_from_frozen(frozen, compiled))
        earlier += not frozen.user_attrs.get(INTERRUPTED)
        if mirror is not None:
            mirror.add(frozen.number, frozen.params)
            mirror.finish(frozen.number, records[-1].status, records[-1].score, mode, records[-1].error)
    if earlier:
        log.info("study %r holds %d finished trials; %d more to run", study.study_name, earlier,
                 max(0, max_evals - earlier))
    running: dict[Any, tuple[Trial, Any, Any, float | None]] = {}

    def ask(now: float) -> None:
        with lock:
            waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
            if hyper and not waiting:
                study.enqueue_trial(mirror.propose(chosen.suggest))
            otrial = study.ask()
            values = compiled(otrial)
            resumed_from = otrial.user_attrs.get(RESUMED_FROM)
            backup_dir = otrial.user_attrs.get(BACKUP_DIR)
            if backup_dir is None and artifacts_dir is not None:
                backup_dir = f"{artifacts_dir}/trial-{otrial.number}"
                otrial.set_user_attr(BACKUP_DIR, backup_dir)
            reported = set()
            if resumed_from is not None:  # the epochs the interrupted trial reported count for its retry
                old = study.get_trials(deepcopy=False)[resumed_from]
                for step, value in sorted(old.intermediate_values.items()):
                    otrial.report(value, step)
                    reported.add(step)
            if mirror is not None:
                mirror.add(otrial.number, values)
        trial = Trial(otrial.number, compiled.point(values), start=now - t0, resumed_from=resumed_from)
        records.append(trial)
        job = make_job(trial.number)
        job.backup_dir = backup_dir
        run_id = tracker.start_trial(trial.number, trial.params) if tracker is not None else None
        if run_id is not None:
            with lock:
                otrial.set_user_attr(MLFLOW_RUN_ID, run_id)

        def report(epoch: int, logs: Mapping[str, Any], final: bool = False) -> bool:
            step, value = epoch + 1, logs.get(metric)
            trial.epochs = max(trial.epochs, step)
            if tracker is not None:
                tracker.log_epoch(run_id, step, logs)
            if value is None or not math.isfinite(float(value)):
                return False
            with lock:
                if step not in reported:
                    reported.add(step)
                    otrial.report(float(value), step)
                prune = not final and otrial.should_prune()
            if prune:
                log.info("trial %d pruned after %d epochs: %s=%.4g", trial.number, step, metric, value)
            return prune

        job.bind(report)
        deadline = min((t for t in (stop_at, trial_timeout and now + trial_timeout) if t), default=None)
        running[pool.submit(objective, dict(trial.params), job)] = (trial, job, otrial, deadline, run_id)

    def tell(future, trial: Trial, job, otrial, deadline, run_id) -> None:
        trial.duration, exc = time.monotonic() - t0 - trial.start, future.exception()
        state, value = optuna.trial.TrialState.FAIL, None
        if job.cancelled.is_set():
            trial.status, trial.error = "timeout", f"cancelled after {trial.duration:.1f}s: time limit reached"
        elif exc is not None:
            trial.status, trial.error = "failed", f"{type(exc).__name__}: {exc}"
        else:
            out = future.result()
            trial.history, trial.ps_url, score = dict(out.get("history") or {}), out.get("ps_url"), float(out["score"])
            if not math.isfinite(score):
                trial.status, trial.error = "failed", f"{metric} is {score}, not a finite number"
            elif job.pruned_at is not None:
                trial.status, trial.score, state = "pruned", score, optuna.trial.TrialState.PRUNED
            else:
                trial.status, trial.score, trial.model = "ok", score, out.get("model")
                state, value = optuna.trial.TrialState.COMPLETE, score
        with lock:
            for key, attr in ((STATUS, trial.status), (EPOCHS, trial.epochs), (POINT, _jsonable(trial.params)),
                              (ERROR, trial.error and trial.error[:2000])):
                if attr is not None:
                    otrial.set_user_attr(key, attr)
            study.tell(otrial, value, state=state)
            if mirror is not None:
                mirror.finish(trial.number, trial.status, trial.score, mode, trial.error)
        if tracker is not None:
            tracker.end_trial(run_id, trial)
        log.info("trial %d %s after %.1fs and %d epochs: %s=%s params=%s%s", trial.number, trial.status,
                 trial.duration, trial.epochs, metric, trial.score, trial.params,
                 f" error: {trial.error}" if trial.error else "")

    todo, first_new = max(0, max_evals - earlier), len(records)
    with ThreadPoolExecutor(parallelism, thread_name_prefix="elephant-trial") as pool, \
            tqdm(total=max_evals, initial=min(earlier, max_evals), desc="search", unit="trial",
                 disable=verbose in (0, False, None)) as bar:
        shown, started = (), 0
        try:
            while True:
                while started < todo and len(running) < parallelism and (stop_at is None or time.monotonic() < stop_at):
                    ask(time.monotonic())
                    started += 1
                best = SearchResult(records, metric, mode, 0.0).best_trial
                line = (f"running={len(running)} pruned={sum(t.status == 'pruned' for t in records)} "
                        f"failed={sum(t.status in ('failed', 'timeout') for t in records)}"
                        f" best={'-' if best is None else f'{best.score:.4g}'}")
                done_count = min(earlier, max_evals) + sum(t.status != "running" for t in records[first_new:])
                if (done_count, line) != shown:  # redraw on change only
                    shown = (done_count, line)
                    bar.n = done_count
                    bar.set_postfix_str(line)
                if not running:
                    break
                done, _ = wait(list(running), timeout=POLL_S, return_when=FIRST_COMPLETED)
                for future in done:
                    tell(future, *running.pop(future))
                for _, job, _, deadline, _ in running.values():
                    if deadline is not None and time.monotonic() >= deadline:
                        job.cancel()
        except BaseException:  # Ctrl-C or a bug: stop the running fits before the pool joins them
            cancel_all([job for _, job, _, _, _ in running.values()], list(running))
            raise
    result = SearchResult(records, metric, mode, time.monotonic() - t0,
                          mirror.trials if mirror is not None else None, study)
    if records and result.best_trial is None:
        log.warning("no trial succeeded; first error: %s", records[0].error)
    if tracker is not None:
        tracker.end_search(result)
    return result
