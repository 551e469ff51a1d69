"""Helpers shared by the unit tests."""

from __future__ import annotations


def tiny_model():
    """A seeded 3 -> 2 Dense model compiled with SGD(0.05) and MSE (fits ``linear_data``)."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


class RecordingBuilder:
    """Stands for ``SparkSession.builder``: records what a session would be made with, makes none."""

    def __init__(self):
        self.settings = {}

    def master(self, value):
        self.settings["master"] = value
        return self

    def appName(self, value):
        self.settings["app"] = value
        return self

    def config(self, key, value):
        self.settings[key] = value
        return self

    def getOrCreate(self):
        return self


def convergence_sections() -> set[str]:
    """The section titles of docs/convergence.md, as a warning names them (without their Markdown backticks)."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "convergence.md").read_text(encoding="utf-8")
    return {re.sub(r"^#+\s*", "", line).replace("`", "").strip() for line in text.splitlines() if line.startswith("#")}


def check_points_to_the_figures(message: str) -> str:
    """Check that a fit-start warning gives no figure of its own and ends by pointing to the section of
    docs/convergence.md that holds them; returns that section's title."""
    import re

    assert re.search(r"\d+(\.\d+)? ?(points?|%)", message) is None, f"a figure in the warning: {message!r}"
    assert "measured" not in message and "benchmarks/" not in message, message
    found = re.search(r'\(see docs/convergence\.md, "([^"]+)"\)\.$', message)
    assert found, f"the warning does not end with its docs section: {message!r}"
    assert found.group(1) in convergence_sections(), f"no section {found.group(1)!r} in docs/convergence.md"
    return found.group(1)
