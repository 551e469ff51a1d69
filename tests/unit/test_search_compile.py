"""The hp space compiled to Optuna's define-by-run suggestions, and samplers and pruners by name."""

from __future__ import annotations

import importlib.util
import math

import optuna
import pytest
from hyperopt import hp
from hyperopt.pyll import scope
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from elephant.errors import ConfigError
from elephant.search.compile import CallableSpace, compile_space
from elephant.search.engine import resolve_sampler
from elephant.search.study import HyperoptAlgo, artifacts_for, get_pruner, get_sampler, get_storage


def _distributions(space):
    return {p.label: p.distribution() for p in compile_space(space).params}


@pytest.mark.parametrize(
    "expression, distribution",
    [
        (hp.uniform("v", -1, 2), FloatDistribution(-1.0, 2.0)),
        (hp.loguniform("v", -4, -1), FloatDistribution(math.exp(-4), math.exp(-1), log=True)),
        (hp.quniform("v", 1, 10, 2), FloatDistribution(2.0, 10.0, step=2.0)),  # hyperopt's grid: multiples of q
        (hp.quniform("v", 0.05, 1.0, 0.25), FloatDistribution(0.25, 1.0, step=0.25)),
        (hp.uniformint("v", 1, 5), FloatDistribution(1.0, 5.0, step=1.0)),
        (hp.randint("v", 4), IntDistribution(0, 3)),
        (hp.randint("v", 2, 6), IntDistribution(2, 5)),
        (hp.choice("v", ["a", "b", "c"]), CategoricalDistribution([0, 1, 2])),
        (hp.pchoice("v", [(0.2, "a"), (0.8, "b")]), CategoricalDistribution([0, 1])),
    ],
)
def test_each_hp_kind_maps_to_its_optuna_distribution(expression, distribution):
    assert _distributions({"v": expression})["v"] == distribution


def test_values_are_hyperopt_values_and_the_point_is_space_eval():
    space = {"lr": hp.loguniform("lr", -5, -1), "units": scope.int(hp.quniform("units", 8, 64, 8)),
             "act": hp.choice("act", ["relu", "tanh"]), "tag": "fixed"}
    compiled = compile_space(space)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(10):
        trial = study.ask()
        values = compiled(trial)
        assert values == trial.params
        point = compiled.point(values)
        assert point["act"] == ["relu", "tanh"][values["act"]] and point["tag"] == "fixed"
        assert isinstance(point["units"], int) and point["units"] % 8 == 0 and 8 <= point["units"] <= 64
        assert math.exp(-5) <= point["lr"] <= math.exp(-1)


def test_conditional_branches_suggest_only_the_chosen_branch():
    space = {"model": hp.choice("model", [
        {"kind": "mlp", "units": hp.choice("units", [16, 32]), "dropout": hp.uniform("dropout", 0.0, 0.5)},
        {"kind": "linear", "l2": hp.loguniform("l2", -8, -2)},
    ])}
    compiled = compile_space(space)
    assert compiled.conditional
    assert compiled.describe() == ["model: choice(2)", "dropout: uniform(0.0, 0.5) if model=0",
                                   "units: choice(2) if model=0", "l2: loguniform(-8.0, -2.0) if model=1"]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(12):
        trial = study.ask()
        values = compiled(trial)
        point = compiled.point(values)["model"]
        seen.add(point["kind"])
        if values["model"] == 0:
            assert set(values) == {"model", "units", "dropout"} and point["units"] in (16, 32)
        else:
            assert set(values) == {"model", "l2"} and set(point) == {"kind", "l2"}
    assert seen == {"mlp", "linear"}


def test_a_label_shared_by_two_branches_is_active_in_both():
    space = hp.choice("b", [{"lr": hp.uniform("lr", 0, 1)}, {"lr": hp.uniform("lr", 0, 1), "m": 1}])
    choice, lr = compile_space(space).params
    assert choice.kind == "choice" and lr.when == ((("b", 0),), (("b", 1),))
    assert lr.active({"b": 1}) and not lr.active({})


@pytest.mark.parametrize(
    "space, match",
    [
        ({"w": hp.normal("w", 0, 1)}, r"label 'w': hp.normal\('w', 0, 1\) has no Optuna equivalent: its range is "
                                      "unbounded"),
        ({"w": hp.lognormal("w", 0, 1)}, r"label 'w': hp.lognormal\('w', 0, 1\) has no Optuna equivalent"),
        ({"w": hp.qnormal("w", 0, 1, 1)}, r"hp.qnormal\('w', 0, 1, 1\) has no Optuna equivalent"),
        ({"w": hp.qloguniform("w", 0, 3, 1)}, r"label 'w': hp.qloguniform\('w', 0, 3, 1\) has no Optuna "
                                              "equivalent: Optuna has no stepped log scale"),
        ({"w": hp.uniform("w", 0, hp.uniform("top", 1, 2))}, "hp.uniform for label 'w' takes an argument from another"),
        ({"w": hp.quniform("w", 1, 1.5, 2)}, r"label 'w': hp.quniform\('w', 1, 1.5, 2\) holds no multiple of q=2"),
        ({"a": hp.uniform("w", 0, 1), "b": hp.uniform("w", 0, 2)}, "label 'w' is used twice with different"),
    ],
)
def test_what_has_no_exact_optuna_equivalent_is_refused(space, match):
    with pytest.raises(ConfigError, match=match):
        compile_space(space)


def test_a_callable_space_is_native_define_by_run():
    def space(trial):
        return {"units": trial.suggest_int("units", 4, 8)}

    compiled = compile_space(space)
    assert isinstance(compiled, CallableSpace) and compiled.conditional
    trial = optuna.create_study().ask()
    assert 4 <= compiled(trial)["units"] <= 8
    with pytest.raises(ConfigError, match="a callable `space` must return a dict of parameters; .* returned int"):
        compile_space(lambda trial: 3)(trial)


def test_fingerprint_changes_with_the_space():
    a = compile_space({"x": hp.uniform("x", 0, 1)}).fingerprint()
    assert a == compile_space({"x": hp.uniform("x", 0, 1), "c": 3}).fingerprint()  # constants are not searched
    assert a != compile_space({"x": hp.uniform("x", 0, 2)}).fingerprint()


def test_hyperopt_points_snap_into_the_optuna_distribution():
    compiled = compile_space({"q": hp.quniform("q", 1, 9, 2), "c": hp.choice("c", [1, 2])})
    assert compiled.snap({"q": [0.0], "c": [1]}) == {"q": 2.0, "c": 1}  # hyperopt may round below the range
    assert compiled.hyperopt_vals({"q": 4.0}) == {"q": [4.0], "c": []}


# ------------------------------------------------------------ names
@pytest.mark.parametrize(
    "name, cls",
    [("tpe", optuna.samplers.TPESampler), ("random", optuna.samplers.RandomSampler),
     ("qmc", optuna.samplers.QMCSampler), ("nsga2", optuna.samplers.NSGAIISampler),
     ("gp", optuna.samplers.GPSampler)],
)
def test_sampler_names(name, cls):
    if name == "gp" and importlib.util.find_spec("torch") is None:  # Optuna's GPSampler runs on torch
        with pytest.raises(ConfigError, match=r"sampler='gp' needs the 'torch' package"):
            get_sampler(name, seed=0)
        return
    assert type(get_sampler(name, seed=0)) is cls


def test_sampler_objects_and_hyperopt_algorithms():
    import hyperopt

    sampler = optuna.samplers.RandomSampler()
    assert get_sampler(sampler) is sampler
    assert get_sampler("hyperopt-anneal") == HyperoptAlgo("hyperopt-anneal", hyperopt.anneal.suggest)
    assert resolve_sampler("tpe", "rand") == HyperoptAlgo("hyperopt-rand", hyperopt.rand.suggest)
    assert resolve_sampler(algo=hyperopt.tpe.suggest).suggest is hyperopt.tpe.suggest
    assert get_sampler("tpe", conditional=True)._group


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"sampler": "bayes"}, r"Could not interpret sampler identifier: 'bayes'; `sampler` must be one of \['tpe', "
                               r"'random', 'qmc', 'cmaes', 'gp', 'nsga2', 'hyperopt-tpe', 'hyperopt-rand', "
                               r"'hyperopt-anneal'\]"),
        ({"sampler": 3}, "Could not interpret sampler identifier: 3"),
        ({"algo": "bayes"}, r"`algo` must be one of \['tpe', 'rand', 'anneal'\] or a hyperopt suggest function; "
                            "received algo='bayes'"),
        ({"sampler": "random", "algo": "tpe"}, "pass either `sampler` or hyperopt's `algo`, not both; received "
                                               "sampler='random' and algo='tpe'"),
    ],
)
def test_sampler_errors_list_the_valid_names(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        resolve_sampler(**kwargs)


def test_cmaes_without_its_package_says_what_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cmaes" else real(name, *a))
    with pytest.raises(ConfigError, match="sampler='cmaes' needs the 'cmaes' package: pip install cmaes"):
        get_sampler("cmaes")


def test_pruner_names():
    asha = get_pruner("asha")
    assert type(asha) is optuna.pruners.SuccessiveHalvingPruner
    assert (asha._min_resource, asha._reduction_factor, asha._min_early_stopping_rate) == (1, 3, 0)
    hyperband = get_pruner("hyperband", max_epochs=27)
    assert type(hyperband) is optuna.pruners.HyperbandPruner and hyperband._max_resource == 27
    assert type(get_pruner("median")) is optuna.pruners.MedianPruner
    assert type(get_pruner(None)) is optuna.pruners.NopPruner
    assert get_pruner({"name": "asha", "reduction_factor": 2})._reduction_factor == 2
    percentile = optuna.pruners.PercentilePruner(25.0)
    assert get_pruner(percentile) is percentile


@pytest.mark.parametrize(
    "pruner, match",
    [
        ("sha", r"Could not interpret pruner identifier: 'sha'; `pruner` must be one of \['asha', 'hyperband', "
                r"'median', None\]"),
        ({"name": "asha", "eta": 3}, "invalid arguments for pruner 'asha': .*eta"),
        ({"name": "asha", "reduction_factor": 1}, "invalid arguments for pruner 'asha'"),
    ],
)
def test_pruner_errors(pruner, match):
    with pytest.raises(ConfigError, match=match):
        get_pruner(pruner)


def test_storage_and_artifacts_by_name(tmp_path):
    from optuna.storages.journal import JournalStorage

    assert isinstance(get_storage(str(tmp_path / "s.journal")), JournalStorage)
    assert isinstance(get_storage(None), optuna.storages.InMemoryStorage)
    assert isinstance(get_storage(f"sqlite:///{tmp_path / 's.db'}"), optuna.storages.RDBStorage)
    with pytest.raises(ConfigError, match=r"`storage` must be None, a journal file path .*received storage=3"):
        get_storage(3)
    assert artifacts_for("runs/sweep.journal") == "runs/sweep-trials"
    assert artifacts_for("sqlite:///runs/s.db") == "runs/s-trials"
    assert artifacts_for(None) is None and artifacts_for(None, "keep") == "keep"
