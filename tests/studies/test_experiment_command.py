"""``collective experiment NAME`` runs ``python -m experiments NAME`` (the library imports
nothing of the experiments package): the names the command offers are the ones the package
runs. (Its errors, one line each from the experiment's process, are rows of
``tests/cli/test_bad_input.py``; the run from an installed copy is
``tests/studies/test_signs_of_life.py``.)"""

from __future__ import annotations

from collective.cli import EXPERIMENTS
from experiments.__main__ import EXPERIMENTS as RUNS


def test_the_command_offers_the_experiments_the_package_runs() -> None:
    assert sorted(EXPERIMENTS) == sorted(RUNS)
