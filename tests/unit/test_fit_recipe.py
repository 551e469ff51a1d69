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

from elephant.config import Settings
from elephant.fit.plan import plan_fit
from elephant.fit.recipe import RECIPE, Outcome, describe_outcomes

ROOT = pathlib.Path(__file__).resolve().parents[2]
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


@functools.lru_cache(maxsize=1)
def _grid() -> dict:
    """Every plan of the grid, by key."""
    return {key: plan_fit(*args, hosted=hosted) for key, args, hosted in _configs()}


def _plans() -> dict:
    """Every plan of the grid as ``fit_plan`` shows it, less its recipe, through JSON (tuples as lists)."""
    found = {}
    for key, plan in _grid().items():
        shown = plan.as_dict()
        shown.pop("recipe", None)
        found[key] = json.loads(json.dumps(shown))
    return found


def write_golden() -> None:
    """Record the grid's plans from the code as it is (run once, before the plan went through the recipe)."""
    GOLDEN.parent.mkdir(exist_ok=True)
    _grid.cache_clear()
    with gzip.open(GOLDEN, "wt", encoding="utf-8") as out:
        json.dump(_plans(), out, sort_keys=True, separators=(",", ":"))


def test_the_plans_are_the_golden_ones():
    with gzip.open(GOLDEN, "rt", encoding="utf-8") as held:
        golden = json.load(held)
    found = _plans()
    assert found.keys() == golden.keys()
    differ = [key for key in golden if found[key] != golden[key]]
    assert differ == [], f"{len(differ)} plans differ, e.g. {differ[0]}: {found[differ[0]]} != {golden[differ[0]]}"


# ------------------------------------------------------------------ what each step says it did
def _outer_step(plan) -> bool:
    outer = getattr(plan.rule, "outer", None)
    return outer is not None and (outer.learning_rate != 1.0 or outer.resolve_momentum(plan.num_workers) != 0.0)


#: Whether each step changed the plan, read from the plan's values alone.
APPLIED = {
    "batch_split": lambda plan: plan.splits_batch and plan.num_workers > 1,
    "window_from_costs": lambda plan: plan.window_choice is not None,
    "lag_bound": lambda plan: (plan.window_choice is not None and plan.window_choice.lagged and plan.window is not None
                               and plan.window_choice.workers > 1
                               and plan.window_choice.least < plan.window_choice.floor),
    "outer_nesterov": _outer_step,
    "sqrt_scaling": lambda plan: plan.learning_rate_scale > 1.0,
    "head": lambda plan: plan.head_steps > 0,
    "ramp": lambda plan: plan.learning_rate_warmup,
    "warmup_window": lambda plan: plan.warmup_window is not None,
    "local_moment": lambda plan: plan.local_moment is not None,
    "local_momentum": lambda plan: plan.local_momentum is not None,
}


def test_the_recipe_lists_every_step_once_with_a_switch_and_a_reason():
    names = [step.name for step in RECIPE]
    assert names == list(APPLIED) and len(set(names)) == len(names)
    for step in RECIPE:
        assert step.when and step.switch and step.reason and step.decide.__doc__, step.name
        assert "\n" not in step.reason and "%" not in step.reason, step.name  # one line; the figures live in docs


def test_each_step_says_what_it_did_to_the_plan():
    for key, plan in _grid().items():
        assert [o.step for o in plan.recipe] == list(APPLIED), key
        for outcome in plan.recipe:
            assert outcome.applied == bool(APPLIED[outcome.step](plan)), (key, outcome)
            assert outcome.why, (key, outcome)


def _recipe(settings, workers, optimizer="adam", samples=2_000, **kw):
    plan = plan_fit(Settings(**settings), _model("kb", optimizer), workers, BATCH_SIZE, samples, **kw)
    return {o["step"]: (o["applied"], o["why"]) for o in plan.as_dict()["recipe"]}


def test_fit_plan_says_why_a_step_was_skipped():
    assert _recipe({"mode": "synchronous"}, 4, "sgd")["sqrt_scaling"] == (False, "the user's optimizer is SGD")
    assert _recipe({"mode": "synchronous"}, 1)["batch_split"] == (False, "1 worker")
    split = _recipe({"mode": "synchronous", "batch_split": False}, 4)
    assert split["batch_split"] == split["sqrt_scaling"] == (False, "switched off: batch_split=False")
    assert _recipe({"mode": "asynchronous", "frequency": 4}, 8)["window_from_costs"] == (
        False, "switched off: frequency=4")
    assert _recipe({"mode": "synchronous", "optimizer": {"name": "modelaveraging", "config": {
        "sqrt_scaling": False}}}, 4)["sqrt_scaling"] == (False, "switched off: sqrt_scaling=False")
    scaled = _recipe({"mode": "synchronous"}, 4)
    assert scaled["sqrt_scaling"] == (True, next(s.reason for s in RECIPE if s.name == "sqrt_scaling"))
    assert scaled["outer_nesterov"] == (False, "the workers' rate is scaled instead")
    hosted = _recipe({"mode": "synchronous"}, 8, hosted=True)
    assert hosted["head"][0] is False and "runs in the tasks" in hosted["head"][1] and hosted["ramp"][0] is True


def test_the_fit_start_line_lists_the_steps_applied_then_those_skipped_with_why():
    plan = plan_fit(Settings(mode="synchronous"), _model("kb", "sgd"), 4, BATCH_SIZE, 2_000)
    line = plan.describe()
    assert line.endswith(describe_outcomes(plan.recipe))
    assert "recipe (elephant.fit.recipe) applied: batch_split, window_from_costs, outer_nesterov; skipped: " in line
    assert "sqrt_scaling (the user's optimizer is SGD)" in line
    assert describe_outcomes([Outcome("head", False, "1 worker")]).endswith("applied: none; skipped: head (1 worker)")


def _readme_table() -> list[list[str]]:
    """The cells of README.md's table "Accuracy: what the defaults add to your optimizer"."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("### Accuracy: what the defaults add to your optimizer", 1)[1]
    table = section.split("| step | when it applies | turned off by |", 1)[1].split("\n\n", 1)[0]
    return [[cell.strip() for cell in row.strip().strip("|").split(" | ")] for row in table.strip().splitlines()[1:]]


def test_the_readme_table_lists_the_recipes_steps_in_order_with_their_switches():
    rows = _readme_table()
    assert [row[0].split("`")[1] for row in rows] == [step.name for step in RECIPE]
    for row, step in zip(rows, RECIPE):
        assert f"`{step.switch}`" in row[2], (step.name, row[2])
