"""No source file over 40 KB and no function over 100 lines in the shipped packages, unless it
says why (issue 46).

A file of ``collective/``, ``policy/``, ``worlds/`` or ``experiments/`` holds at most
``MAX_BYTES``; a function there (``def`` or ``async def``, nested ones too, counted from its
``def`` line to its last: ``end_lineno - lineno + 1``) at most ``MAX_LINES``, unless its
docstring gives the reason it is clearer whole, with the words ``REASON`` ("Long because the
parser is the command line's reference, read top to bottom ..."). ``bench/`` and ``tests/``
are programs and checks beside the packages, outside the rule. docs/architecture.md says the
same under "Sizes".
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.support import ROOT

PACKAGES = ("collective", "policy", "worlds", "experiments")
MAX_BYTES = 40_000  # "about 40 KB": 40,000 bytes
MAX_LINES = 100
REASON = "Long because"

def long_functions(source: str) -> Iterator[tuple[str, int]]:
    """Each function of ``source`` over ``MAX_LINES`` whose docstring gives no ``REASON``, as
    its qualified name (``Class.method``, ``outer.inner``) and its length in lines."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}."
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                assert child.end_lineno is not None
                lines = child.end_lineno - child.lineno + 1
                if lines > MAX_LINES and REASON not in (ast.get_docstring(child) or ""):
                    yield name.removesuffix("."), lines
            yield from walk(child, name)

    yield from walk(ast.parse(source), "")


def violations() -> dict[str, str]:
    """Every file over ``MAX_BYTES`` and every unexplained long function of ``PACKAGES``, by
    its path (a function as ``path::qualified.name``), with what it measures."""
    found: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            source = path.read_bytes()
            if len(source) > MAX_BYTES:
                found[where] = f"{len(source):,} bytes"
            for name, lines in long_functions(source.decode()):
                found[f"{where}::{name}"] = f"{lines} lines"
    return found


def test_no_file_or_function_over_the_limits_without_a_reason() -> None:
    assert violations() == {}, (
        f"over {MAX_BYTES:,} bytes or {MAX_LINES} lines: split it along a seam, or (a function "
        f"clearer whole) say why in its docstring with {REASON!r}"
    )


def test_the_check_finds_a_long_function_and_reads_its_reason() -> None:
    def body(indent: int) -> str:  # with its def line: MAX_LINES lines
        return "".join(f"{' ' * indent}x{i} = {i}\n" for i in range(MAX_LINES - 1))

    source = (
        f"def fits():\n{body(4)}"
        f"class Long:\n    def method(self):\n{body(8)}        x = 0\n"
        f'    async def said(self):\n        """{REASON} it is a table."""\n{body(8)}'
        f"def outer():\n    def inner():\n{body(8)}        x = 0\n    return inner\n"
    )
    assert dict(long_functions(source)) == {
        "Long.method": MAX_LINES + 1,
        "outer": MAX_LINES + 3,
        "outer.inner": MAX_LINES + 1,
    }
