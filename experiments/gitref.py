"""The engine as it is at a git ref, to run beside this one: what ``bench/golden.py
--against``, ``bench/engine.py --against`` and ``bench/sampler_cost.py`` compare with.

:func:`engine_at` extracts ``collective/``, ``policy/`` and ``worlds/`` at the ref (``git
archive``: the committed files, nothing of a working tree) into a folder; :func:`python_env` is
the environment in which a ``python`` subprocess imports that folder's engine ahead of the
installed one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

#: What "the engine" is: the three packages an episode's bytes depend on.
PACKAGES = ("collective", "policy", "worlds")


def engine_at(ref: str, into: Path, repo: Path) -> Path:
    """``PACKAGES`` as they are at git ``ref`` of the repository ``repo``, extracted into
    ``into`` (made, with its parents); returns ``into``."""
    archive = subprocess.run(
        ["git", "archive", ref, *PACKAGES], cwd=repo, check=True, capture_output=True
    ).stdout
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def python_env(tree: Path) -> dict[str, str]:
    """This process's environment with ``tree`` heading ``PYTHONPATH``: a ``python`` started
    with it imports the engine in ``tree`` (from :func:`engine_at`, or a checkout)."""
    return {**os.environ, "PYTHONPATH": str(tree)}
