"""The communication primitives, declared once: name, kind, what each argument may be, the line
a prompt shows, and what each needs or touches.

Organisations choose among them by name (``Organisation.primitives``), the cast turns the
chosen ones into a role's tool specs (which the parser validates against and policies sample
from, with the docs as their prompt lines), a world may not name a tool after one, and the
trainer tells communication from useful work by them. Their effects live in
``collective.engine.comms`` (messages, channels, archive) and ``collective.engine.cast`` (hire,
fire).
"""

from __future__ import annotations

from dataclasses import dataclass

from collective.base.actions import ArgSpec, ToolKind, ToolSpec


@dataclass(frozen=True, slots=True)
class Primitive:
    name: str
    kind: ToolKind  # "comm", or "wait" (neither work nor communication)
    doc: str
    on_channel: bool = False  # needs a channel: absent for a role that has none
    hiring: bool = False  # only for roles that may hire
    heard: bool = False  # may change the world's state (it hears messages; hires join it)


PRIMITIVES: dict[str, Primitive] = {
    p.name: p
    for p in (
        Primitive("msg", "comm", "send a direct message", heard=True),
        Primitive("post", "comm", "post on a channel", on_channel=True, heard=True),
        Primitive("read", "comm", "read a channel", on_channel=True),
        Primitive("put", "comm", "save a note to the archive"),
        Primitive("search", "comm", "search the archive"),
        Primitive("wait", "wait", "wait for a message (0 = until one comes)"),
        Primitive("hire", "comm", "hire an agent", hiring=True, heard=True),
        Primitive("fire", "comm", "fire an agent you hired", hiring=True, heard=True),
    )
}
NAMES = tuple(PRIMITIVES)  # in the order action spaces list them
BASIC = tuple(n for n, p in PRIMITIVES.items() if not p.hiring)  # what every role has


def primitive_specs(
    names: tuple[str, ...],
    *,
    id_limit: int,
    channels: tuple[str, ...],
    hire_roles: tuple[str, ...],
    max_wait: int,
    words: tuple[str, ...],
) -> tuple[ToolSpec, ...]:
    """The tool specs of ``names`` for one role: agents ``0..id_limit-1`` may be addressed,
    ``channels`` are its channels, ``words`` the worlds' lexicon (a suggested vocabulary)."""
    text = ArgSpec("text", "text", max_chars=80, words=words)
    args: dict[str, tuple[ArgSpec, ...]] = {
        "msg": (ArgSpec("to", "int", lo=0, hi=id_limit - 1), text),
        "post": (ArgSpec("channel", "choice", choices=channels), text),
        "read": (ArgSpec("channel", "choice", choices=channels),),
        "put": (text,),
        "search": (ArgSpec("query", "text", max_chars=40, words=words),),
        "wait": (ArgSpec("seconds", "int", lo=0, hi=max_wait),),
        "hire": (ArgSpec("role", "choice", choices=hire_roles or ("none",)),),
        "fire": (ArgSpec("agent", "int", lo=0, hi=id_limit - 1),),
    }
    out = []
    for name in names:
        p = PRIMITIVES[name]
        if p.on_channel and not channels:
            continue
        out.append(ToolSpec(name, args[name], p.kind, p.doc))
    return tuple(out)
