"""The optimizer interface: registry, get(), config, validation helpers, public API."""

from __future__ import annotations

import subprocess
import sys
import types

import numpy as np
import pytest

import elephant.optimizers as eo
from elephant.errors import ConfigError, DataError
from elephant.optimizers import registry as registry_module


@pytest.fixture
def registry(monkeypatch):
    """A private copy of the registry, so test classes do not leak into other tests."""
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))
    monkeypatch.setattr(registry_module, "_ALIASES", dict(registry_module._ALIASES))


# ------------------------------------------------------------------ public API
def test_all_is_explicit_and_complete():
    public = {n for n, v in vars(eo).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    lazy = {"simulate_fit", "FitTrace"}  # need Keras: elephant.fit.simulated, imported on first use
    assert sorted(eo.__all__) == sorted(public | lazy)
    assert len(eo.__all__) == len(set(eo.__all__))


def test_the_lazy_names_resolve_to_the_fit_simulator_and_others_do_not():
    from elephant.fit import simulated

    assert eo.simulate_fit is simulated.simulate_fit and eo.FitTrace is simulated.FitTrace
    with pytest.raises(AttributeError, match="no attribute 'keras_fit_helper'"):
        eo.keras_fit_helper


def test_design_names_are_exported():
    for name in ["Downpour", "AGN", "ADAG", "DynSGD", "EASGD", "AEASGD", "EAMSGD", "ModelAveraging", "DCASGD", "get", "simulate"]:
        assert name in eo.__all__


def test_import_pulls_in_no_spark_flask_or_tensorflow():
    code = (
        "import sys, elephant.optimizers, elephant.optimizers.schedules\n"
        "heavy = [m for m in ('pyspark', 'flask', 'werkzeug', 'requests', 'tensorflow', 'keras') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == ""


# ------------------------------------------------------------------ get()
@pytest.mark.parametrize(
    "name, cls",
    [
        ("downpour", eo.Downpour), ("DOWNPOUR", eo.Downpour), ("agn", eo.AGN), ("adag", eo.ADAG),
        ("dynsgd", eo.DynSGD), ("easgd", eo.EASGD), ("aeasgd", eo.AEASGD), ("eamsgd", eo.EAMSGD),
        ("modelaveraging", eo.ModelAveraging), ("dcasgd", eo.DCASGD),
        ("averaging", eo.ModelAveraging), ("model_averaging", eo.ModelAveraging), ("localsgd", eo.ModelAveraging),
        ("adag_distkeras", eo.AGN),
    ],
)
def test_get_by_name_and_alias(name, cls):
    assert type(eo.get(name)) is cls


def test_adag_is_the_thesis_rule_and_the_distkeras_alias_is_agn():
    assert eo.ADAG_DISTKERAS is eo.AGN
    assert type(eo.get("adag")) is eo.ADAG
    assert eo.serialize(eo.get("adag_distkeras")) == {"name": "agn", "config": eo.AGN().get_config()}


def test_get_with_kwargs_and_dict():
    assert eo.get("dynsgd", window=7).window == 7
    assert eo.get({"name": "dynsgd", "config": {"window": 7}}) == eo.DynSGD(window=7)
    assert eo.get({"name": "dynsgd"}, window=3) == eo.DynSGD(window=3)
    assert eo.deserialize(eo.serialize(eo.ADAG(gamma=0.5))) == eo.ADAG(gamma=0.5)


@pytest.mark.parametrize("identifier", [None, 3, ["downpour"], {"config": {}}, {"name": 5}])
def test_get_rejects_uninterpretable_identifiers(identifier):
    with pytest.raises(ConfigError, match="Could not interpret optimizer identifier"):
        eo.get(identifier)


def test_get_unknown_name_lists_known_names():
    with pytest.raises(ConfigError, match=r"Could not interpret optimizer identifier: 'sgd'.*'downpour'"):
        eo.get("sgd")


def test_get_dict_with_unexpected_keys():
    with pytest.raises(ConfigError, match=r"unexpected keys \['window'\]"):
        eo.get({"name": "downpour", "window": 3})


def test_get_instance_with_kwargs():
    with pytest.raises(ConfigError, match="cannot be combined with an optimizer instance"):
        eo.get(eo.Downpour(), window=3)


def test_get_unknown_argument():
    with pytest.raises(ConfigError, match=r"invalid arguments for optimizer 'downpour'.*'gamma'"):
        eo.get("downpour", gamma=1.0)


# ------------------------------------------------------------------ register()
def test_register_requires_a_name(registry):
    class Nameless(eo.DistributedOptimizer):
        pass

    with pytest.raises(ConfigError, match="Nameless must set a non-empty `name`"):
        eo.register(Nameless)


def test_register_rejects_unknown_and_empty_modes(registry):
    class Odd(eo.DistributedOptimizer):
        name = "odd"
        modes = ("softsync",)

    with pytest.raises(ConfigError, match="Odd.modes holds unknown mode 'softsync'"):
        eo.register(Odd)
    Odd.modes = ()
    with pytest.raises(ConfigError, match="Odd.modes is empty"):
        eo.register(Odd)


def test_register_refuses_to_shadow_another_class(registry):
    class Impostor(eo.DistributedOptimizer):
        name = "Downpour"

    with pytest.raises(ConfigError, match="cannot register .*Impostor as 'downpour'.*Downpour"):
        eo.register(Impostor)

    class AliasThief(eo.DistributedOptimizer):
        name = "thief"
        aliases = ("averaging",)

    with pytest.raises(ConfigError, match="cannot register .*AliasThief as 'averaging'.*ModelAveraging"):
        eo.register(AliasThief)
    assert type(eo.get("averaging")) is eo.ModelAveraging
    assert "thief" not in eo.registered_names()


def test_register_a_new_rule_and_redefine_it(registry):
    def define():
        class Halved(eo.DistributedOptimizer):
            name = "halved"
            aliases = ("half",)

            def apply(self, state, center, clock, worker, commit):
                return eo.tree_map(lambda c, d: c + d / 2, center, commit.tensors), None, state

        return eo.register(Halved)

    first = define()
    second = define()  # the same class re-created (a re-run notebook cell) takes its name back
    assert first is not second and type(eo.get("half")) is second
    assert "halved" in eo.registered_names() and "half" not in eo.registered_names()
    assert "half" in eo.registered_names(aliases=True)


# ------------------------------------------------------------------ construction checks
@pytest.mark.parametrize("window", [0, -1, 2.5, True, "5"])
def test_window_must_be_a_positive_int(window):
    with pytest.raises(ConfigError, match=r"`window` must be a positive int; received window="):
        eo.Downpour(window=window)


@pytest.mark.parametrize("bound", [-1, 1.5, False])
def test_staleness_bound_must_be_none_or_a_non_negative_int(bound):
    with pytest.raises(ConfigError, match=r"`staleness_bound` must be None or an int >= 0; received staleness_bound="):
        eo.DynSGD(staleness_bound=bound)


@pytest.mark.parametrize("cls", [eo.ModelAveraging, eo.EASGD])
def test_staleness_bound_is_refused_by_synchronous_only_rules(cls):
    with pytest.raises(ConfigError, match=rf"applies to asynchronous modes only and {cls.__name__}.*staleness_bound=2"):
        cls(staleness_bound=2)


def test_equality_and_hash_follow_the_config():
    assert eo.DynSGD(window=3) == eo.DynSGD(window=3) != eo.DynSGD(window=4)
    assert eo.Downpour(window=5) != eo.DynSGD(window=5)
    assert len({eo.DynSGD(window=3), eo.DynSGD(window=3), eo.AGN()}) == 2


@pytest.mark.parametrize(
    "kwargs, value, message",
    [
        ({}, "x", r"`lr` must be a finite real number; received lr='x'"),
        ({}, float("nan"), r"`lr` must be a finite real number; received lr=nan"),
        ({}, True, r"`lr` must be a finite real number; received lr=True"),
        ({"low": 0.0, "low_open": True}, 0.0, r"`lr` must be a real number in \(0, inf\); received lr=0.0"),
        ({"low": 0.0, "high": 1.0, "high_open": True}, 1.0, r"`lr` must be a real number in \[0, 1\); received lr=1.0"),
        ({"high": 2.0}, 3, r"`lr` must be a real number in \(-inf, 2\]; received lr=3"),
    ],
)
def test_check_number_messages(kwargs, value, message):
    with pytest.raises(ConfigError, match=message):
        eo.check_number("lr", value, **kwargs)


def test_check_number_accepts_numpy_scalars():
    assert eo.check_number("lr", np.float32(0.5), low=0.0) == 0.5
    assert isinstance(eo.check_number("lr", np.int64(2)), float)


# ------------------------------------------------------------------ helpers
def test_tree_map_keeps_the_dtype_of_the_first_list():
    out = eo.tree_map(lambda a, b: a + 0.1 * b, [np.ones(2, np.float32), np.ones((), np.float64)], [np.ones(2), np.ones(())])
    assert [a.dtype for a in out] == [np.float32, np.float64]
    np.testing.assert_allclose(out[0], 1.1, rtol=1e-6)


def test_tree_map_requires_equal_lengths():
    with pytest.raises(ValueError):
        eo.tree_map(lambda a, b: a + b, [np.ones(1)], [np.ones(1), np.ones(1)])


def test_staleness():
    commit = eo.Commit([np.zeros(1)], num_steps=1, num_samples=1, base_clock=3)
    assert eo.staleness(3, commit) == 0
    assert eo.staleness(7, commit) == 4
    with pytest.raises(DataError, match="commit base_clock=3 is ahead of the server clock 2"):
        eo.staleness(2, commit)


def test_base_class_has_no_server_rules():
    class Bare(eo.DistributedOptimizer):
        name = "bare"

    with pytest.raises(NotImplementedError, match="Bare has no asynchronous server rule"):
        Bare().apply(None, [], 0, 0, None)
    with pytest.raises(NotImplementedError, match="Bare has no synchronous server rule"):
        Bare().apply_round(None, [], 0, {})


def test_every_module_of_the_package_is_imported_so_new_rules_register_themselves():
    import pkgutil
    import sys

    import elephant.optimizers as package

    modules = {info.name for info in pkgutil.iter_modules(package.__path__) if not info.name.startswith("_")}
    assert {"downpour", "dcasgd", "simulate"} <= modules
    assert all(f"elephant.optimizers.{name}" in sys.modules for name in modules)


def test_the_package_table_states_each_rules_modes_and_window():
    """The table in elephant.optimizers' docstring is read back and compared with the rules themselves."""
    rows = [line.split() for line in eo.__doc__.splitlines()]
    table = {cells[1].strip('`"'): (" ".join(cells[2:-1]), cells[-1])
             for cells in rows if len(cells) >= 4 and cells[1].startswith('``"')}
    assert set(table) == set(eo.registered_names())
    for name, (modes, window) in table.items():
        rule = eo.get(name)
        assert modes == ", ".join(rule.modes), name
        assert window == ("pass" if rule.window is None else str(rule.window)), name
