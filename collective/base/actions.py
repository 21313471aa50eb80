"""What an agent may do, as data: action spaces and the one text format of an action.

A world declares tools with typed, bounded arguments; the engine adds its communication
primitives. Together they form an :class:`ActionSpace`, a plain value that every policy turns
into its own sampling constraint (the random policy samples from it, the tiny model compiles it
to a token mask, SGLang receives it as a regex), and that the conductor uses, once, at the
boundary, to validate the text a policy produced.

An action is one line: the tool name, then its arguments in declared order, separated by single
spaces; a text argument is double-quoted and comes last::

    work 3
    msg 2 "m4 needs key k1"
    wait 30
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

ArgKind = Literal["int", "choice", "text"]
ToolKind = Literal["world", "comm", "wait"]

_CHOICE_RE = re.compile(r"^[A-Za-z0-9_.:#/+-]+$")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_INT_RE = re.compile(r"^-?[0-9]+$")


class ArgSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One argument's machine-readable domain."""

    name: str
    kind: ArgKind
    lo: int = 0  # int: inclusive bounds
    hi: int = 0
    choices: tuple[str, ...] = ()  # choice: the allowed words
    max_chars: int = 0  # text: longest allowed content
    words: tuple[str, ...] = ()  # text: a suggested vocabulary (the random policy draws from it)

    def check(self, where: str) -> None:
        if self.kind == "int" and self.lo > self.hi:
            raise ValueError(
                f"{where}: argument {self.name!r} has an empty range {self.lo}..{self.hi}"
            )
        if self.kind == "choice":
            if not self.choices:
                raise ValueError(f"{where}: argument {self.name!r} has no choices")
            for c in self.choices:
                if not _CHOICE_RE.match(c):
                    raise ValueError(
                        f"{where}: choice {c!r} of argument {self.name!r} must be one word "
                        "of letters, digits and _.:#/+-"
                    )
        if self.kind == "text" and self.max_chars <= 0:
            raise ValueError(f"{where}: text argument {self.name!r} needs max_chars > 0")

    def size(self) -> int | None:
        """How many values the argument can take (None for free text)."""
        if self.kind == "int":
            return self.hi - self.lo + 1
        if self.kind == "choice":
            return len(self.choices)
        return None


class ToolSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A tool as a policy sees it: name, arguments, and what kind of act it is.

    ``kind`` feeds the signs-of-life metrics: ``world`` tools are useful work, ``comm`` tools are
    communication, ``wait`` is neither.
    """

    name: str
    args: tuple[ArgSpec, ...] = ()
    kind: ToolKind = "world"
    doc: str = ""

    def check(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"tool name {self.name!r} must be lowercase letters, digits and _")
        for i, a in enumerate(self.args):
            a.check(f"tool {self.name!r}")
            if a.kind == "text" and i != len(self.args) - 1:
                raise ValueError(f"tool {self.name!r}: text argument {a.name!r} must come last")

    def usage(self) -> str:
        parts = [self.name]
        for a in self.args:
            if a.kind == "int":
                parts.append(f"<{a.name}:{a.lo}..{a.hi}>")
            elif a.kind == "choice":
                shown = "|".join(a.choices[:6]) + ("|..." if len(a.choices) > 6 else "")
                parts.append(f"<{a.name}:{shown}>")
            else:
                parts.append(f'"<{a.name}, at most {a.max_chars} chars>"')
        return " ".join(parts)


class ActionSpace(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Every action one agent may take at one moment; hashable, so policies can cache on it."""

    tools: tuple[ToolSpec, ...]

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"action space has duplicate tool names: {sorted(names)}")
        for t in self.tools:
            t.check()

    def tool(self, name: str) -> ToolSpec | None:
        for t in self.tools:
            if t.name == name:
                return t
        return None

    def describe(self) -> str:
        """A compact listing, for prompts of models that need to be told the tools."""
        return "\n".join(t.usage() + (f"  # {t.doc}" if t.doc else "") for t in self.tools)


class Action(msgspec.Struct, frozen=True):
    """A parsed, validated action: the tool and its typed arguments."""

    tool: str
    args: tuple[int | str, ...] = ()
    kind: ToolKind = "world"


class ActionError(ValueError):
    """The text is not a valid action in this space; the message says why, for the agent."""


def _split(text: str) -> list[str]:
    """Split on single spaces, keeping a trailing double-quoted text argument whole."""
    q = text.find('"')
    if q < 0:
        return text.split(" ")
    head, quoted = text[:q], text[q:]
    if len(quoted) < 2 or not quoted.endswith('"') or '"' in quoted[1:-1]:
        raise ActionError(f"malformed action {text!r}: a text argument is one double-quoted string")
    if head and not head.endswith(" "):
        raise ActionError(f"malformed action {text!r}: put a space before the quoted text")
    return [*head[:-1].split(" "), quoted] if head else [quoted]


def parse_action(text: str, space: ActionSpace) -> Action:
    """Validate ``text`` against ``space`` and return the typed action, or raise ActionError."""
    text = text.strip()
    if not text:
        raise ActionError("empty action")
    if "\n" in text:
        raise ActionError(f"malformed action {text[:60]!r}: an action is one line")
    words = _split(text)
    spec = space.tool(words[0])
    if spec is None:
        names = ", ".join(t.name for t in space.tools)
        raise ActionError(f"unknown tool {words[0]!r}; the tools are: {names}")
    given = words[1:]
    if len(given) != len(spec.args):
        raise ActionError(f"{spec.name} takes {len(spec.args)} argument(s): {spec.usage()}")
    args: list[int | str] = []
    for a, w in zip(spec.args, given, strict=True):
        if a.kind == "int":
            if not _INT_RE.match(w):
                raise ActionError(f"{spec.name}: {a.name} must be an integer, got {w!r}")
            if len(w) > 24:  # longer than any bound: refuse before int() (4,300 digits raise)
                raise ActionError(
                    f"{spec.name}: {a.name} must be in {a.lo}..{a.hi}, got {w[:24]}..."
                )
            v = int(w)
            if not a.lo <= v <= a.hi:
                raise ActionError(f"{spec.name}: {a.name} must be in {a.lo}..{a.hi}, got {v}")
            args.append(v)
        elif a.kind == "choice":
            if w not in a.choices:
                raise ActionError(
                    f"{spec.name}: {a.name} must be one of {list(a.choices)}, got {w!r}"
                )
            args.append(w)
        else:
            if not (len(w) >= 2 and w[0] == '"' and w[-1] == '"'):
                raise ActionError(f"{spec.name}: {a.name} must be double-quoted text")
            content = w[1:-1]
            if len(content) > a.max_chars:
                raise ActionError(
                    f"{spec.name}: {a.name} is {len(content)} chars, at most {a.max_chars}"
                )
            args.append(content)
    return Action(spec.name, tuple(args), spec.kind)


def format_action(tool: str, *args: int | str, space: ActionSpace | None = None) -> str:
    """The canonical text of an action; with ``space``, text arguments are quoted by their spec."""
    spec = space.tool(tool) if space is not None else None
    out = [tool]
    for i, v in enumerate(args):
        is_text = (
            spec.args[i].kind == "text"
            if spec is not None and i < len(spec.args)
            else isinstance(v, str) and (" " in v or v == "")
        )
        out.append(f'"{v}"' if is_text else str(v))
    return " ".join(out)


_longest: dict[int, tuple[ActionSpace, int]] = {}


def longest_action(space: ActionSpace) -> int:
    """The length in characters of the longest valid action of ``space``: a longer answer is
    invalid whatever it says (padding included), and the record keeps no more of it than this
    (plus one). Cached by identity: the conductor asks for every answer."""
    hit = _longest.get(id(space))
    if hit is not None and hit[0] is space:
        return hit[1]

    def width(a: ArgSpec) -> int:
        if a.kind == "int":
            return max(len(str(a.lo)), len(str(a.hi)))
        if a.kind == "choice":
            return max(map(len, a.choices))
        return a.max_chars + 2  # the quotes

    n = max((len(t.name) + sum(1 + width(a) for a in t.args) for t in space.tools), default=0)
    if len(_longest) >= 4096:
        _longest.clear()
    _longest[id(space)] = (space, n)  # the space is kept, so its id is not reused meanwhile
    return n
