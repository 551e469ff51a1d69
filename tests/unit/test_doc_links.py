"""Every relative Markdown link of the README, docs/*.md and benchmarks/README.md points to a file that exists
(and, for a link into a Markdown file with a ``#fragment``, to one of its headings). No Spark, no network."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").glob("*.md")])

#: ``[text](target)`` and ``![alt](target)``, the target up to the first space or closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*```")


def links(page: pathlib.Path) -> list[str]:
    """The link targets of a page, outside fenced code blocks and inline code."""
    found, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            found += LINK.findall(re.sub(r"`[^`]*`", "", line))
    return found


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
    return {anchor(re.sub(r"^#+", "", line)) for line in page.read_text(encoding="utf-8").splitlines()
            if line.startswith("#")}


def relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")


CASES = [(page, target) for page in PAGES for target in links(page) if relative(target)]


@pytest.mark.parametrize("page, target", CASES,
                         ids=[f"{page.relative_to(ROOT)}->{target}" for page, target in CASES])
def test_a_relative_link_points_to_an_existing_file(page, target):
    path, _, fragment = target.partition("#")
    resolved = (page.parent / path).resolve()
    assert resolved.exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"
    if fragment and resolved.suffix == ".md":
        assert fragment in anchors(resolved), f"{page.relative_to(ROOT)} links to {target}: no such heading"


def test_the_pages_have_links():
    assert len(CASES) > 20  # the regular expression still finds the pages' links


@pytest.mark.parametrize("heading, expected", [
    ("## End to end (benchmarks/end_to_end.py)", "end-to-end-benchmarksend_to_endpy"),
    ("### Commits in flight (`SparkModel(overlap=True)`)", "commits-in-flight-sparkmodeloverlaptrue"),
    ("## Spark logging", "spark-logging"),
])
def test_an_anchor_is_githubs(heading, expected):
    assert anchor(heading.lstrip("#")) == expected
