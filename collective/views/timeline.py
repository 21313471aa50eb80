"""An episode as activity over time: who was thinking, working or waiting, and what went where.

The event log says what was committed when; a viewer wants spans (a think from asked to answered,
a tool call from begun to landed), arrows (a message from the turn that sent it to the turn that
read it) and tracks (channels, the archive, mailbox depths). :func:`activity` derives them in one
pass over the log and yields them in log order, so a writer can stream them out: per track, every
item comes in time order, a span closes after everything inside it, and an arrow's head comes
after its tail and right after the span it points into opened. The trace export
(``collective.views.trace``) and the swimlane picture (``collective.views.swimlane``) both read it,
so they
cannot disagree about what happened.

Every delivered message gets exactly one arrow: into the think that read it, or into the mark
where it was lost (evicted from a full mailbox, or still unread when its reader was fired or the
episode ended). A message dropped before delivery has no receiver: it is a mark on the sender's
track. A post's arrow goes to its channel (broadcast is a subscription: who later read it is not
in the record, and drawing one arrow per subscriber would be quadratic). The world's own events,
its posts and a world error are on a ``world`` track and the channel's, with no arrows (``by``
is ``"world"``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from collective.base.primitives import PRIMITIVES
from collective.records import (
    AnyEvent,
    Asked,
    Began,
    Committed,
    Delivered,
    Dropped,
    Ended,
    Episode,
    EpisodeStream,
    Failed,
    Fired,
    Happened,
    Hired,
    Posted,
    Rejected,
    Sent,
    Spawned,
    Thought,
    TurnFinder,
)

# What a span on an agent's track is: its whole life, a think, or an action of one of the three
# kinds the picture colours differently.
LIFE, THINK, WORK, COMM, WAIT = "life", "think", "work", "comm", "wait"


def action_kind(tool: str) -> str:
    """``work`` for a world tool, ``wait`` for waiting, ``comm`` for the other primitives."""
    if tool == "wait":
        return WAIT
    return COMM if tool in PRIMITIVES else WORK


@dataclass(slots=True)
class Open:
    """A span opens on an agent's track; it nests inside the span open there before it."""

    agent: int
    t: float
    kind: str
    name: str
    args: dict[str, Any]


@dataclass(slots=True)
class Close:
    """The innermost open span of an agent ends (its args add to the Open's)."""

    agent: int
    t: float
    kind: str
    name: str
    args: dict[str, Any]


@dataclass(slots=True)
class Mark:
    """Something instantaneous on an agent's track: a rejected action, a lost message."""

    agent: int
    t: float
    name: str
    args: dict[str, Any]


@dataclass(slots=True)
class Board:
    """Activity on a shared track: a channel (``#all``) or the archive."""

    track: str
    t: float
    name: str
    args: dict[str, Any]


@dataclass(slots=True)
class ArrowOut:
    """An arrow's tail, inside the sender's open span (a message, a post, a hire)."""

    id: int
    kind: str  # "msg", "post", "hire"
    agent: int
    t: float
    to: int | str  # the receiving agent, or the channel


@dataclass(slots=True)
class ArrowIn:
    """An arrow's head: in the receiving agent's span (or mark) that just opened, or in the
    channel's ``Board`` item just yielded."""

    id: int
    kind: str
    to: int | str
    t: float
    sender: int


@dataclass(slots=True)
class Depth:
    """An agent's mailbox now holds ``depth`` unread messages."""

    agent: int
    t: float
    depth: int


Item = Open | Close | Mark | Board | ArrowOut | ArrowIn | Depth


@dataclass(slots=True)
class _Agent:
    role: str
    stack: list[tuple[str, str]] = field(default_factory=list)  # open (kind, name), innermost last
    inbox: dict[int, None] = field(default_factory=dict)  # unread message ids, oldest first
    acting: tuple[int, str] | None = None  # the begun action: (act, text)
    busy_until: float = -1.0  # hybrid: the tool's real work keeps its span open until then
    landed: dict[str, Any] = field(default_factory=dict)  # ... and its result closes it


def _arg(text: str) -> str:
    """The argument of a one-argument action (``read all``, ``search "k1 key"``)."""
    _, _, rest = text.partition(" ")
    return rest.strip().strip('"')


def activity(
    ep: Episode | EpisodeStream, events: Iterable[AnyEvent] | None = None
) -> Iterator[Item]:
    """The episode's spans, marks, arrows and counters, in log order (see the module doc).

    ``events``: the episode's events as they should be read (a progress bar wrapping them)."""
    reader = _Reader(TurnFinder(ep.turns))  # the turns read alongside the events, not held whole
    for e in ep.events if events is None else events:
        yield from reader.read(e)


class _Reader:
    """What the log has said so far, as ``activity`` reads it one event at a time: each agent's
    open spans and unread mail, the messages sent but not yet delivered, the arrows drawn. One
    method per kind of event turns it into its items; the kinds with none (``Woke``) have no
    method."""

    def __init__(self, turns: TurnFinder) -> None:
        self.turns = turns
        self.agents: dict[int, _Agent] = {}
        self.sent: dict[int, Sent] = {}  # messages sent, before they are delivered or dropped
        self.mail: dict[int, tuple[int, int]] = {}  # delivered, unread: id -> (arrow, sender)
        self.arrows = 0
        # Each event class is a leaf of the schema, so its exact type picks its method.
        self.on: dict[type, Callable[[Any], Iterable[Item]]] = {
            Spawned: self.spawned,
            Asked: self.asked,
            Thought: self.thought,
            Began: self.began,
            Rejected: self.rejected,
            Committed: self.committed,
            Sent: self.sent_,
            Delivered: self.delivered,
            Dropped: self.dropped,
            Posted: self.posted,
            Happened: self.happened,
            Failed: self.failed,
            Hired: self.hired,
            Fired: self.fired,
            Ended: self.ended,
        }

    def read(self, e: AnyEvent) -> Iterable[Item]:
        """The items event ``e`` adds, in order."""
        on = self.on.get(type(e))
        return () if on is None else on(e)

    # -- an agent's track ------------------------------------------------------------------

    def close(self, agent: int, t: float, args: dict[str, Any]) -> Close:
        kind, name = self.agents[agent].stack.pop()
        return Close(agent, t, kind, name, args)

    def settle(self, agent: int, t: float) -> Iterator[Item]:
        """A hybrid tool's span ends when its real work does, before anything later on its
        track; if the agent's life ends first, the span ends with it."""
        a = self.agents[agent]
        if 0 <= a.busy_until <= t:
            yield self.close(agent, a.busy_until, a.landed)
            a.busy_until = -1.0

    def lost(self, agent: int, t: float, reason: str) -> Iterator[Item]:
        """Every message still unread in an agent's mailbox ends here, with an arrow to a mark."""
        inbox = self.agents[agent].inbox
        for m in inbox:
            arrow, sender = self.mail.pop(m)
            yield Mark(agent, t, "unread", {"message": m, "from": sender, "reason": reason})
            yield ArrowIn(arrow, "msg", agent, t, sender)
        if inbox:
            inbox.clear()
            yield Depth(agent, t, 0)

    def end_life(self, agent: int, t: float, reason: str) -> Iterator[Item]:
        a = self.agents[agent]
        if a.busy_until >= 0:
            yield self.close(agent, min(a.busy_until, t), a.landed)
            a.busy_until = -1.0
        yield from self.lost(agent, t, reason)
        while a.stack:
            yield self.close(agent, t, {"cut": reason} if len(a.stack) > 1 else {"end": reason})

    # -- the events ------------------------------------------------------------------------

    def spawned(self, e: Spawned) -> Iterator[Item]:
        self.agents[e.agent] = _Agent(e.role, [(LIFE, f"agent {e.agent}")])
        yield Open(e.agent, e.t, LIFE, f"agent {e.agent}", {"role": e.role, "hired_by": e.by})

    def asked(self, e: Asked) -> Iterator[Item]:
        yield from self.settle(e.agent, e.t)
        a = self.agents[e.agent]
        tr = self.turns.pop((e.agent, e.turn))
        args: dict[str, Any] = {"turn": e.turn, "read": list(e.read)}
        if tr is not None and tr.prompt:
            args["prompt"] = tr.prompt
        a.stack.append((THINK, "think"))
        yield Open(e.agent, e.t, THINK, "think", args)
        for m in e.read:
            arrow, sender = self.mail.pop(m)
            del a.inbox[m]
            yield ArrowIn(arrow, "msg", e.agent, e.t, sender)
        if e.read:
            yield Depth(e.agent, e.t, len(a.inbox))

    def thought(self, e: Thought) -> Iterator[Item]:
        yield self.close(
            e.agent,
            e.t,
            {
                "text": e.text,
                "output_tokens": e.output_tokens,
                "prompt_tokens": e.prompt_tokens,
                "version": e.version,
            },
        )

    def began(self, e: Began) -> Iterator[Item]:
        yield from self.settle(e.agent, e.t)
        tool = e.text.split(" ", 1)[0]
        kind = action_kind(tool)
        self.agents[e.agent].acting = (e.act, e.text)
        self.agents[e.agent].stack.append((kind, tool))
        until = e.until if e.until >= 0 else "a message"
        yield Open(e.agent, e.t, kind, tool, {"text": e.text, "until": until})

    def rejected(self, e: Rejected) -> Iterator[Item]:
        yield from self.settle(e.agent, e.t)
        yield Mark(e.agent, e.t, "rejected", {"text": e.text, "error": e.error})

    def committed(self, e: Committed) -> Iterator[Item]:
        a = self.agents[e.agent]
        result = {"tool": e.tool, "ok": e.ok, "result": e.result}
        if a.acting is None or a.acting[0] != e.act:  # failed before it could begin
            yield Mark(e.agent, e.t, "tool error", result)
            return
        text = a.acting[1]
        a.acting = None
        if e.tool == "read":
            yield Board(f"#{_arg(text)}", e.t, "read", {"by": e.agent, "result": e.result})
        elif e.tool in ("put", "search"):
            yield Board("archive", e.t, e.tool, {"by": e.agent, "text": _arg(text), **result})
        if e.real > 0:  # hybrid: the agent is busy with the real work until t + real
            a.busy_until, a.landed = e.t + e.real, {**result, "real_seconds": e.real}
        else:
            yield self.close(e.agent, e.t, result)

    def sent_(self, e: Sent) -> Iterable[Item]:
        self.sent[e.msg] = e
        return ()

    def delivered(self, e: Delivered) -> Iterator[Item]:
        s = self.sent.pop(e.msg)
        self.arrows += 1
        self.mail[e.msg] = (self.arrows, s.agent)
        self.agents[e.to].inbox[e.msg] = None
        yield ArrowOut(self.arrows, "msg", s.agent, e.t, e.to)
        yield Depth(e.to, e.t, len(self.agents[e.to].inbox))

    def dropped(self, e: Dropped) -> Iterator[Item]:
        if e.reason == "evicted":  # delivered earlier, pushed out of the full mailbox now
            arrow, sender = self.mail.pop(e.msg)
            del self.agents[e.to].inbox[e.msg]
            yield from self.settle(e.to, e.t)
            yield Mark(e.to, e.t, "evicted", {"message": e.msg, "from": sender})
            yield ArrowIn(arrow, "msg", e.to, e.t, sender)
            yield Depth(e.to, e.t, len(self.agents[e.to].inbox))
        else:
            s = self.sent.pop(e.msg)
            yield Mark(
                e.agent,
                e.t,
                "dropped",
                {"message": e.msg, "to": e.to, "text": s.text, "reason": e.reason},
            )

    def posted(self, e: Posted) -> Iterator[Item]:
        channel = f"#{e.channel}"
        if e.agent < 0:  # the world's post: no agent sent it, so no arrow
            yield Board(channel, e.t, "post", {"by": "world", "message": e.msg, "text": e.text})
            return
        self.arrows += 1
        yield ArrowOut(self.arrows, "post", e.agent, e.t, channel)
        yield Board(channel, e.t, "post", {"by": e.agent, "message": e.msg, "text": e.text})
        yield ArrowIn(self.arrows, "post", channel, e.t, e.agent)

    def happened(self, e: Happened) -> Iterator[Item]:
        yield Board("world", e.t, e.call, {"by": "world", "group": e.group})

    def failed(self, e: Failed) -> Iterator[Item]:
        args = {"by": "world", "method": e.method, "error": e.error, "where": e.where}
        yield Board("world", e.t, "world error", args)

    def hired(self, e: Hired) -> Iterator[Item]:
        self.arrows += 1
        yield ArrowOut(self.arrows, "hire", e.agent, e.t, e.new)
        yield ArrowIn(self.arrows, "hire", e.new, e.t, e.agent)

    def fired(self, e: Fired) -> Iterator[Item]:
        yield from self.end_life(e.target, e.t, f"fired by {e.agent}")

    def ended(self, e: Ended) -> Iterator[Item]:
        for agent in sorted(self.agents):
            if self.agents[agent].stack:
                yield from self.end_life(agent, e.t, e.reason)


@dataclass(slots=True)
class Batch:
    """One policy batch: the requests of one policy asked at one instant (the conductor sends
    everyone thinking at an instant as one batch; the record keeps when each was asked)."""

    policy: str
    asked: float
    answered: float  # when its last answer landed
    turns: list[tuple[int, int]]  # (agent, turn) of each request, in agent order
    prompt_tokens: int
    output_tokens: int


def policy_batches(ep: Episode | EpisodeStream) -> list[Batch]:
    """The episode's policy batches, in the order they were sent."""
    by_key: dict[tuple[float, str], Batch] = {}
    for tr in ep.turns:
        b = by_key.get((tr.asked, tr.policy))
        if b is None:
            b = by_key[(tr.asked, tr.policy)] = Batch(tr.policy, tr.asked, tr.answered, [], 0, 0)
        b.turns.append((tr.agent, tr.turn))
        b.answered = max(b.answered, tr.answered)
        b.prompt_tokens += tr.prompt_tokens
        b.output_tokens += len(tr.token_ids)
    for b in by_key.values():
        b.turns.sort()
    return sorted(by_key.values(), key=lambda b: (b.asked, b.policy))
