"""Project-wide invariants: no pickle on the wire, no Flask debug, loopback by default."""

import pathlib
import re

import pytest

from elephant.session import ps_host

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "elephant"


def _sources():
    return sorted(PACKAGE.rglob("*.py"))


def test_no_pickle_anywhere_in_the_package():
    offenders = [
        str(p.relative_to(PACKAGE)) for p in _sources()
        if re.search(r"^\s*(import|from)\s+(c?pickle|dill|cloudpickle)\b|pickle\.loads?\(", p.read_text(), re.M)
    ]
    assert offenders == []


def test_no_flask_debug_anywhere_in_the_package():
    offenders = [
        str(p.relative_to(PACKAGE)) for p in _sources()
        if re.search(r"debug\s*=\s*True|use_debugger|\.debug\s*=\s*True", p.read_text())
    ]
    assert offenders == []


def test_nothing_is_decided_from_the_loss_name():
    """Classification or regression is never inferred from a loss's name (a peer bug, design.md §6)."""
    pattern = r"crossentropy|[\"']mse[\"']|mean_squared|\.loss\b.*==|loss\.__name__|get_config\(\)\[.loss"
    offenders = [str(p.relative_to(PACKAGE)) for p in _sources() if re.search(pattern, p.read_text())]
    assert offenders == []


class _Conf:
    def __init__(self, values):
        self.values = values

    def get(self, key, default=None):
        return self.values.get(key, default)


class _SC:
    def __init__(self, master, conf):
        self.master = master
        self._conf = _Conf(conf)

    def getConf(self):
        return self._conf


@pytest.mark.parametrize(
    "master, conf, expected",
    [
        ("local[2]", {"spark.driver.host": "10.1.2.3"}, "127.0.0.1"),
        ("local[*]", {}, "127.0.0.1"),
        ("local-cluster[2,1,1024]", {"spark.driver.host": "127.0.0.1"}, "127.0.0.1"),
        ("spark://master:7077", {"spark.driver.host": "10.1.2.3"}, "10.1.2.3"),
        ("yarn", {"spark.driver.host": "driver.example"}, "driver.example"),
    ],
)
def test_parameter_server_binds_to_the_address_spark_gives_executors(master, conf, expected):
    assert ps_host(_SC(master, conf)) == expected
