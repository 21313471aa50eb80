"""The child side of the sandbox: confine this process, then run agent-written code.

Run by :mod:`worlds.sandbox` as ``python -S -s -B _sandbox_child.py MODE LIMITS FD HOOK`` in
the task directory, standard library only. Its input comes on stdin and is read whole before
any agent code runs: in mode ``calls`` a JSON list of ``[module, function, args]`` (``args``
the ``repr`` of a tuple of plain values), in mode ``script`` the source of a snippet. Then it
confines itself with the kernel's layers (:mod:`worlds._confine`: resource limits, Landlock,
seccomp) and adds an audit hook (unless ``HOOK`` says ``no-hook``), a courtesy that turns an
attempt the kernel would refuse anyway into a clear error and a report.

It never judges anything. In mode ``calls`` it calls each function and writes what happened
(the value returned, as a literal, or the exception raised) on file descriptor ``FD``, one JSON
line per call; the parent compares that with expected values the child never sees. Agent code
can write on that descriptor too, but what it could write there is no more than what a function
could return, and anything out of protocol fails the whole run. Everything on stdout and stderr
is the agent's output.
"""

from __future__ import annotations

import builtins
import importlib
import json
import os
import signal
import sys
from types import TracebackType

import _confine  # from this file's folder, which then leaves the import path

del sys.path[0]
ROOT = os.path.realpath(os.getcwd())
CHANNEL = int(sys.argv[3])  # the parent's file for the answers, passed open


def send(kind: str, **fields: object) -> None:
    os.write(CHANNEL, (json.dumps({"kind": kind, **fields}) + "\n").encode())


# -- confinement ------------------------------------------------------------------------------


def confine(limits: dict[str, int], audit_hook: bool) -> dict[str, str]:
    """Apply every layer this kernel has, in order; a layer it lacks is reported as such, a
    layer that fails stops the run before any agent code. Without ``audit_hook`` (the tests
    run hostile code so, to show that nothing rests on it) the courtesy hook is left out."""
    done = {"limits": _confine.limit(**limits)}
    python = {os.path.realpath(p) for p in (*sys.path, sys.prefix, sys.base_prefix) if p}
    system = ("/usr", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/localtime")
    devices = ("/dev/null", "/dev/zero", "/dev/urandom")
    layers = {
        "landlock": lambda: _confine.landlock(ROOT, sorted(python) + list(system), devices),
        "seccomp": _confine.seccomp,
    }
    for name, apply in layers.items():
        try:
            done[name] = apply()
        except _confine.Unavailable as e:
            done[name] = f"unavailable ({e})"
    for name in [m for m in sys.modules if "ctypes" in m]:
        del sys.modules[name]  # so that agent code importing it meets the audit hook
    if audit_hook:
        _courtesy_hook()
        done["audit"] = "clear errors for sockets, outside writes, processes, signals, ctypes"
    return done


def _courtesy_hook() -> None:
    """Refuse at the Python level what the kernel refuses anyway, with an error that says why,
    and report it. Not a boundary: code that reaches around the interpreter can evade it. Its
    state lives in this closure, not in module globals that agent code could rebind."""
    spawn = frozenset(
        ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork")
    ) | {"os.forkpty", "pty.spawn"}
    paths = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.chmod": 1, "os.chown": 1}
    paths |= {"os.truncate": 1, "os.utime": 1, "shutil.rmtree": 1, "os.rename": 2}
    paths |= {"os.symlink": 2, "os.link": 2}
    path_events = tuple(paths.items())
    writing_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    root, pid, realpath, join = ROOT, os.getpid(), os.path.realpath, os.path.join
    report, error = send, PermissionError

    def inside(path: object) -> bool:
        if isinstance(path, int):
            return True  # an open file descriptor: its opening was checked
        if isinstance(path, bytes):
            path = path.decode(errors="replace")
        real = realpath(join(root, str(path)))
        return real == root or real.startswith(root + "/")

    def refuse(what: str) -> None:
        report("blocked", what=what)
        raise error(f"[sandbox] {what} is not allowed here")

    def hook(event: str, args: tuple) -> None:
        if event.startswith("socket."):
            refuse("network access")
        elif event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & writing_flags
            )
            if writing and path is not None and not inside(path):
                refuse(f"writing outside the task directory ({path})")
        elif event in spawn:
            refuse("starting a process")
        elif event in ("os.kill", "os.killpg") and args[0] not in (pid, 0):
            refuse("signalling another process")
        elif event.startswith("ctypes.") or (event == "import" and "ctypes" in args[0]):
            refuse("ctypes")
        else:
            for name, count in path_events:
                if event == name:
                    for path in args[:count]:
                        if not inside(path):
                            refuse(f"changing files outside the task directory ({path})")

    sys.addaudithook(hook)


# -- describing what agent code did ---------------------------------------------------------


def _where(tb: TracebackType | None) -> str:
    """The innermost frame in the task directory, as a relative ``file:line``."""
    spot = ""
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name.startswith(ROOT + os.sep):
            spot = f"{os.path.relpath(name, ROOT)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return spot


def describe(e: BaseException, spot_first: bool = True) -> str:
    """``file:line: Kind: message`` (or ``Kind: message (file:line)``), at the innermost line
    of the task's own code."""
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    spot = _where(e.__traceback__)
    if isinstance(e, SyntaxError) and e.filename:  # the file that does not parse, not its importer
        text = f"SyntaxError: {e.msg}"
        name = e.filename
        rel = os.path.relpath(name, ROOT) if name.startswith(ROOT + os.sep) else name
        spot = f"{rel}:{e.lineno}"
    if not spot:
        return text[:300]
    return f"{spot}: {text[:300]}" if spot_first else f"{text[:300]} ({spot})"


def kinds(e: BaseException) -> list[str]:
    """The built-in exception classes ``e`` is an instance of, most specific first."""
    return [c.__name__ for c in type(e).__mro__ if getattr(builtins, c.__name__, None) is c]


MAX_VALUE = 100_000  # characters of one value written back: the parent reads no more


class NotPlain(Exception):
    pass


def literal(value: object, depth: int = 0) -> str:
    """``value`` as a Python literal, if it is built of plain values only."""
    kind = type(value)
    if depth > 50:
        raise NotPlain("a value nested too deeply")
    if value is None or kind in (bool, int, str, bytes):
        return repr(value)
    if kind is float:  # infinities as literals; nan has none, and equals nothing anyway
        infinities: dict[object, str] = {float("inf"): "1e999", float("-inf"): "-1e999"}
        return infinities.get(value, repr(value))
    if kind in (list, tuple, set):
        items = [literal(v, depth + 1) for v in value]  # type: ignore[attr-defined]
        if kind is list:
            return "[" + ", ".join(items) + "]"
        if kind is set:
            return "{" + ", ".join(items) + "}" if items else "set()"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if kind is dict:
        pairs = [
            f"{literal(k, depth + 1)}: {literal(v, depth + 1)}"
            for k, v in value.items()  # type: ignore[attr-defined]
        ]
        return "{" + ", ".join(pairs) + "}"
    raise NotPlain(f"a {kind.__name__}, not a plain value")


# -- the two modes --------------------------------------------------------------------------


def run_calls(calls: list[tuple[str, str, tuple]]) -> None:
    sys.path.insert(0, ROOT)
    modules: dict[str, object] = {}
    for i, (module_name, function, args) in enumerate(calls):
        if module_name not in modules:
            try:
                modules[module_name] = importlib.import_module(module_name)
            except BaseException as e:  # the package may not even import: every call fails
                modules[module_name] = f"cannot import {module_name}: {describe(e)}"
        module = modules[module_name]
        if isinstance(module, str):
            send("unusable", id=i, error=module)
            continue
        try:
            fn = getattr(module, function)
            value = fn(*args)
        except BaseException as e:
            send("raised", id=i, kinds=kinds(e), error=describe(e, spot_first=False))
            continue
        try:
            text = literal(value)
            if len(text) > MAX_VALUE:
                raise NotPlain(f"a value longer than {MAX_VALUE} characters")
        except (NotPlain, ValueError, RecursionError, MemoryError) as e:
            send("unusable", id=i, error=f"returned {e}")
            continue
        send("returned", id=i, value=text)


def run_script(source: str) -> None:
    sys.path.insert(0, ROOT)
    try:
        exec(compile(source, "snippet.py", "exec"), {"__name__": "__main__"})
    except SystemExit:
        raise
    except BaseException as e:  # a syntax error included: the agent's, reported as such
        sys.stdout.flush()
        sys.stderr.write(describe(e) + "\n")
        sys.stderr.flush()
        os._exit(1)


def main() -> None:
    mode, limits, audit_hook = sys.argv[1], json.loads(sys.argv[2]), sys.argv[4] == "hook"
    given = sys.stdin.buffer.read().decode()
    calls = []
    if mode == "calls":
        # The engine's own repr of plain values, built from its recording of the tests: read
        # here, with no builtins, before any agent code runs (``ast`` would cost a third of
        # this process's start-up).
        calls = [(m, f, eval(a, {"__builtins__": {}})) for m, f, a in json.loads(given)]
    if os.getpid() == 1:
        # Process 1 of its PID namespace ignores a signal it has no handler for, the resource
        # limits' among them: exit as the signal would have, by the shell's convention.
        for sig in (signal.SIGXCPU, signal.SIGXFSZ):
            signal.signal(sig, lambda s, _: os._exit(128 + s))
    else:
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; the limit ends the run
    try:
        confinement = confine(limits, audit_hook)
    except OSError as e:
        sys.stderr.write(f"sandbox: a confinement layer failed: {e}\n")
        os._exit(125)
    send("ready", confinement=confinement)
    if mode == "calls":
        run_calls(calls)
    else:
        run_script(given)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
