"""The Optuna side of a search: samplers, pruners and storage by name, and opening (or resuming) the study.

Every search keeps its trials in an Optuna study, driven by ask and tell from
the driver. Names resolve in one function each (:func:`get_sampler`,
:func:`get_pruner`, :func:`get_storage`); an unknown name raises a
:class:`~elephant.errors.ConfigError` listing the valid ones.
:func:`open_study` checks a stored study's fingerprint (space, metric, mode),
tells the trials an earlier driver left running that they failed and enqueues
them again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from collections.abc import Callable
from typing import Any

from elephant.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["HYPEROPT_ALGOS", "PRUNERS", "SAMPLERS", "HyperoptAlgo", "artifacts_for", "continued_seed", "get_pruner",
           "get_sampler", "get_storage", "open_study"]

SAMPLERS = ("tpe", "random", "qmc", "cmaes", "gp", "nsga2")
HYPEROPT_ALGOS = ("hyperopt-tpe", "hyperopt-rand", "hyperopt-anneal")
PRUNERS = ("asha", "hyperband", "median", None)
DEFAULT_STUDY = "elephant-search"
FINGERPRINT = "elephant.fingerprint"  # study user attr: the space, metric and mode the study was made for
INTERRUPTED = "elephant.interrupted"  # trial user attr: left RUNNING by a driver that died
RESUMED_FROM = "elephant.resumed_from"  # trial user attr: the interrupted trial this one retries
BACKUP_DIR = "elephant.backup_dir"  # trial user attr: where the trial's epoch backups go


@dataclasses.dataclass(frozen=True)
class HyperoptAlgo:
    """A hyperopt suggest function proposing the points; the study still records every trial."""

    name: str
    suggest: Callable


def get_sampler(identifier: Any = "tpe", *, seed: int | None = None, conditional: bool = False):
    """An Optuna sampler, or a :class:`HyperoptAlgo`, from a name, a sampler object or a hyperopt suggest function.

    ``"tpe"`` is Optuna's TPE with ``multivariate=True`` (and ``group=True``
    when the space has conditional branches, so each branch is modelled on its
    own); ``"random"``, ``"qmc"``, ``"cmaes"`` (needs ``cmaes``), ``"gp"``
    (needs torch and scipy) and ``"nsga2"`` are Optuna's samplers of those
    names; ``"hyperopt-tpe"``, ``"hyperopt-rand"`` and ``"hyperopt-anneal"`` are
    hyperopt's algorithms. All are seeded with ``seed``.
    """
    import optuna

    if isinstance(identifier, optuna.samplers.BaseSampler) or isinstance(identifier, HyperoptAlgo):
        return identifier
    if isinstance(identifier, str) and identifier in HYPEROPT_ALGOS:
        import hyperopt

        return HyperoptAlgo(identifier, getattr(hyperopt, identifier.split("-", 1)[1]).suggest)
    if isinstance(identifier, str) and identifier in SAMPLERS:
        s = optuna.samplers
        if identifier == "cmaes":
            _need("cmaes", "sampler='cmaes'")
        if identifier == "gp":
            _need("torch", "sampler='gp'")
            _need("scipy", "sampler='gp'")
        with warnings.catch_warnings():  # elephant's choice of arguments, not the user's: no experimental notice
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            if identifier == "tpe":
                return s.TPESampler(seed=seed, multivariate=True, group=conditional)
            return {"random": s.RandomSampler, "qmc": s.QMCSampler, "nsga2": s.NSGAIISampler, "gp": s.GPSampler,
                    "cmaes": s.CmaEsSampler}[identifier](seed=seed)
    if callable(identifier) and not isinstance(identifier, type):
        return HyperoptAlgo(getattr(identifier, "__module__", "hyperopt"), identifier)
    raise ConfigError(f"Could not interpret sampler identifier: {identifier!r}; `sampler` must be one of "
                      f"{list(SAMPLERS + HYPEROPT_ALGOS)}, an optuna.samplers.BaseSampler or a hyperopt suggest "
                      "function")


def get_pruner(identifier: Any = None, *, max_epochs: int | None = None):
    """An Optuna pruner from a name, a dict ``{"name": ..., **arguments}`` or a pruner object.

    Steps are epochs trained (1 after the first epoch). ``"asha"`` is
    ``SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)``: rungs at
    1, 3, 9, ... epochs, each trial decided when it reaches a rung, without
    waiting for the rung to fill. ``"hyperband"`` is ``HyperbandPruner(
    min_resource=1, max_resource=max_epochs or "auto", reduction_factor=3)``,
    ``"median"`` is ``MedianPruner()`` (it prunes nothing until 5 trials have
    completed) and None is ``NopPruner()``. A dict's other keys override these
    arguments.
    """
    import optuna

    if isinstance(identifier, optuna.pruners.BasePruner):
        return identifier
    name, kwargs = identifier, {}
    if isinstance(identifier, dict):
        kwargs = dict(identifier)
        name = kwargs.pop("name", None)
    p = optuna.pruners
    defaults = {"asha": (p.SuccessiveHalvingPruner, {"min_resource": 1, "reduction_factor": 3}),
                "hyperband": (p.HyperbandPruner, {"min_resource": 1, "max_resource": max_epochs or "auto",
                                                  "reduction_factor": 3}),
                "median": (p.MedianPruner, {}), None: (p.NopPruner, {})}
    if not (name is None or isinstance(name, str)) or name not in defaults:
        raise ConfigError(f"Could not interpret pruner identifier: {identifier!r}; `pruner` must be one of "
                          f"{list(PRUNERS)}, a dict {{'name': ..., **arguments}} or an optuna.pruners.BasePruner")
    cls, arguments = defaults[name]
    try:
        return cls(**{**arguments, **kwargs})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid arguments for pruner {name!r}: {exc}; received pruner={identifier!r}") from None


def get_storage(storage: Any):
    """Optuna storage: None (in memory), a journal file path, a database URL (``sqlite:///x.db``) or a storage."""
    import optuna

    if storage is None:
        return optuna.storages.InMemoryStorage()
    if isinstance(storage, optuna.storages.BaseStorage):
        return storage
    if isinstance(storage, (str, os.PathLike)):
        text = os.fspath(storage)
        if "://" in text:
            return optuna.storages.RDBStorage(text)
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        return JournalStorage(JournalFileBackend(text))
    raise ConfigError("`storage` must be None, a journal file path such as 'sweep.journal', a database URL such as "
                      f"'sqlite:///sweep.db' or an optuna storage; received storage={storage!r}")


def artifacts_for(storage: Any, artifacts_dir: Any = None) -> str | None:
    """Where the trials' epoch backups go: ``artifacts_dir``, else next to a file storage, else None."""
    if artifacts_dir is not None:
        return os.fspath(artifacts_dir)
    if isinstance(storage, (str, os.PathLike)):
        text = os.fspath(storage)
        if text.startswith("sqlite:///"):
            text = text[len("sqlite:///"):]
        elif "://" in text:
            return None
        return os.path.splitext(text)[0] + "-trials"
    return None


def continued_seed(seed: int | None, stored: int) -> int | None:
    """The sampler's seed for a call that continues a study already holding ``stored`` trials.

    The first call's seed again would draw the first call's points again (a
    sampler's random state is not stored), so a continuing call derives its
    seed from ``(seed, stored)``: reproducible, and fresh points.
    """
    if seed is None or not stored:
        return seed
    import numpy as np

    return int(np.random.SeedSequence([seed, stored]).generate_state(1)[0])


def fingerprint(space, metric: str, mode: str) -> dict:
    return {"space": space.fingerprint(), "describe": space.describe(), "metric": metric, "mode": mode}


def open_study(storage, study_name: str | None, sampler, pruner, *, space, metric: str, mode: str,
               retry_interrupted: bool = True):
    """Create the study, or load it and make it ready to continue: ``(study, interrupted trial numbers)``.

    A loaded study must have been made for the same space, metric and mode.
    Trials it holds as RUNNING belonged to a driver that died: each is told
    FAIL (user attr ``elephant.interrupted``) and, with ``retry_interrupted``,
    enqueued again with its parameters (user attr ``elephant.resumed_from``).

    Raises:
        ConfigError: the stored study was made for another space, metric or mode.
    """
    import optuna

    name = study_name or DEFAULT_STUDY
    direction = "minimize" if mode == "min" else "maximize"
    wanted = fingerprint(space, metric, mode)
    try:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
    except KeyError:
        study = optuna.create_study(storage=storage, sampler=sampler, pruner=pruner, study_name=name,
                                    direction=direction)
        study.set_user_attr(FINGERPRINT, wanted)
        return study, []
    stored = study.user_attrs.get(FINGERPRINT)
    if stored is None:
        raise ConfigError(f"study {name!r} in this storage was not made by elephant's search (it has no "
                          f"{FINGERPRINT!r} user attr); pass another study_name")
    if (stored["metric"], stored["mode"]) != (metric, mode):
        raise ConfigError(f"study {name!r} was made for metric={stored['metric']!r}, mode={stored['mode']!r}; "
                          f"received metric={metric!r}, mode={mode!r}: pass another study_name or storage")
    if stored["space"] != wanted["space"]:
        added = sorted(set(wanted["describe"]) - set(stored["describe"]))
        removed = sorted(set(stored["describe"]) - set(wanted["describe"]))
        raise ConfigError(f"study {name!r} was made for another space: this space adds {added} and lacks "
                          f"{removed}; pass another study_name or storage to search this space")
    interrupted = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        optuna.trial.Trial(study, trial._trial_id).set_user_attr(INTERRUPTED, True)
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        interrupted.append(trial.number)
        if retry_interrupted:
            attrs = {RESUMED_FROM: trial.number}
            if BACKUP_DIR in trial.user_attrs:
                attrs[BACKUP_DIR] = trial.user_attrs[BACKUP_DIR]
            study.enqueue_trial(dict(trial.params), user_attrs=attrs)
    if interrupted:
        log.warning("study %r: trials %s were running when the last driver stopped; marked failed%s", name,
                    interrupted, " and enqueued again" if retry_interrupted else "")
    return study, interrupted


def _need(module: str, what: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"{what} needs the {module!r} package: pip install {module}")
