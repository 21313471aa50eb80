"""The command line's rules, in one place every command's parser uses: numbers are read one way
(ASCII digits, no spaces, no empty list items), and a usage error is one line, exit 2.

Python's ``int`` and ``float`` accept more than a number's syntax: ``int(" 12 ")``, ``int("1_2")``
and ``int("١٢")`` (Arabic-Indic digits) all give 12, while JSON (what ``--param`` reads) refuses
the last two. A flag that took one and a ``--param`` that refused it would be two syntaxes for one
thing, so every numeric flag and every ``--param`` value that looks like a number goes through
:func:`parse_int` or :func:`parse_float`. ``inf`` and ``nan`` are read (as floats) so that the
check that refuses them can say which limit they would break.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

T = TypeVar("T", int, float)

_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT = re.compile(
    r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)",
    re.ASCII | re.IGNORECASE,
)
#: A whole number's digits past this are refused before Python is asked to read them (it reads
#: at most 4,300 by default, and no flag of ours means anything that long).
MAX_DIGITS = 100


def _why_not(text: str) -> str:
    """What makes ``text`` no number in this syntax (for the error's end)."""
    if text != text.strip():
        return " (no spaces around a number)"
    if any(c.isdigit() and not c.isascii() for c in text):
        return " (digits are 0-9)"
    if "_" in text:
        return " (no _ in a number)"
    return ""


def parse_int(text: str, what: str = "a whole number") -> int:
    """``text`` as an integer in the one syntax (``[+-]digits``); ValueError otherwise."""
    if not _INT.fullmatch(text):
        raise ValueError(f"expected {what}, got {text!r}{_why_not(text)}")
    if len(text.lstrip("+-")) > MAX_DIGITS:
        raise ValueError(f"expected {what}, got {len(text)} digits")
    return int(text)


def parse_float(text: str, what: str = "a number") -> float:
    """``text`` as a float in the one syntax (decimal, exponent, ``inf``, ``nan``)."""
    if not _FLOAT.fullmatch(text):
        raise ValueError(f"expected {what}, got {text!r}{_why_not(text)}")
    return float(text)


def parse_list(text: str, parse: Callable[[str], T], what: str) -> tuple[T, ...]:
    """Comma-separated numbers (``1,8,64``): none missing (``1,,2`` and ``1,`` are refused,
    not read as ``1,2``), at least one."""
    parts = text.split(",")
    if not text or any(p == "" for p in parts):
        raise ValueError(f"expected comma-separated {what}, got {text!r}")
    try:
        return tuple(parse(p) for p in parts)
    except ValueError:
        bad = next(p for p in parts if not _reads(parse, p))
        raise ValueError(f"expected comma-separated {what}, got {text!r}{_why_not(bad)}") from None


def _reads(parse: Callable[[str], Any], text: str) -> bool:
    try:
        parse(text)
    except ValueError:
        return False
    return True


def _flag(fn: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """``fn`` as an argparse ``type``: its ValueError becomes argparse's own usage error (whose
    text argparse prints after the flag's name)."""

    def read(text: str) -> Any:
        try:
            return fn(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    read.__name__ = name
    return read


def _at_least(low: int, what: str) -> Callable[[str], int]:
    def read(text: str) -> int:
        n = parse_int(text, what)
        if n < low:
            raise ValueError(f"expected {what}, got {text!r}")
        return n

    return read


#: argparse types: every numeric flag of every command is one of these.
whole = _flag(parse_int, "whole")  # any integer (a domain check elsewhere says its range)
count = _flag(_at_least(0, "a whole number >= 0"), "count")
positive = _flag(_at_least(1, "a whole number >= 1"), "positive")
real = _flag(parse_float, "real")
wholes = _flag(lambda t: parse_list(t, parse_int, "whole numbers"), "wholes")
reals = _flag(lambda t: parse_list(t, parse_float, "numbers"), "reals")


def param_value(key: str, value: str) -> Any:
    """A ``--param`` value: JSON if it is JSON (a number as :func:`parse_float` reads it), else
    the text as a string. A value with spaces around it, or that would be a number but for its
    digits (``١٢``), is refused rather than read another way than a flag would read it."""
    if value != value.strip():
        raise ValueError(
            f"{key}={value!r}: spaces around the value (a string with spaces: give it "
            'as JSON, "..." quoted)'
        )
    if _FLOAT.fullmatch(value):
        try:
            return parse_int(value) if _INT.fullmatch(value) else parse_float(value)
        except ValueError as e:
            raise ValueError(f"{key}={value[:40]!r}: {e}") from None
    if any(c.isdigit() and not c.isascii() for c in value) and _looks_numeric(value):
        raise ValueError(f"{key}={value!r}: digits are 0-9")
    import json

    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _looks_numeric(value: str) -> bool:
    """``value`` would read as a number were its digits ASCII (``١٢``, ``１.５``)."""
    ascii_digits = "".join(str(int(c)) if c.isdigit() and not c.isascii() else c for c in value)
    return bool(_FLOAT.fullmatch(ascii_digits))


class Parser(argparse.ArgumentParser):
    """Usage errors as one line (``PROG: error: ... (see PROG --help)``, exit 2), like every
    other error of the command line: never the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
