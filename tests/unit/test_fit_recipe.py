"""elephant.fit.recipe: the defaults' adjustments to the user's optimizer, in order, and the plans they build.

The golden file ``tests/unit/data/fit_plans.json.gz`` holds ``plan_fit(...).as_dict()`` (less its ``"recipe"``) for a
grid of fits, recorded from the plan before it went through the recipe (:func:`write_golden`); the plans built
through the recipe must be the same, key for key.
"""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import pathlib

import keras
import pytest

from elephant.config import Settings
from elephant.fit.plan import plan_fit

GOLDEN = pathlib.Path(__file__).parent / "data" / "fit_plans.json.gz"

MODES = ("synchronous", "asynchronous", "hogwild")
WORKERS = (1, 2, 4, 8, 16, 64)
OPTIMIZERS = ("adam", "sgd", "sgd_momentum", "rmsprop", "adam_schedule")
BATCH_SPLITS = (None, False)
FREQUENCIES = (None, "epoch", 4)
MODELS = ("kb", "mb")  # a few KB of weights, and a few MB
SAMPLES = (2_000, 2_000_000)
HOSTED = (False, True)
BATCH_SIZE = 32


def _local(name: str):
    if name == "adam":
        return keras.optimizers.Adam(1e-3)
    if name == "sgd":
        return keras.optimizers.SGD(0.1)
    if name == "sgd_momentum":
        return keras.optimizers.SGD(0.05, momentum=0.9)
    if name == "rmsprop":
        return keras.optimizers.RMSprop(1e-3)
    return keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(1e-3, 100, 0.9))


@functools.lru_cache(maxsize=None)
def _model(size: str, optimizer: str):
    features, width = (16, 32) if size == "kb" else (1024, 1024)
    model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(width), keras.layers.Dense(1)])
    model.compile(_local(optimizer), "mse")
    return model


def _configs():
    """``(key, plan_fit's arguments)`` for every fit of the grid."""
    for mode, workers, optimizer, split, frequency, size, samples, hosted in itertools.product(
            MODES, WORKERS, OPTIMIZERS, BATCH_SPLITS, FREQUENCIES, MODELS, SAMPLES, HOSTED):
        key = f"{mode}/{workers}/{optimizer}/split={split}/frequency={frequency}/{size}/{samples}/hosted={hosted}"
        settings = Settings(mode=mode, batch_split=split, frequency=frequency)
        yield key, (settings, _model(size, optimizer), workers, BATCH_SIZE, samples), hosted


def _plans() -> dict:
    """Every plan of the grid as ``fit_plan`` shows it, less its recipe, through JSON (tuples as lists)."""
    found = {}
    for key, args, hosted in _configs():
        shown = plan_fit(*args, hosted=hosted).as_dict()
        shown.pop("recipe", None)
        found[key] = json.loads(json.dumps(shown))
    return found


def write_golden() -> None:
    """Record the grid's plans from the code as it is (run once, before the plan went through the recipe)."""
    GOLDEN.parent.mkdir(exist_ok=True)
    with gzip.open(GOLDEN, "wt", encoding="utf-8") as out:
        json.dump(_plans(), out, sort_keys=True, separators=(",", ":"))


def test_the_plans_are_the_golden_ones():
    with gzip.open(GOLDEN, "rt", encoding="utf-8") as held:
        golden = json.load(held)
    found = _plans()
    assert found.keys() == golden.keys()
    differ = [key for key in golden if found[key] != golden[key]]
    assert differ == [], f"{len(differ)} plans differ, e.g. {differ[0]}: {found[differ[0]]} != {golden[differ[0]]}"
