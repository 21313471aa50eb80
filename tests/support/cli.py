"""The command line in a subprocess: as at a terminal (``CLI_AT_A_TERMINAL``), and
``ctrl_c_everywhere.py`` (Ctrl-C at every line)."""

from __future__ import annotations

import subprocess
import sys

from tests.support import SUPPORT
from tests.support.busy import scaled

# ``collective.cli`` as at a terminal, where Ctrl-C raises KeyboardInterrupt: a suite started in
# the background inherits SIGINT ignored, and Python then installs no handler. The child sets the
# handler itself (a ``preexec_fn`` would run Python between fork and exec, which CPython calls
# unsafe in a process with threads, as a Ray driver is).
CLI_AT_A_TERMINAL = [
    sys.executable,
    "-c",
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('collective.cli', run_name='__main__', alter_sys=True)",
]


def ctrl_c_everywhere(*args: str, timeout: float) -> str:
    """``tests/support/ctrl_c_everywhere.py ARGS`` in a subprocess (where a hang is a timeout):
    its report, once it says every interrupted run passed."""
    done = subprocess.run(
        [sys.executable, str(SUPPORT / "ctrl_c_everywhere.py"), *args],
        capture_output=True,
        text=True,
        timeout=scaled(timeout),
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout
