"""The repo world's verdicts: what each test calls, what it must get back, and the judging.

A task's tests are plain ``test_*`` functions that agents read. The engine never runs them
against agent code, where that code could rewrite the runner and report a pass. It runs them
once, in its own process, against the task's reference solution, recording every call they
make to the package and what came back: a value, or an exception's class. That record is the
:class:`Suite`. A test run sends only the calls to the sandbox
(:func:`worlds.sandbox.run_calls`); the expected values never leave this process, and
:func:`judge` compares. A test passes when every call it made returns what the reference
returned (equal, with the same container types, as ``==`` on plain values would say) or raises
the same built-in exception (or a subclass of it), as its ``raises(...)`` asked.

So a test that checks a property (``from_roman(to_roman(n)) == n``) is judged on the calls the
reference made (``to_roman(n)`` must give the reference's numeral, ``from_roman`` of that
numeral must give ``n``): stricter than the assertion, never looser.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable
from functools import cache
from pathlib import PurePosixPath
from types import SimpleNamespace
from typing import Any

import msgspec

from worlds.repo_tasks import TASKS, Task
from worlds.sandbox import Call, Outcome, Raised, Returned

MAX_VALUE = 100_000  # characters of a returned value that are read (the child sends no more)
SHOWN = 80  # characters of a value shown in a failure


class Expect(msgspec.Struct, frozen=True):
    returns: Any = None
    raises: str = ""  # a built-in exception's name; empty when a value is expected
    text: str = ""  # repr(returns): the literal an equal answer is most often written as


class Check(msgspec.Struct, frozen=True):
    name: str  # test file stem and function: test_calc.test_add_mul
    calls: tuple[int, ...]  # indices into Suite.calls


class Suite(msgspec.Struct, frozen=True):
    calls: tuple[Call, ...]  # distinct: a call two tests make is made once
    expected: tuple[Expect, ...]
    checks: tuple[Check, ...]


class Verdict(msgspec.Struct, frozen=True):
    name: str
    ok: bool
    error: str


@cache
def suite(task_name: str) -> Suite:
    return record(next(t for t in TASKS if t.name == task_name))


def record(task: Task) -> Suite:
    """Run ``task``'s tests against its reference solution here, recording each call."""
    reference: dict[str, Callable[..., Any]] = {}
    for path, source in task.solution.items():
        space: dict[str, Any] = {"__name__": PurePosixPath(path).stem}
        exec(compile(source, path, "exec"), space)
        reference |= {k: v for k, v in space.items() if callable(v) and not k.startswith("_")}
    packages = {PurePosixPath(p).parts[0] for p in task.files}
    calls: list[Call] = []
    expected: list[Expect] = []
    index: dict[Call, int] = {}
    made: list[int] = []  # by the test now running

    def keep(call: Call, expect: Expect) -> None:
        if call not in index:
            index[call] = len(calls)
            calls.append(call)
            expected.append(expect)
        made.append(index[call])

    def recorder(module: str, function: str) -> Callable[..., Any]:
        fn = reference[function]

        def call(*args: Any) -> Any:
            text = repr(args)
            if ast.literal_eval(text) != args:
                raise ValueError(f"{task.name}: {function}{text} is not a literal call")
            try:
                value = fn(*args)
            except Exception as e:
                if getattr(builtins, type(e).__name__, None) is not type(e):
                    raise ValueError(f"{task.name}: the reference raised {e!r}") from e
                keep(Call(module, function, text), Expect(raises=type(e).__name__))
                raise
            keep(Call(module, function, text), Expect(returns=value, text=repr(value)))
            return value

        return call

    def importer(name: str, *rest: Any, **kw: Any) -> Any:
        if name in packages:
            return SimpleNamespace(**{f: recorder(name, f) for f in reference})
        return builtins.__import__(name, *rest, **kw)

    checks: list[Check] = []
    for path, source in task.tests.items():
        stem = PurePosixPath(path).stem
        space = {"__name__": stem, "__builtins__": {**vars(builtins), "__import__": importer}}
        exec(compile(source, path, "exec"), space)
        for name, test in list(space.items()):
            if name.startswith("test_") and callable(test):
                made.clear()
                test()  # an AssertionError here: the task's own tests fail its reference
                checks.append(Check(f"{stem}.{name}", tuple(dict.fromkeys(made))))
    return Suite(tuple(calls), tuple(expected), tuple(checks))


def judge(s: Suite, outcome: Outcome) -> list[Verdict]:
    """Each test's verdict from what the sandbox saw each call do."""
    verdicts = []
    for check in s.checks:
        error = ""
        for i in check.calls:
            error = outcome.tampered or _mismatch(s.calls[i], s.expected[i], outcome, i)
            if error:
                break
        verdicts.append(Verdict(check.name, not error, error))
    return verdicts


def _mismatch(call: Call, expect: Expect, outcome: Outcome, i: int) -> str:
    """Why the answer to call ``i`` is not the expected one; empty if it is."""
    answer = outcome.answers.get(i)
    if isinstance(answer, Raised) and expect.raises and expect.raises in answer.kinds:
        return ""
    if isinstance(answer, Returned) and not expect.raises:
        if answer.value == expect.text:  # the literal itself: the same value, of the same types
            return ""
        readable, value = literal(answer.value)
        if readable and same(expect.returns, value):
            return ""
    shown = f"{call.function}({', '.join(repr(a) for a in ast.literal_eval(call.args))})"
    want = f"expected {expect.raises or _cut(expect.text)}"
    if answer is None:
        return f"{shown}: no answer ({outcome.detail})"
    if isinstance(answer, Raised):
        return f"{shown} raised {answer.error}, {want}"
    if isinstance(answer, Returned):
        return f"{shown} returned {_cut(answer.value)}, {want}"
    return f"{shown}: {answer.error}"


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN else text[:SHOWN] + "..."


def literal(text: str) -> tuple[bool, Any]:
    """Read a value the child returned: a Python literal of at most :data:`MAX_VALUE`
    characters, parsed and never evaluated. ``(False, None)`` for anything else."""
    if len(text) > MAX_VALUE:
        return False, None
    try:
        return True, ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def same(expected: Any, got: Any) -> bool:
    """``expected == got`` for plain values, but with containers of the same types (a list is
    not a tuple) and booleans only equal to booleans; numbers compare as numbers."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    numbers = (int, float)
    if type(expected) in numbers and type(got) in numbers:
        return bool(expected == got)
    if type(expected) is not type(got):
        return False
    if isinstance(expected, list | tuple):
        return len(expected) == len(got) and all(map(same, expected, got))
    if isinstance(expected, dict):
        return expected.keys() == got.keys() and all(same(v, got[k]) for k, v in expected.items())
    return bool(expected == got)
