"""The project's metadata reads without a setuptools deprecation: ``scripts/setup`` printed
screens of them while ``project.license`` was a table (issue 31)."""

from __future__ import annotations

import tomllib
import warnings

from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution

from tests.support import ROOT

PYPROJECT = ROOT / "pyproject.toml"


def test_pyproject_applies_without_warnings() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), PYPROJECT)
    assert [str(w.message) for w in caught] == []
    assert dist.metadata.license_expression == "MIT"


def test_the_wheel_ships_the_experiments_beside_the_library() -> None:
    """``collective experiment`` runs ``python -m experiments`` from an installed copy, so the
    wheel holds that package as it holds the three it stands on (bench/ and tests/ stay out)."""
    dist = apply_configuration(Distribution(), PYPROJECT)
    top = sorted(p for p in dist.packages if "." not in p)
    assert top == ["collective", "experiments", "policy", "worlds"]


def test_the_build_asks_for_a_setuptools_that_reads_an_spdx_license() -> None:
    # a license string is an SPDX expression only from setuptools 77 on
    requires = tomllib.loads(PYPROJECT.read_text())["build-system"]["requires"]
    assert requires == ["setuptools>=77"]
