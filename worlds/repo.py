"""repo: real software engineering, for LLM policies.

The task is a small Python package with a real test suite (one of several, chosen by the seed
or by ``task``), written to a temporary directory. Agents ``ls``, ``cat`` (read) and ``write`` its
files, ``run`` a snippet, and ``test``: the package's code really runs, in a subprocess confined
by :mod:`worlds.sandbox` (its own namespaces, seccomp and Landlock: no network, no other
process, reads of the package and Python only, writes only in the package; CPU, memory and
wall-time limits). Escape attempts come back to the agent as errors, never crash the episode,
and are counted in ``blocked``. In ``hybrid`` clock mode the engine charges and logs the real
duration of ``test`` and ``run``.

A ``test`` run is judged by the engine, never by the code under test: the sandbox only calls
the package's functions with the tests' inputs and reports what came back, and the engine
compares that with the reference solution's answers, which it alone holds
(:mod:`worlds.repo_checks`). So no code an agent writes can report a pass it did not earn. The
test files are not in the package's directory; agents read them with ``cat``.

The score is the fraction of the suite that passed at the last ``test`` run, as in CI: code
nobody has tested earns nothing yet. It is not monotone (a later run may pass less).

Where the machine has no unprivileged user namespaces the world refuses to start, naming the
opt-in: ``allow_without_namespaces=true`` runs agent code with seccomp and Landlock alone.

Scaling: with ``team_size = 0`` every agent works on one package; with ``team_size = k`` the
repository holds one copy of the package per k agents, each agent works on its team's copy, and
the score is the mean over copies.

Actions are one line, so ``write`` and ``run`` take their text with escapes: ``\\n`` is a
newline, ``\\t`` a tab, ``\\q`` a double quote and ``\\\\`` a backslash.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import weakref
from pathlib import Path, PurePosixPath
from typing import Annotated

from collective.world import OneOf, Text, ToolError, World, tool
from worlds.repo_checks import judge, suite
from worlds.repo_tasks import TASKS, Task
from worlds.sandbox import Limits, Outcome, isolation, run_calls, run_script
from worlds.tempdirs import OwnedDir, sweep_once

_ESCAPE = re.compile(r"\\([ntq\\])")
_UNESCAPE = {"n": "\n", "t": "\t", "q": '"', "\\": "\\"}


def unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: _UNESCAPE[m.group(1)], text)


def escape(text: str) -> str:
    """The inverse of :func:`unescape`: a file's content as the text of one action."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace('"', "\\q")


LS_FILES = 50  # files ls lists: agent code may have made thousands
CAT_CHARS = 8000  # characters cat returns: a result lands in the record and the next prompt
PREFIX = "collective-repo-"


class Repo(World):
    lexicon = ("test", "fail", "pass", "fixed", "bug", "done", "read", "write", "mine")

    def __init__(
        self,
        n_agents: int = 1,
        seed: int = 0,
        task: str = "",
        team_size: int = 0,
        read_seconds: float = 2.0,
        write_seconds: float = 3.0,
        test_seconds: float = 10.0,
        run_seconds: float = 5.0,
        wall_seconds: float = 10.0,
        cpu_seconds: int = 5,
        memory_mb: int = 512,
        disk_mb: int = 64,
        allow_without_namespaces: bool = False,
    ) -> None:
        """``task`` names a variant (``roman``, ``intervals``, ``textstats``, ``rpn``; by default
        the seed picks one); ``team_size`` agents share one copy of it (0: everyone shares one);
        the ``*_seconds`` are simulated durations of the tools; ``wall_seconds``,
        ``cpu_seconds`` and ``memory_mb`` limit each real run, ``disk_mb`` what a team's copy
        of the package may hold (in bytes; in number, ``sandbox.Limits.files`` files and
        folders, checked after every run); ``allow_without_namespaces`` runs agent code even
        where the machine cannot give it namespaces of its own (a weaker sandbox)."""
        super().__init__(n_agents, seed)
        names = [t.name for t in TASKS]
        if task and task not in names:
            raise ValueError(f"Repo: unknown task {task!r}; tasks are: {', '.join(names)}")
        if team_size < 0:
            raise ValueError(f"Repo: team_size must be >= 0, got {team_size}")
        knobs = {"wall_seconds": wall_seconds, "cpu_seconds": cpu_seconds}
        knobs |= {"memory_mb": memory_mb, "disk_mb": disk_mb}
        for name, value in knobs.items():
            if not value > 0:
                raise ValueError(f"Repo: {name} must be > 0, got {value}")
        self.namespaces = isolation(bool(allow_without_namespaces), "Repo")
        sweep_once(PREFIX)  # what processes killed mid-run left
        self.task: Task = TASKS[names.index(task)] if task else TASKS[seed % len(TASKS)]
        self.suite = suite(self.task.name)
        self.read_seconds, self.write_seconds = read_seconds, write_seconds
        self.test_seconds, self.run_seconds = test_seconds, run_seconds
        self.limits = Limits(
            wall_seconds=wall_seconds, cpu_seconds=cpu_seconds, memory_mb=memory_mb
        )
        self.disk_mb = disk_mb
        self.team_size = team_size
        copies = -(-n_agents // team_size) if team_size else 1
        self.editable = tuple(self.task.files)
        self.readable = (*self.editable, *self.task.tests)
        self.test_names = [check.name for check in self.suite.checks]
        owned = OwnedDir(PREFIX)
        self.root = owned.path
        # Removed by close(), or when the world is collected if an episode never got that far.
        self._remove = weakref.finalize(self, owned.remove)
        self.dirs = [self.root / f"team{c}" for c in range(copies)]
        for d in self.dirs:
            for path, text in self.task.files.items():
                (d / path).parent.mkdir(parents=True, exist_ok=True)
                (d / path).write_text(text)
        self.passed: list[int | None] = [None] * copies  # at the last run; None: never run
        self.changed = [False] * copies  # code written since the last run
        self.runs = 0
        self.blocked = 0  # escape attempts refused, forged answers included
        self.stopped = 0  # runs killed by a time or resource limit
        self.confinement: dict[str, str] = {}

    # -- what agents see and do --------------------------------------------------------------

    def observe(self, agent: int) -> str:
        c = self._copy(agent)
        passed, n = self.passed[c], len(self.test_names)
        if passed is None:
            state = f"tests: {n}, not run yet"
        else:
            state = f"tests: {passed}/{n} passed at the last run"
            if self.changed[c]:
                state += " (code changed since)"
        return f"{self.task.summary}. {state}."

    @tool(duration=1.0)
    def ls(self, agent: int) -> str:
        """list the package's files"""
        d = self.dirs[self._copy(agent)]
        found = []
        for top, dirs, names in os.walk(d):  # links are not followed
            dirs[:] = sorted(x for x in dirs if x not in (".tmp", "__pycache__"))
            for name in names:
                path = Path(top) / name
                if stat.S_ISREG(path.lstat().st_mode):
                    found.append((path.relative_to(d).as_posix(), _lines(path)))
        found += [(path, text.count("\n")) for path, text in self.task.tests.items()]
        found.sort()
        more = f", and {len(found) - LS_FILES} more" if len(found) > LS_FILES else ""
        return ", ".join(f"{f} ({n} lines)" for f, n in found[:LS_FILES]) + more

    @tool(duration="read_seconds")
    def cat(self, agent: int, path: Annotated[str, OneOf("readable")]) -> str:
        """read a file"""
        if path in self.task.tests:
            text = self.task.tests[path]
        else:
            fd = self._open(self._copy(agent), path, os.O_RDONLY)
            with os.fdopen(fd, "rb") as f:
                data = f.read(4 * CAT_CHARS)
            text = data.decode("utf-8", errors="replace")
        if len(text) > CAT_CHARS:
            text = text[:CAT_CHARS] + f"\n... (cut at {CAT_CHARS} characters)"
        return text

    @tool(duration="write_seconds")
    def write(
        self,
        agent: int,
        path: Annotated[str, OneOf("editable")],
        content: Annotated[str, Text(4000)],
    ) -> str:
        """replace a file's content (one line: \\n for newlines, \\q for double quotes)"""
        c = self._copy(agent)
        text = unescape(content)
        fd = self._open(c, path, os.O_WRONLY | os.O_CREAT)
        try:
            os.ftruncate(fd, 0)
            with os.fdopen(fd, "w", encoding="utf-8", closefd=False) as f:
                f.write(text)
        except OSError as e:
            raise ToolError(f"cannot write {path}: {e.strerror}") from None
        finally:
            os.close(fd)
        self.changed[c] = True
        return f"wrote {path} ({text.count(chr(10)) + 1} lines)"

    @tool(duration="test_seconds")
    async def test(self, agent: int) -> str:
        """run the test suite (really)"""
        c = self._copy(agent)
        outcome = await run_calls(self.dirs[c], self.suite.calls, self.limits, self.namespaces)
        self._keep_within_disk(c, outcome)
        verdicts = judge(self.suite, outcome)
        if outcome.tampered:
            outcome.blocked = [*outcome.blocked, outcome.tampered]
        self._count(outcome)
        passed = sum(v.ok for v in verdicts)
        self.passed[c], self.changed[c] = passed, False
        self.runs += 1
        lines = [f"{passed}/{len(self.test_names)} passed"]
        failing = [v for v in verdicts if not v.ok]
        if failing and not outcome.tampered:
            lines.append(f"first failure: {failing[0].name}: {self._clean(c, failing[0].error)}")
        if outcome.status in ("timeout", "limit"):
            lines.append(outcome.detail)
        lines += [f"blocked: {b}" for b in outcome.blocked]
        if outcome.blocked or outcome.status in ("timeout", "limit"):
            raise ToolError("\n".join(lines))  # scored, but reported as the error it is
        return "\n".join(lines)

    @tool(duration="run_seconds")
    async def run(self, agent: int, code: Annotated[str, Text(2000)]) -> str:
        """run a Python snippet in the package directory and see its output"""
        c = self._copy(agent)
        outcome = await run_script(self.dirs[c], unescape(code), self.limits, self.namespaces)
        self._keep_within_disk(c, outcome)
        self._count(outcome)
        head = "" if outcome.status == "ok" else outcome.detail
        blocked = "".join(f"\nblocked: {b}" for b in outcome.blocked)
        result = "\n".join(x for x in (head, outcome.output) if x) + blocked
        if outcome.status != "ok" or outcome.blocked:
            raise ToolError(result)
        return result or "(no output)"

    def score(self) -> float:
        n = len(self.test_names)
        return sum(p or 0 for p in self.passed) / (n * len(self.passed))

    def metrics(self) -> dict[str, float]:
        return {"test_runs": self.runs, "blocked": self.blocked, "stopped": self.stopped}

    def close(self) -> None:
        self._remove()

    # -- bookkeeping ---------------------------------------------------------------------------

    def _open(self, c: int, path: str, flags: int) -> int:
        """Open ``path`` in team ``c``'s copy of the package, for the engine, which works
        outside the sandbox: one component at a time, never following a link, and only a
        regular file with one name (a link or a hard link that agent code planted would carry
        the engine's read or write outside the copy). Missing folders are made when writing."""
        fd = os.open(self.dirs[c], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        parts = PurePosixPath(path).parts
        try:
            for i, part in enumerate(parts):
                folder = i < len(parts) - 1
                try:
                    if folder and flags & os.O_CREAT:
                        with contextlib.suppress(FileExistsError):
                            os.mkdir(part, dir_fd=fd)
                    mode = os.O_RDONLY | os.O_DIRECTORY if folder else flags | os.O_NONBLOCK
                    nfd = os.open(part, mode | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
                except OSError as e:
                    if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
                        raise ToolError(f"cannot open {path}: {e.strerror}") from None
                    at = "/".join(parts[: i + 1])
                    why = "is a link or not a plain file; refused"
                    raise ToolError(f"{path}: {at} {why}") from None
                os.close(fd)
                fd = nfd
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
                raise ToolError(f"{path}: not a plain file, or linked elsewhere; refused")
            os.set_blocking(fd, True)
            result, fd = fd, -1
            return result
        finally:
            if fd >= 0:
                os.close(fd)

    def _keep_within_disk(self, c: int, outcome: Outcome) -> None:
        """Each file agent code writes is capped, their number is not: when team ``c``'s copy
        grows past ``disk_mb``, every file the task does not have goes, and the run reports it.
        (``os.walk`` without following links: nothing outside the copy is ever touched.)"""
        d = self.dirs[c]
        files = [Path(top) / name for top, _, names in os.walk(d) for name in names]
        regular = [(p, p.lstat()) for p in files]
        regular = [(p, st) for p, st in regular if stat.S_ISREG(st.st_mode)]
        if sum(st.st_size for _, st in regular) <= self.disk_mb * 2**20:
            return
        own = {d / path for path in self.editable}
        for p in files:
            if p not in own:
                p.unlink(missing_ok=True)
        outcome.blocked = [
            *outcome.blocked,
            f"filling the disk: the package grew past {self.disk_mb} MB; "
            "the files the task does not have were removed",
        ]

    def _clean(self, c: int, text: str) -> str:
        d = str(self.dirs[c])
        return text.replace(d + os.sep, "").replace(d, ".")

    def _copy(self, agent: int) -> int:
        return (agent // self.team_size) % len(self.dirs) if self.team_size else 0

    def _count(self, outcome: Outcome) -> None:
        self.blocked += len(outcome.blocked)
        self.stopped += outcome.status in ("timeout", "limit")
        self.confinement = outcome.confinement or self.confinement


def _lines(path: Path) -> int:
    """Lines of a regular file (a link or a FIFO swapped in since counts none)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return 0
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return 0
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 16), b""))
