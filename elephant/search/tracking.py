"""MLflow runs of a search: one parent run for the search, one child run per trial.

Trials run in driver threads and MLflow's fluent run stack is per thread, so
everything goes through one ``mlflow.MlflowClient`` with explicit run ids,
under a lock. A trial's child run gets its parameters, the fit's logs at each
epoch end (``step`` = epochs trained) and its end state: FINISHED (complete),
KILLED (pruned, or left running by a driver that stopped) or FAILED (failed or
timed out; the tag ``elephant.status`` says which). The parent gets the best
score and parameters and, when ``log_model`` is on, the best model as the
artifact ``best_model/model.keras``. The parent's id is kept in the study
(user attr ``elephant.mlflow_parent``), so a resumed search logs into the
same parent. A failing MLflow call is logged as a warning and does not stop
the search.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

from elephant.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["MlflowTracker", "flatten", "tracking_uri_for"]

PARENT = "elephant.mlflow_parent"  # study user attr
RUN_ID = "elephant.mlflow_run_id"  # trial user attr (written by the search loop)
_END = {"ok": "FINISHED", "pruned": "KILLED", "failed": "FAILED", "timeout": "FAILED"}


def tracking_uri_for(storage: Any) -> str:
    """The default store: ``mlflow.db`` (SQLite) next to a file storage, else in the working directory."""
    folder = "."
    if isinstance(storage, (str, os.PathLike)):
        text = os.fspath(storage)
        if text.startswith("sqlite:///"):
            folder = os.path.dirname(text[len("sqlite:///"):]) or "."
        elif "://" not in text:
            folder = os.path.dirname(text) or "."
    return f"sqlite:///{os.path.abspath(os.path.join(folder, 'mlflow.db'))}"


def flatten(point: Any, prefix: str = "") -> dict[str, str]:
    """A trial's point as MLflow parameters: nested dicts joined with dots, values as text of at most 500 chars."""
    if not isinstance(point, Mapping):
        return {prefix or "value": str(point)[:500]}
    out: dict[str, str] = {}
    for key, value in point.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        out.update(flatten(value, name) if isinstance(value, Mapping) else {name: str(value)[:500]})
    return out


class MlflowTracker:
    """Parent and child runs through one ``MlflowClient``; see the module docstring."""

    def __init__(self, tracking_uri: str, experiment: str | None = None, log_model: bool = True):
        try:
            from mlflow import MlflowClient
        except ImportError as exc:
            raise ImportError("mlflow=... needs MLflow: pip install 'elephant[mlflow]'") from exc
        self.tracking_uri, self.experiment, self.log_model = tracking_uri, experiment, log_model
        self.client, self.lock = MlflowClient(tracking_uri=tracking_uri), threading.Lock()
        self.parent: str | None = None
        self.experiment_id: str | None = None

    @classmethod
    def from_argument(cls, value: Any, *, storage: Any = None) -> MlflowTracker:
        """``minimize``'s ``mlflow``: True, a tracking URI or a dict of ``tracking_uri``, ``experiment``, ``log_model``."""
        keys = ("tracking_uri", "experiment", "log_model")
        if value is True:
            return cls(tracking_uri_for(storage))
        if isinstance(value, str) and value:
            return cls(value)
        if isinstance(value, Mapping) and set(value) <= set(keys):
            return cls(value.get("tracking_uri") or tracking_uri_for(storage), value.get("experiment"),
                       bool(value.get("log_model", True)))
        raise ConfigError(f"`mlflow` must be False, True, a tracking URI or a dict with keys {list(keys)}; "
                          f"received mlflow={value!r}")

    def _call(self, what: str, fn, *args, **kwargs):
        with self.lock:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # tracking must not end a trial or the search
                log.warning("MLflow: %s failed: %s: %s", what, type(exc).__name__, exc)
                return None

    def start_search(self, study, interrupted: list) -> None:
        """Open (or reopen, after a resume) the parent run; end the runs of interrupted trials as KILLED."""
        name = self.experiment or study.study_name

        def start():
            found = self.client.get_experiment_by_name(name)
            if found is not None:
                self.experiment_id = found.experiment_id
            else:
                folder = os.path.dirname(self.tracking_uri[len("sqlite:///"):]) \
                    if self.tracking_uri.startswith("sqlite:///") else None
                self.experiment_id = self.client.create_experiment(
                    name, artifact_location=os.path.join(folder, "mlartifacts") if folder else None)
            parent = study.user_attrs.get(PARENT)
            if parent is not None:
                self.client.update_run(parent, status="RUNNING")
            else:
                parent = self.client.create_run(self.experiment_id, run_name=study.study_name,
                                                tags={"elephant.study": study.study_name}).info.run_id
                study.set_user_attr(PARENT, parent)
            self.parent = parent
            for trial in study.get_trials(deepcopy=False):
                if trial.number in interrupted and RUN_ID in trial.user_attrs:
                    self.client.set_terminated(trial.user_attrs[RUN_ID], "KILLED")

        self._call("starting the search's run", start)

    def start_trial(self, number: int, point: Any) -> str | None:
        """A child run for trial ``number`` with ``point`` as its parameters; its run id."""
        if self.parent is None:
            return None

        def start():
            from mlflow.entities import Param

            run = self.client.create_run(self.experiment_id, run_name=f"trial-{number}",
                                         tags={"mlflow.parentRunId": self.parent, "elephant.trial": str(number)})
            params = [Param(k, v) for k, v in flatten(point).items()]
            if params:
                self.client.log_batch(run.info.run_id, params=params)
            return run.info.run_id

        return self._call(f"starting trial {number}'s run", start)

    def log_epoch(self, run_id: str | None, step: int, logs: Mapping[str, Any]) -> None:
        if run_id is None:
            return
        from mlflow.entities import Metric

        def log_metrics():
            import time

            now = int(time.time() * 1000)
            metrics = [Metric(str(k), float(v), now, step) for k, v in logs.items() if _number(v)]
            if metrics:
                self.client.log_batch(run_id, metrics=metrics)

        self._call(f"logging epoch {step}", log_metrics)

    def end_trial(self, run_id: str | None, trial) -> None:
        if run_id is None:
            return

        def end():
            self.client.set_tag(run_id, "elephant.status", trial.status)
            if trial.error:
                self.client.set_tag(run_id, "elephant.error", trial.error[:5000])
            self.client.set_terminated(run_id, _END.get(trial.status, "FAILED"))

        self._call(f"ending trial {trial.number}'s run", end)

    def end_search(self, result) -> None:
        """The best trial's score, parameters and (with ``log_model``) model on the parent; the parent FINISHED."""
        if self.parent is None:
            return
        best = result.best_trial

        def end():
            if best is not None:
                self.client.log_metric(self.parent, f"best_{result.metric}", float(best.score))
                self.client.set_tag(self.parent, "elephant.best_trial", str(best.number))
                for key, value in flatten(best.params).items():
                    self.client.set_tag(self.parent, f"best.{key}", value)
                if self.log_model and best.model is not None:
                    with tempfile.TemporaryDirectory() as folder:
                        path = os.path.join(folder, "model.keras")
                        best.model.save(path)
                        self.client.log_artifact(self.parent, path, artifact_path="best_model")
            self.client.set_terminated(self.parent, "FINISHED")

        self._call("ending the search's run", end)


def _number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True
