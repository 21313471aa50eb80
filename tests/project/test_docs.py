"""The front page and the docs hold together: the README's set-up commands are what CI runs,
every relative link in the README, ``docs/`` and the results READMEs resolves, and the docs
index lists every page of ``docs/``."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import ROOT

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _pages() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "bench" / "results").glob("*/README.md")),
    ]


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line]
    assert len(ci) == 1
    assert ci[0].strip() in first_block, "the README's first commands are what CI runs"


def test_every_relative_link_resolves() -> None:
    broken = [
        f"{page.relative_to(ROOT)} -> {target}"
        for page in _pages()
        for target in LINK.findall(page.read_text())
        if "://" not in target and not (page.parent / target).exists()
    ]
    assert broken == []


def test_the_docs_index_lists_every_page() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert {p for p in pages if f"]({p})" not in index} == set()
