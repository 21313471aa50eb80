"""The suite's health: it survives a test that times out inside ``trio.run`` (see
``tests/support/trio_timeouts.py``), every subprocess deadline scales with the load, and a test
that memory ended says so (``tests/support/busy.py``)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT, SUPPORT
from tests.support.busy import memory_note, scaled

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
        timeout=scaled(120),
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


def _unscaled_subprocess_timeouts() -> list[str]:
    """Every subprocess deadline in the suite that does not go through ``busy.scaled``: a
    ``timeout`` given to ``subprocess.*``, ``.communicate`` or a process's ``.wait`` whose
    expression calls no ``scaled``. (A fixed ``timeout=120`` that the load scaling did not
    reach failed a benchmark's smoke test at a load of 15 on two cores.)"""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = ast.unparse(node.func)
            process_wait = f.endswith(".wait") and f.removesuffix(".wait").endswith("proc")
            if not (f.startswith("subprocess.") or f.endswith(".communicate") or process_wait):
                continue
            given = [kw.value for kw in node.keywords if kw.arg == "timeout"]
            if process_wait:
                given += node.args[:1]
            for value in given:
                calls = [n for n in ast.walk(value) if isinstance(n, ast.Call)]
                if not any(ast.unparse(c.func) == "scaled" for c in calls):
                    where = path.relative_to(ROOT)
                    found.append(f"{where}:{node.lineno}: {f}(timeout={ast.unparse(value)})")
    return found


def test_every_subprocess_deadline_scales_with_the_load() -> None:
    assert _unscaled_subprocess_timeouts() == []


MEMORY_KILL = """
def test_killed_by_memory():
    raise RuntimeError(
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory"
    )

def test_a_plain_failure():
    assert 1 == 2
"""


def test_a_test_killed_by_memory_says_so_in_its_failure(tmp_path: Path) -> None:
    done = _pytest(tmp_path, "busy", scratch=MEMORY_KILL)
    out = done.stdout
    assert "2 failed" in out, out[-3000:]
    assert "killed by memory? the failure says 'OutOfMemoryError'" in out, out[-3000:]
    assert " GiB available now" in out
    # the plain failure is left as it is (but on a machine with under a tenth of it free)
    assert out.count("killed by memory?") == (1 if memory_note("") is None else 2), out[-3000:]
