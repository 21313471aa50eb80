"""An action space as a structured-output constraint: a regular expression or an EBNF grammar.

A server that decodes under a constraint (SGLang's ``regex`` and ``ebnf`` sampling parameters)
can only emit text the constraint accepts, so an untrained model still produces valid actions.
Both forms accept exactly the canonical text of every action of the space (the one-line format
of :mod:`collective.base.actions`):

- a tool name, then its arguments in declared order, each after one space;
- an int in ``lo..hi`` in plain decimal (no sign on zero, no leading zeros); the range becomes a
  few digit-class alternatives, never an alternation of every number;
- a choice word, verbatim;
- a text argument: ``"``, at most ``max_chars`` characters other than ``"`` and newline, ``"``.

Only features that SGLang's grammar backends all read are used: groups, ``|``, character
classes, ``{m}`` and ``{m,n}`` repetition (SGLang docs, "Structured Outputs"; XGrammar's EBNF is
the GBNF dialect with repetition ranges).
"""

from __future__ import annotations

from collective.base.actions import ActionSpace, ArgSpec, ToolSpec

#: One digit position: the inclusive range of digits it may hold.
Digits = tuple[int, int]


def _same_length(lo: str, hi: str) -> list[list[Digits]]:
    """Digit-class sequences that together match exactly the digit strings lo..hi (same length,
    leading zeros allowed: these are suffixes of a longer number)."""
    n = len(lo)
    if lo == hi:
        return [[(int(c), int(c)) for c in lo]]
    if n == 1:
        return [[(int(lo), int(hi))]]
    if lo[0] == hi[0]:
        return [[(int(lo[0]), int(lo[0])), *rest] for rest in _same_length(lo[1:], hi[1:])]
    zeros, nines = "0" * (n - 1), "9" * (n - 1)
    out: list[list[Digits]] = []
    first, last = int(lo[0]), int(hi[0])
    if lo[1:] != zeros:  # the partial block at the bottom: lo[0] followed by lo[1:]..99..
        out += [[(first, first), *rest] for rest in _same_length(lo[1:], nines)]
        first += 1
    tail: list[list[Digits]] = []
    if hi[1:] != nines:  # the partial block at the top: hi[0] followed by 00..hi[1:]
        tail = [[(last, last), *rest] for rest in _same_length(zeros, hi[1:])]
        last -= 1
    if first <= last:  # the full blocks in between: any digits after the first
        out.append([(first, last)] + [(0, 9)] * (n - 1))
    return out + tail


def _naturals(lo: int, hi: int) -> list[list[Digits]]:
    """Digit-class sequences matching the canonical decimals of lo..hi (0 <= lo <= hi)."""
    out: list[list[Digits]] = []
    while lo <= hi:
        top = min(hi, 10 ** len(str(lo)) - 1)  # the largest number with as many digits as lo
        out += _same_length(str(lo), str(top))
        lo = top + 1
    return out


def int_alternatives(lo: int, hi: int) -> list[tuple[str, list[Digits]]]:
    """The canonical decimals of lo..hi as (sign, digit classes) alternatives."""
    if lo > hi:
        raise ValueError(f"empty integer range {lo}..{hi}")
    out: list[tuple[str, list[Digits]]] = []
    if lo < 0:  # the negatives -1..lo, written as "-" and a natural 1..-lo
        out += [("-", seq) for seq in _naturals(max(1, -hi), -lo)]
    if hi >= 0:
        out += [("", seq) for seq in _naturals(max(0, lo), hi)]
    return out


# -- regex ------------------------------------------------------------------------------------


def _regex_digits(seq: list[Digits]) -> str:
    out, i = [], 0
    while i < len(seq):
        a, b = seq[i]
        j = i
        while j + 1 < len(seq) and seq[j + 1] == (a, b):
            j += 1
        cls = str(a) if a == b else f"[{a}-{b}]"
        run = j - i + 1
        out.append(cls if run == 1 else cls * run if a == b else f"{cls}{{{run}}}")
        i = j + 1
    return "".join(out)


def _regex_word(word: str) -> str:
    # Choice words and tool names use letters, digits and _.:#/+- only (collective.base.actions);
    # of these only "." and "+" mean something in a regex outside a class.
    return word.replace(".", r"\.").replace("+", r"\+")


def _regex_arg(a: ArgSpec) -> str:
    if a.kind == "int":
        alts = [sign + _regex_digits(seq) for sign, seq in int_alternatives(a.lo, a.hi)]
        return alts[0] if len(alts) == 1 else "(" + "|".join(alts) + ")"
    if a.kind == "choice":
        words = [_regex_word(c) for c in a.choices]
        return words[0] if len(words) == 1 else "(" + "|".join(words) + ")"
    return '"' + r'[^"\n]' + f"{{0,{a.max_chars}}}" + '"'


def tool_regex(tool: ToolSpec) -> str:
    return " ".join([_regex_word(tool.name), *(_regex_arg(a) for a in tool.args)])


def action_regex(space: ActionSpace) -> str:
    """A regex whose full matches are exactly the canonical actions of ``space``."""
    return "(" + "|".join(tool_regex(t) for t in space.tools) + ")"


# -- EBNF -------------------------------------------------------------------------------------


def _ebnf_digits(seq: list[Digits]) -> str:
    return " ".join(f'"{a}"' if a == b else f"[{a}-{b}]" for a, b in seq)


def _ebnf_arg(a: ArgSpec) -> str:
    if a.kind == "int":
        alts = [
            (f'"-" {_ebnf_digits(seq)}' if sign else _ebnf_digits(seq))
            for sign, seq in int_alternatives(a.lo, a.hi)
        ]
        return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"
    if a.kind == "choice":
        words = [f'"{c}"' for c in a.choices]  # choice words never hold a quote or a backslash
        return words[0] if len(words) == 1 else "(" + " | ".join(words) + ")"
    return r'"\"" [^"\n]' + f"{{0,{a.max_chars}}}" + r' "\""'


def action_ebnf(space: ActionSpace) -> str:
    """An EBNF grammar (XGrammar/GBNF dialect, start rule ``root``) accepting exactly the
    canonical actions of ``space``; one rule per tool so a grammar stays readable."""
    rules = ["root ::= " + " | ".join(f"tool_{t.name}" for t in space.tools)]
    for t in space.tools:
        parts = [f'"{t.name}"'] + [f'" " {_ebnf_arg(a)}' for a in t.args]
        rules.append(f"tool_{t.name} ::= " + " ".join(parts))
    return "\n".join(rules)
