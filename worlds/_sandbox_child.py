"""The child side of the sandbox: confine this process, then run agent-written code.

Run by :mod:`worlds.sandbox` as ``python -S -s -B _sandbox_child.py MODE TARGET LIMITS`` with the
task directory as its working directory. Standard library only. Before any agent code is
imported it applies, in order:

1. resource limits (``setrlimit``): CPU seconds, address space, file size, open files, no core;
2. Landlock, where the kernel has it: file-system writes only beneath the task directory, no
   TCP bind or connect (ABI >= 4), no signals or abstract sockets outside this process (ABI >= 6),
   enforced by the kernel and inherited by anything it starts;
3. a Python audit hook: refuses sockets, writes outside the directory, new processes, signals to
   other processes and ctypes, with a clear ``PermissionError``, and reports each refusal to the
   parent on a line tagged with a nonce.

The parent adds a network namespace (``unshare -rn``) where it can, a wall-time limit, and kills
the whole process group when time is up. Results and reports are lines ``<nonce> <json>`` on
stdout; everything else on stdout and stderr is the agent's output.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import resource
import signal
import sys
import traceback

NONCE = os.environ.pop("SANDBOX_NONCE", "")
ROOT = os.path.realpath(os.getcwd())
CONFINEMENT: dict[str, str] = {}


def report(kind: str, **fields: object) -> None:
    sys.stdout.write(f"{NONCE} {json.dumps({'kind': kind, **fields})}\n")
    sys.stdout.flush()


# -- 1. resource limits ---------------------------------------------------------------------


def limit(limits: dict[str, int]) -> None:
    mb = 1024 * 1024
    cpu = limits["cpu_seconds"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    CONFINEMENT["limits"] = (
        f"setrlimit: cpu {cpu}s, memory {limits['memory_mb']} MB, files {limits['file_mb']} MB"
    )


# -- 2. Landlock ------------------------------------------------------------------------------

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_PR_SET_NO_NEW_PRIVS = 38


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


def landlock() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        CONFINEMENT["landlock"] = "unavailable"
        return
    write = (1 << 1) | (1 << 4) | (1 << 5)  # write file, remove dir, remove file
    write |= sum(1 << b for b in range(6, 13))  # make char/dir/reg/sock/fifo/block/sym
    write |= (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0)  # refer, truncate
    attr = _RulesetAttr(write, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    fd = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    dir_fd = os.open(ROOT, os.O_PATH | os.O_DIRECTORY)
    rule = _PathBeneath(write, dir_fd)
    if libc.syscall(_ADD_RULE, fd, 1, ctypes.byref(rule), 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_add_rule failed")
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.syscall(_RESTRICT_SELF, fd, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    os.close(dir_fd)
    os.close(fd)
    done = ["writes only in the task directory"]
    if abi >= 4:
        done.append("no TCP")
    if abi >= 6:
        done.append("no signals out")
    CONFINEMENT["landlock"] = f"ABI {abi}: " + ", ".join(done)


# -- 3. the audit hook ------------------------------------------------------------------------

_SPAWN = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork"}
_SPAWN |= {"os.forkpty", "pty.spawn"}
_PATH_EVENTS = {
    "os.remove": 1,
    "os.rmdir": 1,
    "os.mkdir": 1,
    "os.chmod": 1,
    "os.chown": 1,
    "os.truncate": 1,
    "os.utime": 1,
    "shutil.rmtree": 1,
    "os.rename": 2,
    "os.symlink": 2,
    "os.link": 2,
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _inside(path: object) -> bool:
    if isinstance(path, int):
        return True  # an open file descriptor: its opening was checked
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    real = os.path.realpath(os.path.join(ROOT, str(path)))
    return real == ROOT or real.startswith(ROOT + os.sep)


def _refuse(what: str) -> None:
    report("blocked", what=what)
    raise PermissionError(f"[sandbox] {what} is not allowed here")


def _hook(event: str, args: tuple) -> None:
    if event.startswith("socket."):
        _refuse("network access")
    elif event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS
        )
        if writing and path is not None and not _inside(path):
            _refuse(f"writing outside the task directory ({path})")
    elif event in _PATH_EVENTS:
        for path in args[: _PATH_EVENTS[event]]:
            if not _inside(path):
                _refuse(f"changing files outside the task directory ({path})")
    elif event in _SPAWN:
        _refuse("starting a process")
    elif event in ("os.kill", "os.killpg") and args[0] not in (os.getpid(), 0):
        _refuse("signalling another process")
    elif event.startswith("ctypes.") or (event == "import" and "ctypes" in args[0]):
        _refuse("ctypes")


# -- running agent code -----------------------------------------------------------------------


def _where(tb: object) -> str:
    """The innermost frame in the task directory, as a relative ``file:line``."""
    spot = ""
    for frame in traceback.extract_tb(tb):  # type: ignore[arg-type]
        if frame.filename.startswith(ROOT + os.sep):
            spot = f"{os.path.relpath(frame.filename, ROOT)}:{frame.lineno}"
    return spot


def _describe(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    spot = _where(e.__traceback__)
    if isinstance(e, SyntaxError) and e.filename:  # the file that does not parse, not its importer
        text = f"SyntaxError: {e.msg}"
        name = e.filename
        rel = os.path.relpath(name, ROOT) if name.startswith(ROOT + os.sep) else name
        spot = f"{rel}:{e.lineno}"
    return (f"{spot}: " if spot else "") + text[:300]


def run_tests(tests_dir: str) -> None:
    """Import every ``tests/test_*.py`` and call each ``test_*`` function in definition order."""
    sys.path.insert(0, ROOT)
    for name in sorted(os.listdir(tests_dir)):
        if not (name.startswith("test_") and name.endswith(".py")):
            continue
        path = os.path.join(tests_dir, name)
        mod_name = name[:-3]
        try:
            spec = importlib.util.spec_from_file_location(mod_name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[mod_name] = module
            spec.loader.exec_module(module)
        except BaseException as e:  # the package may not even import: every test fails
            report("module", file=name, error=_describe(e))
            continue
        for test_name, fn in list(vars(module).items()):
            if not (test_name.startswith("test_") and callable(fn)):
                continue
            try:
                fn()
                report("test", name=f"{mod_name}.{test_name}", ok=True, error="")
            except BaseException as e:
                if isinstance(e, KeyboardInterrupt):
                    raise
                report("test", name=f"{mod_name}.{test_name}", ok=False, error=_describe(e))


def run_script(path: str) -> None:
    sys.path.insert(0, ROOT)
    with open(path, encoding="utf-8") as f:
        source = f.read()
    try:
        exec(compile(source, "snippet.py", "exec"), {"__name__": "__main__"})
    except SystemExit:
        raise
    except BaseException as e:  # a syntax error included: the agent's, reported as such
        sys.stdout.flush()
        sys.stderr.write(_describe(e) + "\n")
        sys.stderr.flush()
        os._exit(1)


def main() -> None:
    mode, target, limits = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    if os.getpid() == 1:
        # Process 1 of its PID namespace ignores a signal it has no handler for, the resource
        # limits' among them: exit as the signal would have, by the shell's convention.
        for sig in (signal.SIGXCPU, signal.SIGXFSZ):
            signal.signal(sig, lambda s, _: os._exit(128 + s))
    limit(limits)
    try:
        landlock()
    except OSError as e:
        CONFINEMENT["landlock"] = f"failed ({e})"
    for name in [m for m in sys.modules if "ctypes" in m]:
        del sys.modules[name]  # so that agent code importing it meets the hook
    sys.addaudithook(_hook)
    CONFINEMENT["audit"] = "sockets, outside writes, processes, signals, ctypes refused"
    report("ready", confinement=CONFINEMENT)
    if mode == "tests":
        run_tests(target)
    else:
        run_script(target)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
