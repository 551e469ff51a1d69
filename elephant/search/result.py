"""What a search returns: one :class:`Trial` per trial, the best of them, the study and its plots."""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any

from elephant.errors import ConfigError

__all__ = ["PLOTS", "STATUSES", "SearchResult", "Trial", "TrialList"]

STATUSES = ("running", "ok", "pruned", "failed", "timeout")
#: ``SearchResult.plot`` kinds and the ``optuna.visualization.matplotlib`` function each one draws with.
PLOTS = {"history": "plot_optimization_history", "intermediate": "plot_intermediate_values",
         "importances": "plot_param_importances", "parallel": "plot_parallel_coordinate", "slice": "plot_slice",
         "contour": "plot_contour", "timeline": "plot_timeline"}


@dataclasses.dataclass
class Trial:
    """One trial; times in seconds from the start of the call that ran it.

    ``status`` is ``"running"``, ``"ok"`` (complete), ``"pruned"``,
    ``"failed"`` or ``"timeout"``. ``score`` is the metric after the last
    epoch trained (for a pruned trial, at the epoch it was stopped), ``epochs``
    the epochs it trained, ``model`` the trained Keras model (ok trials of this
    call only), ``ps_url`` its parameter server, ``resumed_from`` the
    interrupted trial it retries. ``number`` is the study's trial number.
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
    epochs: int = 0
    resumed_from: int | None = None


class TrialList(list):
    """A list of :class:`Trial` with :meth:`to_pandas`."""

    def to_pandas(self):
        """One row per trial (index ``number``): status, score, duration, epochs, parameters, resumed_from, error."""
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError("to_pandas() needs pandas: pip install pandas") from exc
        fixed = ("number", "status", "score", "duration", "epochs", "resumed_from", "error")
        rows = [{"number": t.number, "status": t.status, "score": t.score, "duration": round(t.duration, 2),
                 "epochs": t.epochs, **{(f"param_{k}" if k in fixed else k): v for k, v in t.params.items()},
                 "resumed_from": t.resumed_from, "error": t.error} for t in self]
        return pd.DataFrame(rows, columns=None if rows else list(fixed)).set_index("number")


@dataclasses.dataclass
class SearchResult:
    """What :func:`elephant.search.minimize` returns; ``best_*`` are None when no trial succeeded.

    ``study`` is the Optuna study that recorded the trials (None for results
    built by hand); ``hyperopt_trials`` mirrors it as a hyperopt ``Trials``
    (None for a callable space).
    """

    trials: list
    metric: str
    mode: str
    wall_time: float
    hyperopt_trials: Any = dataclasses.field(default=None, repr=False)
    study: Any = dataclasses.field(default=None, repr=False)

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

    def plot(self, kind: str = "history", path: str | os.PathLike | None = None, backend: str = "matplotlib",
             **kwargs):
        """Draw the study with Optuna's plots; the matplotlib Figure (or the plotly one).

        Args:
            kind: ``"history"`` (best value over trials), ``"intermediate"``
                (the metric at each epoch), ``"importances"``, ``"parallel"``
                (parallel coordinates), ``"slice"``, ``"contour"`` or
                ``"timeline"`` (default ``"history"``).
            path: where to save the figure (default None: not saved). With
                matplotlib an image by its suffix (PNG for ``.png``); with
                plotly an interactive page for ``.html``, else an image
                through plotly's ``write_image`` (which needs kaleido).
            backend: ``"matplotlib"`` (default: ``optuna.visualization.matplotlib``,
                works on a headless driver) or ``"plotly"`` (``optuna.visualization``,
                interactive in a notebook).
            **kwargs: given to the Optuna function (e.g. ``params=["lr"]``).

        Raises:
            ConfigError: an unknown ``kind`` or ``backend``, or a result without a study.
            ImportError: matplotlib (``pip install 'elephant[plots]'``) or
                plotly (``pip install plotly``) is not installed.
        """
        if kind not in PLOTS:
            raise ConfigError(f"`kind` must be one of {list(PLOTS)}; received kind={kind!r}")
        if backend not in ("matplotlib", "plotly"):
            raise ConfigError(f"`backend` must be 'matplotlib' or 'plotly'; received backend={backend!r}")
        if self.study is None:
            raise ConfigError("this SearchResult has no study to plot; results of minimize() have one")
        if backend == "plotly":
            return self._plotly(kind, path, **kwargs)
        try:
            import matplotlib  # noqa: F401  (on a headless driver its default backend draws to files)
        except ImportError as exc:
            raise ImportError(f"plot({kind!r}) needs matplotlib: pip install 'elephant[plots]'") from exc
        import optuna

        from optuna.visualization import matplotlib as plots

        with warnings.catch_warnings():  # Optuna marks its matplotlib plots experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            drawn = getattr(plots, PLOTS[kind])(self.study, **kwargs)
        axes = drawn.flat[0] if hasattr(drawn, "flat") else drawn
        figure = axes.figure
        if path is not None:
            figure.savefig(os.fspath(path), bbox_inches="tight")
        return figure

    def _plotly(self, kind: str, path: str | os.PathLike | None, **kwargs):
        try:
            import plotly  # noqa: F401
        except ImportError as exc:
            raise ImportError(f"plot({kind!r}, backend='plotly') needs plotly: pip install plotly") from exc
        from optuna import visualization

        figure = getattr(visualization, PLOTS[kind])(self.study, **kwargs)
        if path is not None:
            target = os.fspath(path)
            if target.lower().endswith((".html", ".htm")):
                figure.write_html(target)
            else:
                figure.write_image(target)
        return figure
