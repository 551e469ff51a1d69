"""Hyperparameter search whose trials are elephant fits, recorded in an Optuna study.

:func:`minimize` is the Spark façade: it checks its arguments and the space
before Spark starts, then runs :func:`elephant.search.engine.run_search` with
one elephant fit per trial, each in its own driver thread, Spark job group (a
tag under Spark Connect) and parameter server (own port and token). :class:`FitJob` is a trial's handle:
cancellation from any thread, and the epoch-end report that lets the pruner
stop the fit (``model.stop_training``) as soon as an epoch ends.

============  ================================================================
module        concern
============  ================================================================
``space``     routing and validation of the space's keys
``compile``   a hyperopt ``hp`` space compiled to Optuna's suggestions
``study``     Optuna's samplers, pruners and storage; opening the study
``result``    what a search returns (:class:`SearchResult`, :class:`Trial`)
``job``       a trial's handle: one cancellable fit (:class:`FitJob`)
``engine``    the search loop, free of Spark (:func:`run_search`)
``tracking``  MLflow runs: one parent per search, one child per trial
============  ================================================================
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
from hyperopt import hp

from elephant import session
from elephant.errors import ConfigError
from elephant.search.compile import compile_space
from elephant.search.engine import resolve_sampler, run_search
from elephant.search.job import BUILD_LOCK, FitJob, cancel_all  # noqa: F401  (importable from here)
from elephant.search.result import SearchResult, Trial, TrialList  # noqa: F401  (importable from here)
from elephant.search.space import ELEPHANT_KEYS, FIT_KEYS, Routed, check_keys  # noqa: F401  (importable from here)
from elephant.search.space import build_params, check_space, elephant_settings, route
from elephant.search.study import artifacts_for, get_pruner, get_storage

log = logging.getLogger(__name__)

__all__ = ["SearchResult", "Trial", "hp", "minimize", "run_search"]


def plan_workers(slots: int, parallelism: int, requested: int | None = None) -> int:
    """Workers per fit: ``requested``, else the task slots shared by the concurrent fits.

    Logs a warning when ``parallelism`` fits of that many workers need more than ``slots``.
    """
    workers = requested or max(1, slots // parallelism)
    if parallelism * workers > slots:
        log.warning("parallelism=%d x num_workers=%d = %d exceeds the %d task slots of this Spark cluster; fits "
                    "will wait for free slots and run slower", parallelism, workers, parallelism * workers, slots)
    return workers


def search_slots(spark, x, y) -> int:
    """The task slots the trials share; under Spark Connect, as the cluster's conf states them (1 if it does not).

    Raises:
        ConfigError: under Spark Connect, ``x`` is not a DataFrame.
    """
    if not session.is_connect(spark):
        return session.task_slots(spark.sparkContext)
    from elephant.fit.connect import connect_slots
    from elephant.sources import DataFrameSource, source

    if not isinstance(source(x, y), DataFrameSource):
        raise ConfigError(f"under Spark Connect a search trains on a DataFrame; received x of type {type(x).__name__}. "
                          "Make one with spark.createDataFrame (features as an array or Vector column, a label "
                          "column), or run the search with a classic SparkSession to train on numpy arrays or RDDs")
    keys = ("spark.master", "spark.task.cpus", "spark.executor.instances", "spark.executor.cores")
    slots = connect_slots({key: spark.conf.get(key, None) for key in keys})
    if slots is None:
        log.warning("under Spark Connect the cluster's task slots are not in its conf (spark.master=%r): each trial "
                    "gets 1 worker unless num_workers says otherwise", spark.conf.get("spark.master", None))
    return slots or 1


def check_positive(name: str, value: Any, allow_none: bool = True, integer: bool = False) -> None:
    if value is None and allow_none:
        return
    kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0 or not math.isfinite(value):
        what = "a positive int" if integer else "a positive number of seconds"
        raise ConfigError(f"`{name}` must be {what}{' or None' if allow_none else ''}; received {name}={value!r}")


def minimize(build_fn: Callable[..., Any], space: Any, x, y=None, *, max_evals: int, parallelism: int = 1,
             sampler: Any = "tpe", algo: Any = None, pruner: Any = None, metric: str = "val_loss",
             mode: str = "min", storage: Any = None, study_name: str | None = None, retry_interrupted: bool = True,
             artifacts_dir: str | os.PathLike | None = None, mlflow: Any = False, validation_data=None,
             validation_split: float = 0.0, timeout: float | None = None, trial_timeout: float | None = None,
             seed: int | None = None, verbose: Any = 1, spark=None, **fit_kwargs) -> SearchResult:
    """Search ``space``, recording every trial in an Optuna study; each trial is one :class:`elephant.SparkModel` fit.

    Keys of ``space`` (a dict of hyperopt expressions and constants) and of
    ``fit_kwargs`` are routed by name: ``epochs``, ``batch_size``, ``shuffle``
    (fixed-only: ``callbacks``, ``features_col``, ``label_col``) to ``fit``;
    every SparkModel setting but ``seed`` (``mode``, ``frequency``, ``num_workers``,
    ``optimizer``, ... :data:`elephant.search.space.ELEPHANT_KEYS`), ``optimizer.<param>``
    (fixed-only: ``custom_objects``, ``read_timeout``) to the SparkModel; any
    other key to ``build_fn``, whose signature must accept it. Bad keys or
    settings raise before any trial runs. Fix ``mode`` with a constant in the space.

    Args:
        build_fn: returns a compiled ``keras.Model`` from keyword arguments.
        space: the search space: ``hp`` expressions (compiled to Optuna's
            define-by-run suggestions, see :mod:`elephant.search.compile`), or
            a callable ``space(trial) -> dict`` using ``trial.suggest_*``.
        x, y: training data, anything :meth:`SparkModel.fit` accepts.
        max_evals: number of trials (failed, pruned and timed-out ones count,
            and so do finished trials already in ``storage``'s study).
        parallelism: trials run at once (default 1). Without ``num_workers`` a
            trial gets ``max(1, task_slots // parallelism)`` workers; a warning is
            logged when ``parallelism * num_workers`` exceeds the task slots.
        sampler: ``"tpe"`` (default: Optuna's multivariate TPE), ``"random"``,
            ``"qmc"``, ``"cmaes"``, ``"gp"``, ``"nsga2"``, ``"hyperopt-tpe"``,
            ``"hyperopt-rand"``, ``"hyperopt-anneal"``, an
            ``optuna.samplers.BaseSampler`` or a hyperopt suggest function.
        algo: hyperopt's algorithm as before (``"tpe"``, ``"rand"``,
            ``"anneal"`` or a suggest function): the same as
            ``sampler="hyperopt-<algo>"``; default None.
        pruner: ``"asha"``, ``"hyperband"``, ``"median"``, None (default: no
            pruning), a dict ``{"name": ..., **arguments}`` or an
            ``optuna.pruners.BasePruner``. Decided on the driver at each epoch
            end from ``metric``; a pruned trial stops at that epoch.
        metric: history key scored after the last epoch and reported at each
            epoch end (default ``"val_loss"``).
        mode: ``"min"`` (default) or ``"max"``.
        storage: None (default: in memory), a journal file path such as
            ``"sweep.journal"``, a database URL such as ``"sqlite:///sweep.db"``
            or an Optuna storage. The same call again continues the study.
        study_name: the study in ``storage`` (default ``"elephant-search"``).
        retry_interrupted: trials a stopped driver left running are marked
            failed and, when True (default), run again with their parameters,
            from their last epoch backup when there is one.
        artifacts_dir: where each trial's epoch backups go (default: next to a
            file storage, ``<storage without suffix>-trials``; none in memory).
        mlflow: False (default), True (an SQLite store next to the sweep), a
            tracking URI, or a dict (``tracking_uri``, ``experiment``,
            ``log_model``): one parent run for the search, one child run per trial.
        validation_data, validation_split: given to every fit (a ``val_`` metric needs one).
        timeout: seconds for the whole search (default None); then no trial starts
            and running ones are cancelled and recorded as ``"timeout"``.
        trial_timeout: seconds per trial (default None), cancelled the same way.
        seed: seed of the sampler and of the space check (default None).
        verbose: show the search progress bar (default 1); trial fits are silent.
        spark: a SparkSession (default: the active one, else an embedded local
            one), or a Spark Connect session, where ``x`` must be a DataFrame and
            trials are cancelled through their tags.
        **fit_kwargs: fixed values for routed keys, e.g. ``epochs=5, optimizer="dynsgd"``.

    Returns:
        A :class:`SearchResult` with one :class:`Trial` per trial of the study.

    Raises:
        ConfigError: an argument, or a key or value of the space, is invalid,
            ``storage`` holds a study of another space, metric or mode, or ``x``
            is not a DataFrame under Spark Connect.
    """
    if not callable(build_fn):
        raise ConfigError(f"`build_fn` must be callable and return a compiled keras.Model; received {build_fn!r}")
    check_positive("max_evals", max_evals, allow_none=False, integer=True)
    check_positive("parallelism", parallelism, allow_none=False, integer=True)
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
    compiled = compile_space(space)
    resolve_sampler(sampler, algo, seed=seed, conditional=compiled.conditional)
    epochs = fit_kwargs.get("epochs") if isinstance(fit_kwargs.get("epochs"), int) else None
    pruner = get_pruner(pruner, max_epochs=epochs)
    if not isinstance(storage, (str, os.PathLike)):  # a path or URL is opened by the search itself
        get_storage(storage)
    if not isinstance(retry_interrupted, bool):
        raise ConfigError("`retry_interrupted` must be True or False; received "
                          f"retry_interrupted={retry_interrupted!r}")
    tracker = None
    if mlflow is not False and mlflow is not None:
        from elephant.search.tracking import MlflowTracker

        tracker = MlflowTracker.from_argument(mlflow, storage=storage)
    params = build_params(build_fn)
    largest = check_space(space, fit_kwargs, params, seed)
    spark = spark or session.get_or_create()
    slots = search_slots(spark, x, y)
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

    log.info("search: %d trials, parallelism %d, sampler %s, pruner %s, %s %s, %d task slots, %d workers per "
             "trial by default", max_evals, parallelism, algo or sampler, type(pruner).__name__, mode, metric, slots,
             default_workers)
    return run_search(objective, space, max_evals=max_evals, parallelism=parallelism, sampler=sampler, algo=algo,
                      pruner=pruner, metric=metric, mode=mode, storage=storage, study_name=study_name,
                      retry_interrupted=retry_interrupted, artifacts_dir=artifacts_for(storage, artifacts_dir),
                      timeout=timeout, trial_timeout=trial_timeout, seed=seed, verbose=verbose,
                      make_job=lambda number: FitJob(spark, f"trial{number}"), tracker=tracker)
