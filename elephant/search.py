"""Hyperparameter search whose trials are elephant fits, driven by hyperopt.

``fmin`` evaluates one point at a time, so :func:`run_search` drives the parts
``fmin`` uses itself (``Trials.new_trial_ids``, ``suggest(ids, domain, trials,
seed)``, ``Trials.insert_trial_docs``, ``space_eval``): whenever a slot is free
it asks for one point (TPE counts running trials as infinitely bad) and tells
hyperopt each result, from the calling thread only. Each trial is one fit in its
own driver thread, Spark job group and parameter server (own port and token).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any

import numpy as np
from hyperopt import hp

from elephant import search_space, session
from elephant.errors import ConfigError, ElephantError
from elephant.search_space import build_params, check_space, elephant_settings, route

log = logging.getLogger(__name__)

__all__ = ["SearchResult", "Trial", "hp", "minimize", "run_search"]

_ALGOS = ("tpe", "rand", "anneal")
_POLL_S = 0.2  # how often the driver checks deadlines and re-cancels late trials
BUILD_LOCK = threading.Lock()  # build_fn and SparkModel construction run one thread at a time

# Key routing and the space checks live in elephant.search_space; these stay importable from here.
FIT_KEYS, ELEPHANT_KEYS, Routed, check_keys = (search_space.FIT_KEYS, search_space.ELEPHANT_KEYS,
                                               search_space.Routed, search_space.check_keys)


class FitJob:
    """Cancellation handle of one trial; with ``spark``, one cancellable elephant fit.

    :meth:`fit` sets the job group in the thread that runs it (groups are per
    thread in PySpark's pinned-thread mode). :meth:`cancel` works from any thread
    and is repeated by the caller (a job started after a cancel needs another);
    the fit also stops at its next epoch edge.
    """

    def __init__(self, spark=None, label: str = "job"):
        self.cancelled = threading.Event()
        self.spark = spark
        self.group = f"elephant-{label}-{uuid.uuid4().hex[:8]}"
        self.sm = None

    def cancel(self) -> None:
        self.cancelled.set()
        if self.spark is not None:
            sc = self.spark.sparkContext
            sc.cancelJobGroup(self.group)
            if self.sm is not None and self.sm.job_group:
                sc.cancelJobGroup(self.sm.job_group)

    def check(self) -> None:
        if self.cancelled.is_set():
            raise ElephantError(f"{self.group} was cancelled by the driver (time limit or failure elsewhere)")

    def fit(self, make_model: Callable[[], Any], settings: Mapping[str, Any], x, y, fit_kwargs: Mapping[str, Any]):
        """Build the model (under :data:`BUILD_LOCK`), wrap it in a SparkModel and fit; ``(sm, history)``."""
        import keras

        from elephant.spark_model import SparkModel

        job, sc = self, self.spark.sparkContext

        class StopWhenCancelled(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                job.check()

            on_epoch_end = on_epoch_begin

        sc.setJobGroup(self.group, f"elephant {self.group}", interruptOnCancel=True)
        try:
            self.check()
            with BUILD_LOCK:
                self.sm = SparkModel(make_model(), spark=self.spark, **settings)
            kwargs = dict(fit_kwargs)
            callbacks = [copy.deepcopy(c) for c in kwargs.pop("callbacks", None) or []]  # one set per fit
            history = self.sm.fit(x, y, callbacks=[*callbacks, StopWhenCancelled()], verbose=0, **kwargs)
            self.check()
            return self.sm, history
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)


def cancel_all(jobs, futures) -> None:
    """Cancel ``jobs`` every 0.2 s until every future is done."""
    while not all(f.done() for f in futures):
        for job in jobs:
            job.cancel()
        wait(futures, timeout=_POLL_S)


def plan_workers(slots: int, parallelism: int, requested: int | None = None) -> int:
    """Workers per fit: ``requested``, else the task slots shared by the concurrent fits.

    Logs a warning when ``parallelism`` fits of that many workers need more than ``slots``.
    """
    workers = requested or max(1, slots // parallelism)
    if parallelism * workers > slots:
        log.warning("parallelism=%d x num_workers=%d = %d exceeds the %d task slots of this Spark cluster; fits "
                    "will wait for free slots and run slower", parallelism, workers, parallelism * workers, slots)
    return workers


@dataclasses.dataclass
class Trial:
    """One trial (``status``: running, ok, failed or timeout; times in seconds from the search's start).

    ``score`` is the metric after the last epoch, ``model`` the trained Keras
    model (ok trials only), ``ps_url`` the trial's parameter server.
    """

    number: int
    params: dict
    start: float = 0.0
    status: str = "running"
    score: float | None = None
    duration: float = 0.0
    history: dict = dataclasses.field(default_factory=dict)
    error: str | None = None
    ps_url: str | None = None
    model: Any = dataclasses.field(default=None, repr=False, compare=False)


class TrialList(list):
    """A list of :class:`Trial` with :meth:`to_pandas`."""

    def to_pandas(self):
        """One row per trial (index ``number``): status, score, duration, parameters, error."""
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError("to_pandas() needs pandas: pip install pandas") from exc
        fixed = ("number", "status", "score", "duration", "error")
        rows = [{"number": t.number, "status": t.status, "score": t.score, "duration": round(t.duration, 2),
                 **{(f"param_{k}" if k in fixed else k): v for k, v in t.params.items()}, "error": t.error} for t in self]
        return pd.DataFrame(rows, columns=None if rows else list(fixed)).set_index("number")


@dataclasses.dataclass
class SearchResult:
    """What :func:`minimize` returns; ``best_*`` are None when no trial succeeded."""

    trials: list
    metric: str
    mode: str
    wall_time: float
    hyperopt_trials: Any = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        self.trials = TrialList(self.trials)

    def top(self, k: int | None = None) -> list[Trial]:
        """The ``k`` best successful trials, best first (all when None); ties go to the earlier trial."""
        sign = 1.0 if self.mode == "min" else -1.0
        return sorted((t for t in self.trials if t.status == "ok"), key=lambda t: (sign * t.score, t.number))[:k]

    @property
    def best_trial(self) -> Trial | None:
        return next(iter(self.top(1)), None)

    best_params = property(lambda self: getattr(self.best_trial, "params", None), doc="Parameters of the best trial.")
    best_score = property(lambda self: getattr(self.best_trial, "score", None), doc="Score of the best trial.")
    best_model = property(lambda self: getattr(self.best_trial, "model", None), doc="Trained model of the best trial.")

    def to_pandas(self):
        return self.trials.to_pandas()


def _resolve_algo(algo: Any) -> Callable:
    if callable(algo):
        return algo
    if algo in _ALGOS:
        import hyperopt

        return getattr(hyperopt, algo).suggest
    raise ConfigError(f"`algo` must be one of {list(_ALGOS)} or a hyperopt suggest function; received algo={algo!r}")


def check_positive(name: str, value: Any, allow_none: bool = True, integer: bool = False) -> None:
    if value is None and allow_none:
        return
    kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0 or not math.isfinite(value):
        what = "a positive int" if integer else "a positive number of seconds"
        raise ConfigError(f"`{name}` must be {what}{' or None' if allow_none else ''}; received {name}={value!r}")


def run_search(objective: Callable[[dict, FitJob], Mapping[str, Any]], space: Any, *, max_evals: int,
               parallelism: int = 1, algo: Any = "tpe", metric: str = "score", mode: str = "min",
               timeout: float | None = None, trial_timeout: float | None = None, seed: int | None = None,
               verbose: Any = 0, make_job: Callable[[int], FitJob] | None = None) -> SearchResult:
    """The search loop, free of Spark: ``objective(params, job)`` runs one trial in a pool thread.

    ``objective`` returns ``{"score", "history", "model", "ps_url"}`` (``score``
    required); an exception marks the trial failed. A trial past its deadline
    gets ``job.cancel()`` every 0.2 s until its thread returns (status
    ``"timeout"``). Returns once every trial thread has ended.
    """
    import hyperopt
    from hyperopt.base import JOB_STATE_DONE, JOB_STATE_RUNNING, Domain, spec_from_misc
    from hyperopt.utils import coarse_utcnow
    from tqdm.auto import tqdm

    suggest, make_job = _resolve_algo(algo), make_job or (lambda number: FitJob(label=f"trial{number}"))
    domain, htrials, rstate = Domain(lambda params: None, space), hyperopt.Trials(), np.random.default_rng(seed)
    t0 = time.monotonic()
    stop_at = None if timeout is None else t0 + timeout
    records: list[Trial] = []
    running: dict[Any, tuple[Trial, FitJob, dict, float | None]] = {}

    def ask(now: float) -> None:
        ids = htrials.new_trial_ids(1)
        htrials.refresh()
        htrials.insert_trial_docs(suggest(ids, domain, htrials, rstate.integers(2**31 - 1)))
        htrials.refresh()
        doc = next(d for d in htrials.trials if d["tid"] == ids[0])
        doc["state"], doc["book_time"] = JOB_STATE_RUNNING, coarse_utcnow()
        trial = Trial(ids[0], hyperopt.space_eval(space, spec_from_misc(doc["misc"])), start=now - t0)
        records.append(trial)
        job = make_job(trial.number)
        deadline = min((t for t in (stop_at, trial_timeout and now + trial_timeout) if t), default=None)
        running[pool.submit(objective, dict(trial.params), job)] = (trial, job, doc, deadline)

    def tell(future, trial: Trial, job: FitJob, doc: dict, deadline) -> None:
        trial.duration, exc = time.monotonic() - t0 - trial.start, future.exception()
        if job.cancelled.is_set():
            trial.status, trial.error = "timeout", f"cancelled after {trial.duration:.1f}s: time limit reached"
        elif exc is not None:
            trial.status, trial.error = "failed", f"{type(exc).__name__}: {exc}"
        else:
            out = future.result()
            trial.history, trial.ps_url, score = dict(out.get("history") or {}), out.get("ps_url"), float(out["score"])
            if math.isfinite(score):
                trial.status, trial.score, trial.model = "ok", score, out.get("model")
            else:
                trial.status, trial.error = "failed", f"{metric} is {score}, not a finite number"
        loss = None if trial.score is None else (trial.score if mode == "min" else -trial.score)
        doc["result"] = {"status": hyperopt.STATUS_OK, "loss": loss} if trial.status == "ok" else \
            {"status": hyperopt.STATUS_FAIL, "failure": trial.error}
        doc["state"], doc["refresh_time"] = JOB_STATE_DONE, coarse_utcnow()
        htrials.refresh()
        log.info("trial %d %s after %.1fs: %s=%s params=%s%s", trial.number, trial.status, trial.duration, metric,
                 trial.score, trial.params, f" error: {trial.error}" if trial.error else "")

    with ThreadPoolExecutor(parallelism, thread_name_prefix="elephant-trial") as pool, \
            tqdm(total=max_evals, desc="search", unit="trial", disable=verbose in (0, False, None)) as bar:
        shown: tuple = ()
        try:
            while True:
                while len(records) < max_evals and len(running) < parallelism and \
                        (stop_at is None or time.monotonic() < stop_at):
                    ask(time.monotonic())
                best = SearchResult(records, metric, mode, 0.0).best_trial
                line = (f"running={len(running)} failed={sum(t.status in ('failed', 'timeout') for t in records)}"
                        f" best={'-' if best is None else f'{best.score:.4g}'}")
                finished = sum(t.status != "running" for t in records)
                if (finished, line) != shown:  # redraw on change only
                    shown = (finished, line)
                    bar.n = finished
                    bar.set_postfix_str(line)
                if not running:
                    break
                done, _ = wait(list(running), timeout=_POLL_S, return_when=FIRST_COMPLETED)
                for future in done:
                    tell(future, *running.pop(future))
                for _, job, _, deadline in running.values():
                    if deadline is not None and time.monotonic() >= deadline:
                        job.cancel()
        except BaseException:  # Ctrl-C or a bug: stop the running fits before the pool joins them
            cancel_all([job for _, job, _, _ in running.values()], list(running))
            raise
    result = SearchResult(records, metric, mode, time.monotonic() - t0, htrials)
    if records and result.best_trial is None:
        log.warning("no trial succeeded; first error: %s", records[0].error)
    return result


def minimize(build_fn: Callable[..., Any], space: Any, x, y=None, *, max_evals: int, parallelism: int = 1,
             algo: Any = "tpe", metric: str = "val_loss", mode: str = "min", validation_data=None,
             validation_split: float = 0.0, timeout: float | None = None, trial_timeout: float | None = None,
             seed: int | None = None, verbose: Any = 1, spark=None, **fit_kwargs) -> SearchResult:
    """Search ``space`` with hyperopt; every trial is one :class:`elephant.SparkModel` fit.

    Keys of ``space`` (a dict of hyperopt expressions and constants) and of
    ``fit_kwargs`` are routed by name: ``epochs``, ``batch_size``, ``shuffle``
    (fixed-only: ``callbacks``, ``features_col``, ``label_col``) to ``fit``;
    ``mode``, ``frequency``, ``num_workers``, ``optimizer``, ``optimizer.<param>``
    (fixed-only: ``custom_objects``, ``read_timeout``) to the SparkModel; any
    other key to ``build_fn``, whose signature must accept it. Bad keys or
    settings raise before any trial runs. Fix ``mode`` with a constant in the space.

    Args:
        build_fn: returns a compiled ``keras.Model`` from keyword arguments.
        space: the search space (see above).
        x, y: training data, anything :meth:`SparkModel.fit` accepts.
        max_evals: number of trials (failed and timed-out ones count).
        parallelism: trials run at once (default 1). Without ``num_workers`` a
            trial gets ``max(1, task_slots // parallelism)`` workers; a warning is
            logged when ``parallelism * num_workers`` exceeds the task slots.
        algo: ``"tpe"`` (default), ``"rand"``, ``"anneal"`` or a hyperopt suggest function.
        metric: history key scored after the last epoch (default ``"val_loss"``).
        mode: ``"min"`` (default) or ``"max"``.
        validation_data, validation_split: given to every fit (a ``val_`` metric needs one).
        timeout: seconds for the whole search (default None); then no trial starts
            and running ones are cancelled and recorded as ``"timeout"``.
        trial_timeout: seconds per trial (default None), cancelled the same way.
        seed: seed of hyperopt's ``rstate`` and of the space check (default None).
        verbose: show the search progress bar (default 1); trial fits are silent.
        spark: a SparkSession (default: the active one, else an embedded local one).
        **fit_kwargs: fixed values for routed keys, e.g. ``epochs=5, optimizer="dynsgd"``.

    Returns:
        A :class:`SearchResult` with one :class:`Trial` per trial.

    Raises:
        ConfigError: an argument, or a key or value of the space, is invalid.
    """
    if not callable(build_fn):
        raise ConfigError(f"`build_fn` must be callable and return a compiled keras.Model; received {build_fn!r}")
    check_positive("max_evals", max_evals, allow_none=False, integer=True)
    check_positive("parallelism", parallelism, allow_none=False, integer=True)
    _resolve_algo(algo)
    if not isinstance(metric, str) or not metric:
        raise ConfigError(f"`metric` must be a non-empty history key such as 'val_loss'; received metric={metric!r}")
    if mode not in ("min", "max"):
        raise ConfigError(f"`mode` must be 'min' or 'max'; received mode={mode!r}")
    check_positive("timeout", timeout)
    check_positive("trial_timeout", trial_timeout)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise ConfigError(f"`seed` must be an int or None; received seed={seed!r}")
    if metric.startswith("val_") and validation_data is None and not validation_split:
        raise ConfigError(f"metric={metric!r} needs validation_data or validation_split; received neither")
    params = build_params(build_fn)
    largest = check_space(space, fit_kwargs, params, seed)
    spark = spark or session.get_or_create()
    session.require_classic(spark, "search")
    slots = session.task_slots(spark.sparkContext)
    default_workers = max(1, slots // parallelism)
    plan_workers(slots, parallelism, largest or default_workers)

    def objective(point: dict, job: FitJob) -> dict:
        routed = route({**fit_kwargs, **point}, params[0])
        settings = elephant_settings(routed.settings)
        settings["num_workers"] = settings.get("num_workers") or default_workers
        sm, history = job.fit(lambda: build_fn(**routed.build), settings, x, y,
                              dict(routed.fit, validation_data=validation_data, validation_split=validation_split))
        hist = {k: [float(v) for v in values] for k, values in history.history.items()}
        if not hist.get(metric):
            raise ConfigError(f"metric={metric!r} is not in the fit history; available keys: {sorted(hist)}")
        return {"score": hist[metric][-1], "history": hist, "model": sm.model, "ps_url": sm.ps_url}

    log.info("search: %d trials, parallelism %d, algo %s, %s %s, %d task slots, %d workers per trial by default",
             max_evals, parallelism, algo, mode, metric, slots, default_workers)
    return run_search(objective, space, max_evals=max_evals, parallelism=parallelism, algo=algo, metric=metric,
                      mode=mode, timeout=timeout, trial_timeout=trial_timeout, seed=seed, verbose=verbose,
                      make_job=lambda number: FitJob(spark, f"trial{number}"))
