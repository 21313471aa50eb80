"""An SGLang server process of this program's own (``sglang:launch:MODEL_DIR``).

The server starts with ``sglang serve --model-path M --host H --port P ARGS`` (the console script
of sglang's python/pyproject.toml; ``python -m sglang.launch_server`` is the older entry point,
used when no ``sglang`` script is on the PATH), on a free loopback port, in a process group of
its own, and is healthy once ``GET /health`` answers 200 (503 while it loads).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path

import httpx

from policy.base import PolicyError

HEALTH_POLL = 0.25  # seconds between /health polls while a server starts


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def sglang_command() -> list[str]:
    """How to start SGLang here: ``sglang serve`` if its script is installed, else the module."""
    exe = shutil.which("sglang") or shutil.which("sglang", path=str(Path(sys.executable).parent))
    if exe:
        return [exe, "serve"]
    if importlib.util.find_spec("sglang") is None:
        raise PolicyError(
            "cannot launch SGLang: it is not installed (pip install 'collective[sglang]', on a "
            "machine with a CUDA GPU), and there is no `sglang` command on the PATH"
        )
    return [sys.executable, "-m", "sglang.launch_server"]


def _stop_group(proc: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """Stop the process group we started (SGLang runs its scheduler and detokenizer as children)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class SGLangServer:
    """An SGLang server process this program started on a free loopback port.

    :meth:`launch` returns once ``/health`` answers 200 (503 means it is still loading);
    :meth:`stop` ends the server's whole process group. Its output goes to :attr:`log`, a
    temporary file kept only when it failed. The process is also stopped when this object is
    collected or the interpreter exits, so a crashed run leaves no server holding a GPU.
    """

    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log
        self._finalizer = weakref.finalize(self, _stop_group, proc, 5.0)

    @classmethod
    def launch(
        cls,
        model: str | Path,
        *,
        args: Sequence[str] = (),
        command: Sequence[str] | None = None,
        timeout: float = 900.0,
        host: str = "127.0.0.1",
    ) -> SGLangServer:
        """Start ``sglang serve --model-path MODEL --host HOST --port PORT ARGS`` and wait until it
        is healthy (at most ``timeout`` seconds: loading a large model takes minutes).
        ``command`` replaces ``sglang serve`` (tests start a stand-in this way)."""
        port = free_port(host)
        argv = [*(command or sglang_command()), "--model-path", str(model)]
        argv += ["--host", host, "--port", str(port), *args]
        fd, log_name = tempfile.mkstemp(prefix="sglang-", suffix=".log")
        with os.fdopen(fd, "wb") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        server = cls(proc, f"http://{host}:{port}", Path(log_name))
        try:
            server.wait_healthy(timeout)
        except BaseException:
            server.stop(keep_log=True)  # the error names the log
            raise
        return server

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        with httpx.Client(timeout=5.0) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise PolicyError(
                        f"SGLang server {self.url} exited with code {code} before it was "
                        f"healthy; the end of its log ({self.log}):\n{self.log_tail()}"
                    )
                try:
                    status = client.get(self.url + "/health").status_code
                except httpx.TransportError as e:
                    last = type(e).__name__
                else:
                    if status == 200:
                        return
                    last = f"HTTP {status}" + (", still starting" if status == 503 else "")
                if time.monotonic() > deadline:
                    raise PolicyError(
                        f"SGLang server {self.url} was not healthy after {timeout:g}s (last: "
                        f"{last}); the end of its log ({self.log}):\n{self.log_tail()}"
                    )
                time.sleep(HEALTH_POLL)

    def stop(self, *, keep_log: bool = False) -> None:
        _stop_group(self.proc)
        self._finalizer.detach()
        if not keep_log:
            self.log.unlink(missing_ok=True)
