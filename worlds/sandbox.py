"""Running agent-written code: confined by the kernel, judged outside it.

:func:`run_calls` and :func:`run_script` start ``_sandbox_child.py`` in a fresh Python
(``-S``: standard library only; an environment of six variables, none of the engine's), in
the task directory, and wait for it under a wall-time limit, killing its whole process group
when time is up. Nothing the child reports is a verdict: :func:`run_calls` sends it calls
(module, function, arguments) and reads back what each returned or raised; whoever holds the
expected values (:mod:`worlds.repo_checks`) compares. What agent code could write in the
child's place is no more than what its functions could return, and anything out of protocol
(:attr:`Outcome.tampered`) fails every call.

The layers, each enforced by the kernel, and what each guarantees:

- **namespaces** (``unshare``: user, network, PID, mount with its own ``/proc``, IPC, UTS),
  where unprivileged user namespaces are allowed: no network interface at all; the child is
  process 1 of its own PID namespace, so every process it started ends with it; no other
  process is visible, and the engine's environment cannot be read from ``/proc``.
- **seccomp** (x86-64): no sockets of any family, no new processes (threads are allowed), no
  program executed, no signals to other processes, no ptrace, no new namespaces or mounts, no
  io_uring.
- **Landlock** (Linux >= 5.13): reads only of the task directory and the Python installation
  (``/usr`` and ``/lib`` included: no home directories, no ``/proc``, no ``/etc``); writes only
  beneath the task directory; no TCP (ABI >= 4); no signals to, and no abstract unix sockets
  of, processes outside (ABI >= 6).
- **resource limits**: CPU seconds, address space, size of any file written (output
  included), open files.
- **wall-time limit**: the parent kills the process group.
- **a count of files and folders** (``Limits.files``): no limit of the kernel caps how many
  (empty) files a program makes, so the parent counts what is beneath the task directory after
  each run (``os.walk``, links not followed); past the limit, everything that run made is
  removed and the outcome says so (:attr:`Outcome.blocked`). A run can fill the directory
  only for as long as it runs.

The child's audit hook is a courtesy: it turns attempts into clear errors and reports them
(:attr:`Outcome.blocked`), and nothing depends on it.

Where user namespaces are missing, :func:`isolation` refuses unless the caller opts in; then
seccomp and Landlock still stop sockets, processes, signals, reads of ``/proc`` and writes
outside, where the kernel has them (x86-64, Linux >= 5.13). Set ``COLLECTIVE_UNSHARE`` to name
another ``unshare`` program, or to nothing to run without namespaces (as on a machine without
them).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from functools import cache, partial
from pathlib import Path

import msgspec
import trio

from worlds.tempdirs import OwnedDir, sweep_once

CHILD = Path(__file__).with_name("_sandbox_child.py")
UNSHARE = "COLLECTIVE_UNSHARE"
SCRATCH = "collective-sandbox-"


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    wall_seconds: float = 10.0
    cpu_seconds: int = 5
    memory_mb: int = 512
    file_mb: int = 4  # the largest file the code may write, its output included
    files: int = 1000  # files and folders the task directory may hold after a run
    output_chars: int = 2000  # how much of the output comes back


class Call(msgspec.Struct, frozen=True):
    """A function of the agent's package to call: ``args`` is the ``repr`` of a tuple of plain
    values (the engine's own, from its recording of the tests)."""

    module: str
    function: str
    args: str


# What the child says happened to call ``id``: one line each, JSON, nothing else accepted.
class Ready(msgspec.Struct, tag_field="kind", tag="ready", forbid_unknown_fields=True):
    confinement: dict[str, str]


class Returned(msgspec.Struct, tag_field="kind", tag="returned", forbid_unknown_fields=True):
    id: int
    value: str  # a Python literal; parsed, never evaluated


class Raised(msgspec.Struct, tag_field="kind", tag="raised", forbid_unknown_fields=True):
    id: int
    kinds: list[str]  # the built-in exception classes it is an instance of
    error: str


class Unusable(msgspec.Struct, tag_field="kind", tag="unusable", forbid_unknown_fields=True):
    id: int
    error: str  # the package did not import, or the value was not a plain one


class Blocked(msgspec.Struct, tag_field="kind", tag="blocked", forbid_unknown_fields=True):
    what: str


Answer = Returned | Raised | Unusable
_LINE = msgspec.json.Decoder(Ready | Returned | Raised | Unusable | Blocked)


class Outcome(msgspec.Struct, kw_only=True):
    """What a sandboxed run did. ``status`` is ``ok`` (exited 0), ``failed`` (a non-zero exit),
    ``timeout`` (killed at the wall-time limit) or ``limit`` (killed by a resource limit)."""

    status: str
    detail: str  # one line a person (or an agent) reads
    output: str  # the code's own stdout and stderr, sanitised and cut to output_chars
    answers: dict[int, Answer] = {}  # by call index; a call without one never answered
    tampered: str = ""  # why the child's answers are void, if they are
    blocked: list[str] = []  # attempts the audit hook turned into errors
    confinement: dict[str, str] = {}


class SandboxUnavailable(ValueError):
    """This machine cannot give the sandbox a layer it needs, and nobody opted out of it."""


class SandboxBroken(RuntimeError):
    """A confinement layer the kernel has failed to apply: no agent code ran."""


# -- namespaces -------------------------------------------------------------------------------

_NAMESPACES = (
    # the strongest first; a container that forbids mounting a fresh /proc gets the second
    ("--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"),
    ("--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--mount"),
)
_EXTRA = ("--ipc", "--uts")


@cache
def _probe(program: str) -> tuple[tuple[str, ...], str]:
    exe = shutil.which(program)
    if exe is None:
        return (), f"no {program!r} program"
    why = ""
    for flags in _NAMESPACES:
        argv = (exe, *flags, *_EXTRA)
        try:
            done = subprocess.run([*argv, "true"], capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return (), str(e)
        if done.returncode == 0:
            return argv, ""
        err = done.stderr.decode(errors="replace").strip()
        why = why or (err.splitlines()[-1] if err else f"exit status {done.returncode}")
    return (), why


def namespaces() -> tuple[tuple[str, ...], str]:
    """The ``unshare`` command line that gives a child its own namespaces here, or ``()`` and
    why not. ``COLLECTIVE_UNSHARE`` names the program (empty: none, as if they were missing)."""
    program = os.environ.get(UNSHARE, "unshare")
    if not program:
        return (), f"{UNSHARE} is empty"
    return _probe(program)


def isolation(allow_without_namespaces: bool, who: str) -> tuple[str, ...]:
    """The namespace prefix to run children under; refuses (:class:`SandboxUnavailable`, one
    line naming ``who``'s opt-in) where namespaces are missing and nobody opted in."""
    prefix, why = namespaces()
    if not prefix and not allow_without_namespaces:
        raise SandboxUnavailable(
            f"{who}: no user namespaces here ({why}), so agent code would share the machine's "
            "network and process table; set the world parameter allow_without_namespaces=true "
            "(--param allow_without_namespaces=true) to run it under seccomp and Landlock alone"
        )
    return prefix


# -- running ----------------------------------------------------------------------------------


async def run_calls(
    directory: Path,
    calls: Sequence[Call],
    limits: Limits,
    prefix: tuple[str, ...],
    audit_hook: bool = True,
) -> Outcome:
    """Call each function in the package at ``directory`` (imported from there) and collect
    what it returned or raised, under the namespaces of ``prefix`` (from :func:`isolation`).
    Never raises for anything the code does. ``audit_hook=False`` leaves the courtesy hook out
    (the tests do, to show nothing rests on it)."""
    given = json.dumps([[c.module, c.function, c.args] for c in calls])
    return await _run(directory, "calls", given, limits, prefix, len(calls), audit_hook)


async def run_script(
    directory: Path,
    source: str,
    limits: Limits,
    prefix: tuple[str, ...],
    audit_hook: bool = True,
) -> Outcome:
    """Run ``source`` as a script in ``directory``; its output comes back."""
    return await _run(directory, "script", source, limits, prefix, 0, audit_hook)


async def _run(
    directory: Path,
    mode: str,
    given: str,
    limits: Limits,
    prefix: tuple[str, ...],
    n: int,
    audit_hook: bool,
) -> Outcome:
    sweep_once(SCRATCH)
    directory = Path(directory).resolve()
    tmp = directory / ".tmp"
    if tmp.is_symlink() or (tmp.exists() and not tmp.is_dir()):
        tmp.unlink()
    tmp.mkdir(exist_ok=True)
    before = set(_entries(directory))
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(directory),
        "TMPDIR": str(tmp),
        "LC_ALL": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONIOENCODING": "utf-8",
    }
    child_limits = {
        "cpu_seconds": limits.cpu_seconds,
        "memory_mb": limits.memory_mb,
        "file_mb": limits.file_mb,
    }
    scratch = OwnedDir(SCRATCH)
    # The answers come through a pipe: what was written there cannot be unwritten or rewound.
    read_end, write_end = os.pipe()
    cap = limits.file_mb * 2**20
    answers = bytearray()
    returncode: int | None = None
    try:
        (scratch.path / "in").write_text(given, encoding="utf-8")
        with open(scratch.path / "in", "rb") as stdin, open(scratch.path / "out", "wb") as out:
            argv = [sys.executable, "-S", "-s", "-B", str(CHILD), mode, json.dumps(child_limits)]
            argv = [*prefix, *argv, str(write_end), "hook" if audit_hook else "no-hook"]

            async def kill_group(process: trio.Process) -> None:
                with contextlib.suppress(ProcessLookupError):  # it may have ended already
                    os.killpg(process.pid, signal.SIGKILL)

            start = partial(
                trio.run_process,
                argv,
                stdin=stdin,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(write_end,),
                cwd=directory,
                env=env,
                check=False,
                start_new_session=True,
                deliver_cancel=kill_group,
            )
            with trio.move_on_after(limits.wall_seconds):
                async with trio.open_nursery() as nursery:
                    process = await nursery.start(start)
                    os.close(write_end)
                    write_end = -1
                    stream, read_end = trio.lowlevel.FdStream(read_end), -1
                    async with stream:
                        while chunk := await stream.receive_some(1 << 16):
                            if len(answers) <= cap:  # past it, read on so the child never blocks
                                answers += chunk
                returncode = process.returncode
        with open(scratch.path / "out", "rb") as f:
            raw = f.read(64 * limits.output_chars + 65536).decode("utf-8", errors="replace")
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
        scratch.remove()
    lines = bytes(answers)
    if len(lines) > cap:  # more than any honest run writes: keep the whole lines within it
        lines = lines[: lines.rfind(b"\n", 0, cap) + 1]
    outcome = _outcome(raw, returncode, directory, limits)
    ready = _read_answers(outcome, lines, n, prefix)
    _keep_within_count(directory, before, limits, outcome)
    if not ready and returncode is not None:
        # No agent code runs before 'ready': this is the sandbox's own failure, not the agent's.
        last = raw.strip().splitlines()[-1:] or [f"exit status {returncode}"]
        raise SandboxBroken(f"the sandbox did not start: {last[0]}")
    return outcome


def _entries(directory: Path) -> list[Path]:
    """Every file and folder beneath ``directory`` (links are not followed: nothing outside it
    is ever counted or touched)."""
    found: list[Path] = []
    for top, dirs, names in os.walk(directory):
        found += [Path(top) / name for name in dirs + names]
    return found


def _keep_within_count(
    directory: Path, before: set[Path], limits: Limits, outcome: Outcome
) -> None:
    """Past ``limits.files`` files and folders, remove every one this run made (the deepest
    first) and say so; what was there before the run stays."""
    after = _entries(directory)
    if len(after) <= limits.files:
        return
    made = [p for p in after if p not in before]
    for p in sorted(made, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink()
    outcome.blocked = [
        *outcome.blocked,
        f"filling the disk: {len(after)} files and folders, more than the {limits.files} "
        f"allowed; the {len(made)} this run made were removed",
    ]


def _read_answers(outcome: Outcome, lines: bytes, n: int, prefix: tuple[str, ...]) -> bool:
    """Fill ``outcome`` from the child's channel; whether the child got as far as 'ready'.
    The first line must be the child's own ``ready``; after it, one answer per call at most,
    each well formed. Anything else voids every answer: honest runs never write it, so it can
    only come from agent code."""
    answers: dict[int, Answer] = {}
    blocked: list[str] = []
    problem, ready = "", False
    for number, line in enumerate(lines.split(b"\n")[:-1] if lines else []):
        try:
            item = _LINE.decode(line)
        except (msgspec.DecodeError, MemoryError, RecursionError) as e:
            problem = f"line {number + 1} is not in the protocol ({str(e)[:80]})"
            break
        if isinstance(item, Ready) != (number == 0):
            problem = f"line {number + 1}: 'ready' must come first and once"
            break
        if isinstance(item, Ready):
            outcome.confinement, ready = dict(item.confinement), True
        elif isinstance(item, Blocked):
            blocked.append(item.what)
        elif not 0 <= item.id < n or item.id in answers:
            problem = f"line {number + 1}: call {item.id} answered twice or never asked"
            break
        elif isinstance(item, Returned):
            answers[item.id] = item
        else:  # what agent code said on the way: no addresses, no temporary paths
            answers[item.id] = msgspec.structs.replace(item, error=sanitise(item.error)[:500])
    if not problem and lines and not lines.endswith(b"\n"):
        problem = "its last line is cut short"
    if problem:
        outcome.tampered = f"the answers were tampered with: {problem}"
        answers = {}
    outcome.answers = answers
    outcome.blocked = list(dict.fromkeys(_sanitise_all(blocked)))
    if prefix:
        outcome.confinement["namespaces"] = "user, network, PID, mount, IPC, UTS (unshare)"
    else:
        outcome.confinement["namespaces"] = "none: allowed without (allow_without_namespaces)"
    return ready


def _sanitise_all(items: list[str]) -> list[str]:
    return [sanitise(i)[:300] for i in items]


_SIGNALS = {
    signal.SIGXCPU: "used more than its CPU time",
    signal.SIGXFSZ: "wrote more than its file size limit",
    signal.SIGKILL: "was killed (out of memory?)",
    signal.SIGSEGV: "crashed (segmentation fault)",
    signal.SIGSYS: "made a forbidden system call",
}


def _outcome(raw: str, returncode: int | None, directory: Path, limits: Limits) -> Outcome:
    output = sanitise(raw.replace(f"{directory}{os.sep}", "").replace(str(directory), "."))
    output = output.rstrip("\n")
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
    return Outcome(status=status, detail=detail, output=output)


_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
_TMP = re.compile(r"/tmp/collective-[\w.-]+")


def sanitise(text: str) -> str:
    """Drop what differs between two runs of the same code: addresses and temporary paths."""
    return _TMP.sub(".", _ADDRESS.sub("0x...", text))
