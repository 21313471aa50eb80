"""The suite survives a test that times out inside ``trio.run``
(see ``tests/support/trio_timeouts.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import SUPPORT

SCRATCH = """
import trio, pytest

@pytest.mark.timeout(1)
def test_hangs_inside_trio():
    trio.run(trio.sleep, 30)

def test_after_it():
    trio.run(trio.sleep, 0)
"""


# A run that times out while a thread it abandoned keeps calling back into it (as the Ray
# rollouts' streams do), and a test after it during which the thread calls back.
ABANDONED_THREAD = """
import time, trio, pytest

called_back = []

def pump():
    try:
        for _ in range(400):
            trio.from_thread.run_sync(lambda: None)
            called_back.append(1)
            time.sleep(0.05)
    except trio.RunFinishedError:
        called_back.append("told")

@pytest.mark.timeout(1)
def test_hangs_inside_trio_beside_a_thread():
    async def main():
        await trio.to_thread.run_sync(pump, abandon_on_cancel=True)
    trio.run(main)

def test_after_it():
    # (A call the run queued but never ran leaves the thread waiting for good: a daemon, it
    # harms nothing; usually the thread calls back after the close and is told.)
    deadline = time.monotonic() + 10
    while "told" not in called_back and time.monotonic() < deadline:
        time.sleep(0.05)
"""


def _pytest(
    tmp_path: Path, *plugins: str, scratch: str = SCRATCH
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_scratch.py").write_text(scratch)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the project's options
    args = [a for p in plugins for a in ("-p", p)]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "-rA"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(SUPPORT)},
    )


def test_a_timeout_inside_trio_does_not_break_the_next_test(tmp_path: Path) -> None:
    bare = _pytest(tmp_path)
    assert "FAILED test_scratch.py::test_after_it" in bare.stdout, "the problem is real"
    assert "run() from inside a run()" in bare.stdout
    fixed = _pytest(tmp_path, "trio_timeouts")
    assert "PASSED test_scratch.py::test_after_it" in fixed.stdout, fixed.stdout[-2000:]
    assert "FAILED test_scratch.py::test_hangs_inside_trio" in fixed.stdout
    assert "Unraisable" not in fixed.stdout + fixed.stderr


def test_a_thread_a_timed_out_run_abandoned_is_told_the_run_finished(tmp_path: Path) -> None:
    """Without the plugin's mark, the thread's next call back wrote to the closed run's wakeup
    socket: trio printed ``OSError: [Errno 9] Bad file descriptor`` from the thread."""
    fixed = _pytest(tmp_path, "trio_timeouts", scratch=ABANDONED_THREAD)
    out = fixed.stdout + fixed.stderr
    assert "PASSED test_scratch.py::test_after_it" in fixed.stdout, out[-3000:]
    assert "Bad file descriptor" not in out, out[-3000:]
    assert "Exception while delivering" not in out, out[-3000:]
