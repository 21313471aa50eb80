"""repo: real software engineering, for LLM policies.

The task is a small Python package with a real test suite (one of several, chosen by the seed
or by ``task``), written to a temporary directory. Agents ``ls``, ``cat`` (read) and ``write`` its
files, ``run`` a snippet, and ``test``: the suite really runs, in a subprocess confined by
:mod:`worlds.sandbox` (no network, writes only in the package's directory, CPU, memory and
wall-time limits). Escape attempts come back to the agent as errors, never crash the episode,
and are counted in ``blocked``. In ``hybrid`` clock mode the engine charges and logs the real
duration of ``test`` and ``run``.

The score is the fraction of the suite that passed at the last ``test`` run, as in CI: code
nobody has tested earns nothing yet. It is not monotone (a later run may pass less). The test
files are restored before every run and only their tests count, so editing them changes
nothing.

Scaling: with ``team_size = 0`` every agent works on one package; with ``team_size = k`` the
repository holds one copy of the package per k agents, each agent works on its team's copy, and
the score is the mean over copies.

Actions are one line, so ``write`` and ``run`` take their text with escapes: ``\\n`` is a
newline, ``\\t`` a tab, ``\\q`` a double quote and ``\\\\`` a backslash.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import weakref
from pathlib import Path
from typing import Annotated

from collective.world import OneOf, Text, ToolError, World, tool
from worlds.repo_tasks import TASKS, Task
from worlds.sandbox import Limits, Outcome, run_sandboxed

_ESCAPE = re.compile(r"\\([ntq\\])")
_UNESCAPE = {"n": "\n", "t": "\t", "q": '"', "\\": "\\"}
_TEST_DEF = re.compile(r"^def (test_\w+)\(", re.M)


def unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: _UNESCAPE[m.group(1)], text)


def escape(text: str) -> str:
    """The inverse of :func:`unescape`: a file's content as the text of one action."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace('"', "\\q")


LS_FILES = 50  # files ls lists: agent code may have made thousands
CAT_CHARS = 8000  # characters cat returns: a result lands in the record and the next prompt


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
    ) -> None:
        """``task`` names a variant (``roman``, ``intervals``, ``textstats``, ``rpn``; by default
        the seed picks one); ``team_size`` agents share one copy of it (0: everyone shares one);
        the ``*_seconds`` are simulated durations of the tools; ``wall_seconds``,
        ``cpu_seconds`` and ``memory_mb`` limit each real run, ``disk_mb`` what a team's copy
        of the package may hold."""
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
        self.task: Task = TASKS[names.index(task)] if task else TASKS[seed % len(TASKS)]
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
        self.test_names = [
            f"{Path(path).stem}.{name}"
            for path, text in self.task.tests.items()
            for name in _TEST_DEF.findall(text)
        ]
        self.root = Path(tempfile.mkdtemp(prefix="collective-repo-"))
        # Removed by close(), or when the world is collected if an episode never got that far.
        self._remove = weakref.finalize(self, shutil.rmtree, self.root, ignore_errors=True)
        self.dirs = [self.root / f"team{c}" for c in range(copies)]
        for d in self.dirs:
            for path, text in {**self.task.files, **self.task.tests}.items():
                (d / path).parent.mkdir(parents=True, exist_ok=True)
                (d / path).write_text(text)
        (self.root / "snippets").mkdir()
        self.passed: list[int | None] = [None] * copies  # at the last run; None: never run
        self.changed = [False] * copies  # code written since the last run
        self.runs = 0
        self.blocked = 0  # escape attempts the sandbox refused
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
        files = sorted(
            p.relative_to(d).as_posix()
            for p in d.rglob("*")
            if p.is_file()
            and not p.is_symlink()
            and not {".tmp", "__pycache__"} & set(p.relative_to(d).parts)
        )
        more = f", and {len(files) - LS_FILES} more" if len(files) > LS_FILES else ""
        return ", ".join(f"{f} ({self._lines(d / f)} lines)" for f in files[:LS_FILES]) + more

    @tool(duration="read_seconds")
    def cat(self, agent: int, path: Annotated[str, OneOf("readable")]) -> str:
        """read a file"""
        try:
            text = self._file(self._copy(agent), path).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ToolError(f"cannot read {path}: {e}") from None
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
        target = self._file(c, path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
            with os.fdopen(os.open(target, flags, 0o644), "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise ToolError(f"cannot write {path}: {e.strerror}") from None
        self.changed[c] = True
        return f"wrote {path} ({text.count(chr(10)) + 1} lines)"

    @tool(duration="test_seconds")
    async def test(self, agent: int) -> str:
        """run the test suite (really)"""
        c = self._copy(agent)
        d = self.dirs[c]
        tests_dir = d / "tests"
        try:  # restore the suite exactly: no edits, no extra tests, whatever was left there
            if tests_dir.is_symlink() or tests_dir.is_file():
                tests_dir.unlink()
            elif tests_dir.exists():
                shutil.rmtree(tests_dir)
            for path, text in self.task.tests.items():
                (d / path).parent.mkdir(parents=True, exist_ok=True)
                (d / path).write_text(text)
        except OSError as e:
            raise ToolError(f"cannot restore the test suite: {e.strerror}") from None
        outcome = await run_sandboxed(d, "tests", "tests", self.limits)
        self._keep_within_disk(c, outcome)
        self._count(outcome)
        ok = {t.name for t in outcome.tests if t.ok}
        passed = sum(1 for name in self.test_names if name in ok)
        self.passed[c], self.changed[c] = passed, False
        self.runs += 1
        lines = [f"{passed}/{len(self.test_names)} passed"]
        failing = [t for t in outcome.tests if not t.ok and t.name in self.test_names]
        if failing:
            lines.append("first failure: " + f"{failing[0].name}: {failing[0].error}")
        lines += [f"cannot import {m}" for m in outcome.module_errors[:1]]
        if outcome.status in ("timeout", "limit"):
            lines.append(outcome.detail)
        lines += [f"blocked: {b}" for b in outcome.blocked]
        if outcome.blocked or outcome.status in ("timeout", "limit"):
            raise ToolError("\n".join(lines))  # scored, but reported as the error it is
        return "\n".join(lines)

    @tool(duration="run_seconds")
    async def run(self, agent: int, code: Annotated[str, Text(2000)]) -> str:
        """run a Python snippet in the package directory and see its output"""
        snippet = self.root / "snippets" / f"agent{agent}.py"
        snippet.write_text(unescape(code))
        c = self._copy(agent)
        outcome = await run_sandboxed(self.dirs[c], "script", str(snippet), self.limits)
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

    def _file(self, c: int, path: str) -> Path:
        """``path`` in team ``c``'s copy of the package. The engine reads and writes it outside
        the sandbox, so a link that agent code planted on the way is refused, never followed."""
        d = self.dirs[c]
        at = d
        for part in Path(path).parts:
            at = at / part
            if at.is_symlink():
                raise ToolError(f"{path}: {at.relative_to(d).as_posix()} is a link; refused")
        return d / path

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
        own = {d / path for path in self.readable}
        for p in files:
            if p not in own:
                p.unlink(missing_ok=True)
        outcome.blocked = [
            *outcome.blocked,
            f"filling the disk: the package grew past {self.disk_mb} MB; "
            "the files the task does not have were removed",
        ]

    def _copy(self, agent: int) -> int:
        return (agent // self.team_size) % len(self.dirs) if self.team_size else 0

    def _count(self, outcome: Outcome) -> None:
        self.blocked += len(outcome.blocked)
        self.stopped += outcome.status in ("timeout", "limit")
        self.confinement = outcome.confinement or self.confinement

    @staticmethod
    def _lines(path: Path) -> int:
        try:
            return path.read_bytes().count(b"\n")
        except OSError:
            return 0
