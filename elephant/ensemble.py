"""Ensembles of Keras models: combined predictions, distributed predict and evaluate, save and load.

``"mean"`` averages member outputs (weighted by ``weights``); ``"vote"`` takes the
weighted majority of class labels (row argmax, or ``p > 0.5`` for one sigmoid
unit), ties to the lowest class. Both work row by row, so a block combined on an
executor equals the same rows combined on the driver. Members ship once per call
and are rebuilt once per Python worker into this module's cache (not
:func:`elephant.replicas.cached_model`, whose 4 slots an ensemble would thrash).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import zipfile
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from elephant import combine as C
from elephant import data as D
from elephant import framework, session
from elephant.combine import check_combine, check_weights, combine_predictions, vote_shares
from elephant.errors import ConfigError, DataError, ElephantError
from elephant.sources import RDDSource, source

log = logging.getLogger(__name__)

__all__ = ["Ensemble", "combine_predictions", "vote_shares"]

COMBINES = C.COMBINES  # the combination math lives in elephant.combine; kept importable from here
MANIFEST = "ensemble.json"
_MEMBER_NAME = re.compile(r"member_\d+\.keras")
_CACHE: OrderedDict[tuple, list] = OrderedDict()  # per Python worker: member fingerprints -> models
_SCORERS: dict[tuple, Any] = {}  # per Python worker: (compile config, output shape) -> scoring model


def _predict(specs: Sequence[tuple], x, batch_size, how: str, weights, scored: bool = False):
    """Executor side: the combined prediction of a block (``scored``: what evaluate scores)."""
    from elephant.replicas import predict_block

    preds = [predict_block(m, x, batch_size) for m in _members(specs)]
    return C.scored(preds, how, weights) if scored else combine_predictions(preds, how, weights)


def _members(specs: Sequence[tuple]) -> list:
    """Executor side: the member models of ``specs``, built once per Python worker (2 ensembles kept)."""
    from elephant import replicas
    from elephant.model_io import model_from_bytes

    framework.enter_task(specs[0][3], "an ensemble task")
    key = tuple(fp for _, fp, _, _ in specs)
    if key not in _CACHE:
        replicas.limit_threads(1)
        if logging.getLogger("tensorflow").level == logging.NOTSET:  # members' first calls trip TF's
            logging.getLogger("tensorflow").setLevel(logging.ERROR)  # retracing warning: noise
        _CACHE[key] = [model_from_bytes(b.value, co) for b, _, co, _ in specs]
        while len(_CACHE) > 2:
            _CACHE.popitem(last=False)
    _CACHE.move_to_end(key)
    return _CACHE[key]


def _scorer(compile_config: Mapping[str, Any], shape: tuple, custom_objects=None):
    """A weightless identity model compiled like the first member: Keras scores the combined output."""
    import keras

    key = (json.dumps(compile_config, sort_keys=True, default=str), tuple(shape))
    if key not in _SCORERS:
        inputs = keras.Input(shape)
        model = keras.Model(inputs, keras.layers.Identity()(inputs))
        with keras.saving.custom_object_scope(dict(custom_objects or {})):
            model.compile_from_config(dict(compile_config))
        _SCORERS[key] = model
    return _SCORERS[key]


class Ensemble:
    """A fixed set of Keras models whose predictions are combined.

    Args:
        models: ``keras.Model`` instances (or SparkModels, whose ``.model`` is used).
        weights: None (default, equal weights) or one positive number per member.
        combine: ``"mean"`` (default) or ``"vote"``.
        spark: SparkSession for distributed calls (default: the active or an embedded one).
        custom_objects: custom layers/losses needed to rebuild members on executors.
        num_workers: blocks a numpy input is split into (default: Spark's default parallelism).

    Raises:
        ConfigError: an argument is invalid.
    """

    def __init__(self, models, weights=None, combine: str = "mean", *, spark=None, custom_objects=None,
                 num_workers: int | None = None):
        import keras

        models = [getattr(m, "model", m) if type(m).__name__ == "SparkModel" else m for m in (models or [])]
        if not models or not all(isinstance(m, keras.Model) for m in models):
            raise ConfigError(f"`models` must be a non-empty list of keras.Model; received {[type(m).__name__ for m in models]}")
        self.models, self.combine = list(models), check_combine(combine)
        self.weights = check_weights(weights, len(models))
        self.custom_objects, self.num_workers, self._spark = dict(custom_objects or {}), num_workers, spark
        self.histories: list | None = None  # member fit histories, set by fit_members
        self._archives: dict[str, bytes] = {}  # content fingerprint -> .keras bytes, reused across calls

    def __len__(self) -> int:
        return len(self.models)

    @property
    def spark(self):
        from elephant import session

        self._spark = self._spark or session.get_or_create()
        session.require_classic(self._spark, "An Ensemble")
        return self._spark

    def _ship(self, sc) -> tuple[list, list]:
        """One broadcast per member; specs are ``(broadcast, fingerprint, custom_objects, Keras backend)``.

        The fingerprint hashes architecture, compile settings and weights (a
        ``.keras`` archive embeds its save time), so executors keep the members
        of an earlier call as long as the weights are unchanged.
        """
        from elephant.model_io import model_fingerprint, model_to_bytes

        archives, specs = {}, []
        backend = framework.current_backend()
        framework.ship(sc, backend)
        for model in self.models:
            fp = model_fingerprint(model)
            archives[fp] = self._archives.get(fp) or model_to_bytes(model)
            specs.append((sc.broadcast(archives[fp]), fp, self.custom_objects or None, backend))
        self._archives = archives
        return [s[0] for s in specs], specs

    # ---------------------------------------------------------------- predict
    def predict_members(self, x, batch_size: int | None = None, *, local: bool = False) -> list:
        """Each member's prediction for numpy ``x`` (order kept), on Spark unless ``local``."""
        data = source(x)
        if data.distributed:
            raise DataError("predict_members takes numpy inputs; use predict for an RDD or DataFrame")
        data.checked_features(self.models[0])
        if local:
            return [m.predict(x, batch_size=batch_size, verbose=0) for m in self.models]
        sc = self.spark.sparkContext
        blocks = D.ordered_blocks(x, self.num_workers or max(1, sc.defaultParallelism))
        broadcasts, specs = self._ship(sc)

        def task(items):
            from elephant.ensemble import _members
            from elephant.replicas import predict_block

            return [[predict_block(m, b, batch_size) for m in _members(specs)] for b in items]

        try:  # collect() returns partitions in order, so predictions keep the input order
            with session.job_description(sc, f"elephant ensemble predict: {len(self.models)} members"):
                parts = sc.parallelize(blocks, len(blocks)).mapPartitions(task).collect()
        finally:
            for broadcast in broadcasts:
                broadcast.unpersist()
        return [D.concat_outputs([p[i] for p in parts]) for i in range(len(self.models))]

    def predict(self, x, batch_size: int | None = None, *, local: bool = False,
                features_col: str | Sequence[str] = "features", prediction_col: str = "prediction"):
        """Combined predictions: numpy in -> numpy out (order kept), combined on the driver.

        An RDD gives an RDD (one prediction per record, or per ``(x, y)`` block);
        a DataFrame gives its rows plus ``prediction_col`` (float array for
        ``"mean"``, long label for ``"vote"``). ``local=True`` predicts numpy on the driver.
        """
        data = source(x)
        if not data.distributed:
            return combine_predictions(self.predict_members(x, batch_size, local=local), self.combine, self.weights)
        how, weights, shapes = self.combine, self.weights, D.model_input_shapes(self.models[0])
        if isinstance(data, RDDSource):
            _, specs = self._ship(x.context)  # broadcasts live as long as the lazy result needs them

            def task(items):
                from elephant.ensemble import _predict
                from elephant.inference import rdd_predictions

                return rdd_predictions(items, lambda f: _predict(specs, f, batch_size, how, weights), shapes)

            return x.mapPartitions(task)
        from elephant.inference import with_predictions

        session.require_classic(x.sparkSession, "Ensemble.predict")
        _, specs = self._ship(x.sparkSession.sparkContext)

        def predict(features):
            from elephant.ensemble import _predict

            return _predict(specs, features, batch_size, how, weights)

        return with_predictions(x, features_col, prediction_col, predict, vote=how == "vote")

    # --------------------------------------------------------------- evaluate
    def evaluate(self, x, y=None, batch_size: int | None = None, return_dict: bool = False, *, local: bool = False,
                 features_col: str | Sequence[str] = "features", label_col: str = "label"):
        """Loss and metrics of the combined output, with the first member's compiled loss and metrics.

        ``"mean"`` scores the mean output; ``"vote"`` the vote shares, so
        accuracy-type metrics measure the majority vote. numpy inputs are scored
        on the driver in one pass; RDD and DataFrame blocks on executors, then
        sample-weighted (like :meth:`elephant.SparkModel.evaluate`). Lists put the loss first.
        """
        config = self.models[0].get_compile_config() if getattr(self.models[0], "compiled", False) else None
        if not config:
            raise ConfigError("evaluate scores with the first member's loss and metrics, but it is not compiled")
        how, weights, custom = self.combine, self.weights, self.custom_objects or None
        data = source(x, y)
        data.refuse()
        if not data.distributed:
            data.checked_weights(self.models[0])
            out = C.scored(self.predict_members(x, batch_size, local=local), how, weights)
            logs = _scorer(config, out.shape[1:], custom).evaluate(out, y, batch_size=batch_size, verbose=0, return_dict=True)
            parts = [(1, {k: float(v) for k, v in logs.items()})]  # one part: the mean is the value itself
        else:
            if data.spark is not None:
                session.require_classic(data.spark, "Ensemble.evaluate")
            rdd = data.labeled_blocks(self.models[0], None, features_col=features_col, label_col=label_col)
            broadcasts, specs = self._ship(rdd.context)

            def task(blocks):
                from elephant.ensemble import _predict, _scorer
                from elephant.replicas import evaluate_block

                scored = [(_predict(specs, xb, batch_size, how, weights, scored=True), yb) for xb, yb in blocks]
                return [(len(out), evaluate_block(_scorer(config, out.shape[1:], custom), out, yb, batch_size))
                        for out, yb in scored if len(out)]

            try:
                with session.job_description(rdd.context, "elephant ensemble evaluate"):
                    parts = rdd.mapPartitions(task).collect()
            finally:
                for broadcast in broadcasts:
                    broadcast.unpersist()
        from elephant.inference import combine_partition_logs

        return combine_partition_logs(parts, return_dict)

    # ----------------------------------------------------------- construction
    @classmethod
    def from_search(cls, result, top_k: int = 3, weights=None, combine: str = "mean", **kwargs) -> Ensemble:
        """The ``top_k`` best successful trials of a :class:`elephant.search.SearchResult`, best first."""
        trials = [t for t in result.top() if t.model is not None]
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or not 1 <= top_k <= len(trials):
            raise ConfigError(f"`top_k` must be an int in [1, {len(trials)}] (the successful trials of the search); "
                              f"received top_k={top_k!r}")
        return cls([t.model for t in trials[:top_k]], weights, combine, **kwargs)

    @classmethod
    def fit_members(cls, build_fn, n: int, x, y=None, parallelism: int = 1, bootstrap: bool = False,
                    seed: int | None = None, *, combine: str = "mean", weights=None, spark=None, verbose: Any = 1,
                    **fit_kwargs) -> Ensemble:
        """Train ``n`` members concurrently, each one elephant fit in its own driver thread.

        ``build_fn()`` returns a compiled model; if it takes ``seed``, member ``i``
        gets its own seed drawn from ``seed``, which also seeds the shard shuffle
        and, with ``bootstrap=True``, a same-size resample of ``x`` with replacement.
        ``fit_kwargs`` are SparkModel settings (``mode``, ``frequency``,
        ``optimizer``, ``num_workers``, ...) and fit arguments (``epochs``, ...).
        If a member fails, the others are cancelled and ElephantError is raised.
        """
        from tqdm.auto import tqdm

        from elephant import session
        from elephant.search import FitJob, cancel_all, check_positive, plan_workers
        from elephant.search.space import build_params, elephant_settings, route

        check_positive("n", n, allow_none=False, integer=True)
        check_positive("parallelism", parallelism, allow_none=False, integer=True)
        if not isinstance(bootstrap, bool):
            raise ConfigError(f"`bootstrap` must be True or False; received bootstrap={bootstrap!r}")
        check_weights(weights, n)
        check_combine(combine)
        accepted, required = build_params(build_fn)
        if required - {"seed"}:
            raise ConfigError(f"build_fn must be callable with no argument or only `seed`; it requires {sorted(required)}")
        extra = {k: fit_kwargs.pop(k) for k in ("validation_data", "validation_split") if k in fit_kwargs}
        routed = route(fit_kwargs, frozenset())
        settings = elephant_settings(routed.settings)
        spark = spark or session.get_or_create()
        session.require_classic(spark, "Ensemble.fit")
        settings["num_workers"] = plan_workers(session.task_slots(spark.sparkContext), parallelism,
                                               settings.get("num_workers"))
        seeds = [int(s) for s in np.random.SeedSequence(seed).generate_state(n)]
        jobs = [FitJob(spark, f"member{i}") for i in range(n)]

        def member(i: int):
            xi, yi = _resample(x, y, seeds[i]) if bootstrap else (x, y)
            make = (lambda: build_fn(seed=seeds[i])) if accepted is None or "seed" in accepted else build_fn
            return jobs[i].fit(make, dict(settings, seed=seeds[i]), xi, yi, {**routed.fit, **extra})

        with ThreadPoolExecutor(parallelism, thread_name_prefix="elephant-member") as pool, \
                tqdm(total=n, desc="ensemble", unit="member", disable=verbose in (0, False, None)) as bar:
            futures = {pool.submit(member, i): i for i in range(n)}
            for future in futures:
                future.add_done_callback(lambda f: bar.update(1))
            failed = None
            try:
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
                failed = next((f for f in done if f.exception() is not None), None)  # before others are cancelled
            finally:  # a failed member (or Ctrl-C) cancels the others
                if not all(f.done() and f.exception() is None for f in futures):
                    cancel_all(jobs, futures)
            if failed is not None:
                raise ElephantError(f"ensemble member {futures[failed]} failed: {failed.exception()}") from failed.exception()
        fitted = [f.result() for f in futures]
        ens = cls([sm.model for sm, _ in fitted], weights, combine, spark=spark, custom_objects=settings.get("custom_objects"))
        ens.histories = [history for _, history in fitted]
        return ens

    # -------------------------------------------------------------- save/load
    def save(self, path: str | os.PathLike) -> None:
        """Write the members and settings to a directory, or to one file when ``path`` ends with ``.zip``."""
        from elephant.model_io import model_to_bytes

        path = os.fspath(path)
        names = [f"member_{i}.keras" for i in range(len(self.models))]
        files = {name: model_to_bytes(m) for name, m in zip(names, self.models)}
        files[MANIFEST] = json.dumps({"format": "elephant.ensemble", "version": 1, "combine": self.combine,
                                      "weights": self.weights and list(self.weights), "members": names}).encode()
        if path.endswith(".zip"):
            with zipfile.ZipFile(path, "w") as archive:
                for name, data in files.items():
                    archive.writestr(name, data)
        else:
            os.makedirs(path, exist_ok=True)
            for name, data in files.items():  # the manifest is written last
                pathlib.Path(path, name).write_bytes(data)

    @classmethod
    def load(cls, path: str | os.PathLike, spark=None, custom_objects=None) -> Ensemble:
        """Rebuild an ensemble written by :meth:`save`."""
        from elephant.model_io import model_from_bytes

        path = os.fspath(path)
        if os.path.isdir(path):
            def read(name: str) -> bytes:
                return pathlib.Path(path, name).read_bytes()
        elif zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                read = {name: archive.read(name) for name in archive.namelist()}.__getitem__
        else:
            raise ConfigError(f"`path` must be a directory or .zip file written by Ensemble.save; received path={path!r}")
        try:
            manifest = json.loads(read(MANIFEST))
        except (OSError, KeyError, ValueError) as exc:
            raise ConfigError(f"{path!r} holds no readable {MANIFEST}; was it written by Ensemble.save?") from exc
        names = manifest.get("members") or []
        if manifest.get("format") != "elephant.ensemble" or not all(_MEMBER_NAME.fullmatch(str(n)) for n in names):
            raise ConfigError(f"{path!r} is not an elephant ensemble (bad {MANIFEST})")
        return cls([model_from_bytes(read(name), custom_objects) for name in names], manifest.get("weights"),
                   manifest.get("combine", "mean"), spark=spark, custom_objects=custom_objects)


def _resample(x, y, seed: int):
    """A bootstrap resample (same size, with replacement) of numpy arrays, an RDD or a DataFrame."""
    return source(x, y).bootstrap(seed)
