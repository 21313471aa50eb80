"""Running agent-written code: confined to its directory, with no network, within limits.

:func:`run_sandboxed` starts ``_sandbox_child.py`` in a fresh Python (``-S``: standard library
only; a clean environment with ``PYTHONHASHSEED=0``), in the task directory, and waits for it
under a wall-time limit, killing its whole process group when time is up. The layers, strongest
first, and what each guarantees here (no extra privileges needed):

- **network and PID namespaces** (``unshare -rn --pid --fork --kill-child``, where user
  namespaces are allowed): the child has no network interface at all, so no TCP, UDP or DNS can
  leave it; and it is process 1 of its own PID namespace, so when it ends, or is killed, every
  process it started ends with it, detached ones included. Kernel-enforced.
- **Landlock** (Linux >= 5.13, where enabled): writes, deletions and new files only beneath the
  task directory; with ABI >= 4 no TCP bind or connect; with ABI >= 6 no signals to processes
  outside. Kernel-enforced, inherited by anything the child starts.
- **resource limits** (``setrlimit``): CPU seconds, address space, size of any file written
  (stdout included), open files. Kernel-enforced.
- **wall-time limit**: the parent kills the process group (``SIGKILL``). Without the PID
  namespace, a process that detaches into a new session would escape the kill; the audit hook
  refuses to start processes, but see below.
- **audit hook** (Python level): refuses sockets, writes outside the directory, new processes,
  signals to others and ctypes, with a ``PermissionError`` the agent reads, and reports each
  refusal. It gives clear errors and covers machines without the kernel layers, but it is not a
  security boundary: code that reaches around the interpreter could evade it.

What it does not guarantee: reads are not confined (agent code can read any file the user can,
which is why no secret belongs on a machine that runs agents); without ``unshare``, only
Landlock (TCP only, ABI >= 4) and the audit hook stand between the code and the network, and
only the audit hook between it and a process that outlives the run; and results are
reported from inside the child, so adversarial code could forge its own test results (the
sandbox protects the machine, not the integrity of the score against code written to cheat).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any, Literal

import msgspec
import trio

CHILD = Path(__file__).with_name("_sandbox_child.py")

Mode = Literal["tests", "script"]


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    wall_seconds: float = 10.0
    cpu_seconds: int = 5
    memory_mb: int = 512
    file_mb: int = 4  # the largest file the code may write, its output included
    output_chars: int = 2000  # how much of the output comes back


class TestResult(msgspec.Struct, frozen=True):
    name: str
    ok: bool
    error: str


class Outcome(msgspec.Struct, kw_only=True):
    """What a sandboxed run did. ``status`` is ``ok`` (exited 0), ``failed`` (a non-zero exit),
    ``timeout`` (killed at the wall-time limit) or ``limit`` (killed by a resource limit)."""

    status: str
    detail: str  # one line a person (or an agent) reads
    output: str  # the code's own stdout and stderr, sanitised and cut to output_chars
    tests: list[TestResult] = []
    module_errors: list[str] = []  # test files that did not even import
    blocked: list[str] = []  # escape attempts the audit hook refused
    confinement: dict[str, str] = {}


def real_directory(path: Path) -> None:
    """Make ``path`` a directory, whatever agent code left there (a file, a link)."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    path.mkdir(exist_ok=True)


@cache
def network_namespace() -> bool:
    """Whether ``unshare -rn --pid`` works here (it needs unprivileged user namespaces)."""
    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        done = subprocess.run(
            [exe, "-rn", "--pid", "--fork", "--kill-child", "true"], capture_output=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


_SIGNALS = {
    signal.SIGXCPU: "used more than its CPU time",
    signal.SIGXFSZ: "wrote more than its file size limit",
    signal.SIGKILL: "was killed (out of memory?)",
    signal.SIGSEGV: "crashed (segmentation fault)",
}


async def run_sandboxed(directory: Path, mode: Mode, target: str, limits: Limits) -> Outcome:
    """Run the test files in ``directory/target`` (mode ``tests``) or the script at ``target``
    (mode ``script``), confined to ``directory``. Never raises for anything the code does."""
    directory = Path(directory).resolve()
    nonce = secrets.token_hex(8)
    real_directory(directory / ".tmp")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(directory),
        "TMPDIR": str(directory / ".tmp"),
        "LC_ALL": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONIOENCODING": "utf-8",
        "SANDBOX_NONCE": nonce,
    }
    child_limits = {
        "cpu_seconds": limits.cpu_seconds,
        "memory_mb": limits.memory_mb,
        "file_mb": limits.file_mb,
    }
    argv = [sys.executable, "-S", "-s", "-B", str(CHILD), mode, target, json.dumps(child_limits)]
    if network_namespace():
        argv = ["unshare", "-rn", "--pid", "--fork", "--kill-child", *argv]

    async def kill_group(process: trio.Process) -> None:
        with contextlib.suppress(ProcessLookupError):  # it may have ended already
            os.killpg(process.pid, signal.SIGKILL)

    with tempfile.TemporaryDirectory(prefix="collective-sandbox-") as private:
        out_path = Path(private) / "out"
        with open(out_path, "wb") as out:
            returncode: int | None = None
            with trio.move_on_after(limits.wall_seconds):
                done = await trio.run_process(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=directory,
                    env=env,
                    check=False,
                    start_new_session=True,
                    deliver_cancel=kill_group,
                )
                returncode = done.returncode
        with open(out_path, "rb") as f:
            raw = f.read(64 * limits.output_chars + 65536).decode("utf-8", errors="replace")
    return _outcome(raw, nonce, returncode, directory, limits)


def _outcome(
    raw: str, nonce: str, returncode: int | None, directory: Path, limits: Limits
) -> Outcome:
    tests: list[TestResult] = []
    modules: list[str] = []
    blocked: list[str] = []
    confinement: dict[str, str] = {}
    plain: list[str] = []

    def clean(text: str) -> str:  # paths relative to the task directory, no addresses
        return sanitise(text.replace(f"{directory}{os.sep}", "").replace(str(directory), "."))

    for line in raw.splitlines():
        if not line.startswith(nonce + " "):
            plain.append(line)
            continue
        try:
            item: dict[str, Any] = json.loads(line[len(nonce) + 1 :])
        except json.JSONDecodeError:
            continue  # cut short by a limit mid-line
        kind = item.get("kind")
        if kind == "test":
            tests.append(TestResult(item["name"], bool(item["ok"]), clean(item["error"])))
        elif kind == "module":
            modules.append(clean(f"{item['file']}: {item['error']}"))
        elif kind == "blocked":
            blocked.append(clean(item["what"]))
        elif kind == "ready":
            confinement = dict(item["confinement"])
    if network_namespace():
        confinement["network"] = "no network, own PID namespace (unshare -rn --pid)"
    output = clean("\n".join(plain))
    if len(output) > limits.output_chars:
        output = "..." + output[-limits.output_chars :]
    if returncode is None:
        status, detail = "timeout", f"stopped: ran past the {limits.wall_seconds:g} s time limit"
    elif returncode == 0:
        status, detail = "ok", "exited normally"
    elif returncode < 0 and -returncode in _SIGNALS:
        status, detail = "limit", f"stopped: it {_SIGNALS[signal.Signals(-returncode)]}"
    elif returncode > 128 and returncode - 128 in _SIGNALS:  # as process 1 of its namespace
        status, detail = "limit", f"stopped: it {_SIGNALS[signal.Signals(returncode - 128)]}"
    else:
        status, detail = "failed", f"exited with status {returncode}"
    if returncode == 1 and "MemoryError" in output:
        status, detail = "limit", f"stopped: it needed more than {limits.memory_mb} MB"
    return Outcome(
        status=status,
        detail=detail,
        output=output,
        tests=tests,
        module_errors=modules,
        blocked=list(dict.fromkeys(blocked)),
        confinement=confinement,
    )


_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
_TMP = re.compile(r"/tmp/collective-[\w.-]+")


def sanitise(text: str) -> str:
    """Drop what differs between two runs of the same code: addresses and temporary paths."""
    return _TMP.sub(".", _ADDRESS.sub("0x...", text))
