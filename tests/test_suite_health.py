"""The suite survives a test that times out inside ``trio.run`` (see ``trio_timeouts.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent

SCRATCH = """
import trio, pytest

@pytest.mark.timeout(1)
def test_hangs_inside_trio():
    trio.run(trio.sleep, 30)

def test_after_it():
    trio.run(trio.sleep, 0)
"""


def _pytest(tmp_path: Path, *plugins: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_scratch.py").write_text(SCRATCH)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the project's options
    args = [a for p in plugins for a in ("-p", p)]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "-rA"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(HERE)},
    )


def test_a_timeout_inside_trio_does_not_break_the_next_test(tmp_path: Path) -> None:
    bare = _pytest(tmp_path)
    assert "FAILED test_scratch.py::test_after_it" in bare.stdout, "the problem is real"
    assert "run() from inside a run()" in bare.stdout
    fixed = _pytest(tmp_path, "trio_timeouts")
    assert "PASSED test_scratch.py::test_after_it" in fixed.stdout, fixed.stdout[-2000:]
    assert "FAILED test_scratch.py::test_hangs_inside_trio" in fixed.stdout
    assert "Unraisable" not in fixed.stdout + fixed.stderr
