"""Both Spark sides of a fit implement every member of :class:`elephant.fit.runner.SparkSide`."""

import ast
import inspect
import textwrap
import typing

import pytest

from elephant.fit.classic import ClassicRun
from elephant.fit.connect import HostedRun
from elephant.fit.runner import SparkSide


def _assigned_in_init(cls) -> set[str]:
    """The ``self.<name>`` attributes ``cls.__init__`` assigns."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    names = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        for target in targets:
            for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(element, ast.Attribute) and isinstance(element.value, ast.Name) \
                        and element.value.id == "self":
                    names.add(element.attr)
    return names


METHODS = sorted(name for name, value in vars(SparkSide).items() if callable(value) and not name.startswith("_"))
ATTRIBUTES = sorted(typing.get_type_hints(SparkSide))


def test_the_interface_names_what_the_fit_loop_uses():
    assert METHODS == ["barrier", "cancel", "check_devices", "check_slots", "close", "guard", "head_rows", "job",
                       "one_job", "open"]
    assert ATTRIBUTES == ["devices", "hosted", "num_workers", "partition_samples", "row_bytes", "samples", "val"]


@pytest.mark.parametrize("side", [ClassicRun, HostedRun])
def test_each_spark_side_has_every_method_with_the_interfaces_parameters(side):
    for name in METHODS:
        wanted = list(inspect.signature(getattr(SparkSide, name)).parameters)
        assert list(inspect.signature(getattr(side, name)).parameters) == wanted, (side.__name__, name)


@pytest.mark.parametrize("side", [ClassicRun, HostedRun])
def test_each_spark_side_sets_every_attribute(side):
    missing = [name for name in ATTRIBUTES if not hasattr(side, name) and name not in _assigned_in_init(side)]
    assert missing == [], f"{side.__name__} never sets {missing}"


def test_the_check_fails_a_side_that_lacks_a_member():
    class Partial:
        def __init__(self):
            self.num_workers, self.samples = 2, 10

    assert sorted(set(ATTRIBUTES) - _assigned_in_init(Partial)) == ["devices", "hosted", "partition_samples",
                                                                    "row_bytes", "val"]
