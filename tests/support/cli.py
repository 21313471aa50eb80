"""The command line in a subprocess: as at a terminal (``CLI_AT_A_TERMINAL``; stderr on a
pseudo-terminal, ``on_a_terminal``), and ``ctrl_c_everywhere.py`` (Ctrl-C at every line)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time

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


def on_a_terminal(*args: str, timeout: float = 120) -> tuple[int, str, str]:
    """``collective ARGS`` with its stderr on a pseudo-terminal of 120 columns (where a command
    draws its progress) and its stdout on a pipe: (exit code, stdout, what the terminal got)."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "collective.cli", *args],
        stdout=subprocess.PIPE,
        stderr=child,
        stdin=subprocess.DEVNULL,
    )
    os.close(child)
    seen = b""
    deadline = time.monotonic() + scaled(timeout)
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # the last writer is gone
                    break
                if not chunk:
                    break
                seen += chunk
            elif proc.poll() is not None:
                break
        assert proc.stdout is not None
        out = proc.stdout.read().decode()
        code = proc.wait(timeout=scaled(timeout))
    finally:
        os.close(main)
        if proc.poll() is None:
            proc.kill()
    return code, out, seen.decode(errors="replace")
