"""An episode as text a person reads, one event a line (``collective show``, ``collective diff``).

A view like the timeline and the trace: it reads records only. Every line is one line: what an
event quotes is escaped, its line breaks too (:func:`collective.base.outputs.printable`).
"""

from __future__ import annotations

from typing import Any

from collective.base.outputs import printable
from collective.records import (
    Asked,
    Began,
    Committed,
    Delivered,
    Dropped,
    Ended,
    Failed,
    Fired,
    Happened,
    Hired,
    Posted,
    Rejected,
    Sent,
    Spawned,
    Thought,
    Woke,
    failure_text,
)


def describe(e: Any, exact: bool = False) -> str:
    """One event as a line a person reads (one line: what it quotes is escaped, its line
    breaks too); with ``exact``, times as stored (to the last bit), not to the millisecond."""
    return printable(_describe(e, exact))


def _describe(e: Any, exact: bool) -> str:
    who = f"agent {e.agent}"

    def at(x: float) -> str:
        return repr(x) if exact else f"{x:.3f}"

    match e:
        case Spawned(role=role, by=by):
            return f"{who} starts as {role}" + (f" (hired by {by})" if by >= 0 else "")
        case Asked(turn=turn, read=read):
            return f"{who} thinks (turn {turn}" + (
                f", read messages {list(read)})" if read else ")"
            )
        case Thought(text=text, asked=asked, output_tokens=n, version=v):
            return f"{who} decides: {text}   [{n} tokens, asked at {at(asked)}, v{v}]"
        case Began(text=text, until=until):
            end = "until a message" if until < 0 else f"until {at(until)}"
            return f"{who} begins: {text}   ({end})"
        case Rejected(text=text, error=err):
            return f"{who} REJECTED {text!r}: {err}"
        case Committed(tool=tool, ok=ok, result=result, real=real):
            extra = f"   (real {at(real)}s)" if real else ""
            return f"{who} {tool} {'->' if ok else 'FAILED ->'} {result}{extra}"
        case Sent(to=to, text=text, msg=m):
            return f"{who} -> agent {to}: {text!r}   (message {m})"
        case Delivered(to=to, msg=m):
            return f"message {m} delivered to agent {to}"
        case Dropped(to=to, msg=m, reason=reason):
            return f"message {m} to agent {to} DROPPED: {reason}"
        case Posted(channel=ch, text=text):
            return f"{who if e.agent >= 0 else 'the world'} posts on #{ch}: {text!r}"
        case Hired(new=new, role=role):
            return f"{who} hires agent {new} as {role}"
        case Fired(target=target):
            return f"{who} fires agent {target}"
        case Woke(reason=reason):
            return f"{who} wakes: {reason}"
        case Happened(call=call, group=group):
            return f"world {'' if group == 0 else f'(group {group}) '}event: {call}"
        case Failed(world=world, method=method, error=error, where=where):
            return f"WORLD ERROR: {failure_text(world, method, e.agent, error, where)}"
        case Ended(reason=reason, score=score):
            return f"episode ends ({reason}), score {score:.4f}"
    return repr(e)
