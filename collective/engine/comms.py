"""Communication: messages, channels, the archive, and the rules of each. All bounded.

One home for a message's rules: who may message whom (the organisation's permission), where a
delivery is stored (the recipient's mailbox, bounded, with its overflow policy), how a post is
kept (once, in its channel; each subscriber keeps a cursor into it, so posting costs O(1)
whatever the number of subscribers), how an agent's prompt shows what arrived, and which events
record it all. :class:`Comms` never calls back into the episode: each primitive returns an
:class:`Outcome` (its result, its events, whom the world hears and whom to wake) that the
episode applies in that order. Its state is mutated only by the conductor while every actor is
parked, so it needs no locks.
"""

from __future__ import annotations

import heapq
import re
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from collective.engine.organisation import Organisation
from collective.records import Delivered, Dropped, EpisodeConfig, Event, Posted, Sent, Stats

_WORD = re.compile(r"[a-z0-9]+")
_ID_BITS = 48  # note ids stay far below 2**48 in any episode
_ID_MASK = (1 << _ID_BITS) - 1
NEWS_LIMIT = 8  # posts per channel a prompt shows at most; the rest are counted as missed


def sender_name(sender: int) -> str:
    """How a post's sender reads in a prompt: an agent's id, or ``world`` (``World.post``)."""
    return str(sender) if sender >= 0 else "world"


@dataclass(slots=True, frozen=True)
class Message:
    id: int
    t: float
    sender: int
    text: str


@dataclass(slots=True)
class Channel:
    """A public board keeping its last ``capacity`` posts, numbered by a running sequence."""

    name: str
    capacity: int
    posts: deque[Message] = field(default_factory=deque)
    next_seq: int = 0  # sequence number of the next post
    waiting: set[int] = field(default_factory=set)  # subscribers parked in `wait`

    def post(self, msg: Message) -> None:
        self.posts.append(msg)
        self.next_seq += 1
        if len(self.posts) > self.capacity:
            self.posts.popleft()

    def since(self, cursor: int, limit: int) -> tuple[list[Message], int, int]:
        """Posts from sequence ``cursor`` on, at most ``limit`` of the newest.

        Returns (posts, new cursor, how many were missed because history rolled over or
        because more than ``limit`` were waiting).
        """
        first = self.next_seq - len(self.posts)
        missed = max(0, first - cursor)
        start = max(cursor, first)
        n = self.next_seq - start
        if n > limit:
            missed += n - limit
            start = self.next_seq - limit
        items = list(self.posts)[start - first :] if n else []
        return items, self.next_seq, missed


@dataclass(slots=True)
class Archive:
    """Notes that outlive messages: ``put`` stores one, ``search`` ranks by shared words.

    An inverted index (word -> ids of the notes holding it) answers a search by touching only
    the notes that share a word with the query, not every note kept; it is bounded with the
    archive, since an evicted note leaves the index too.
    """

    capacity: int
    entries: deque[tuple[int, int, str, frozenset[str]]] = field(default_factory=deque)
    next_id: int = 0
    evicted: int = 0
    index: dict[str, set[int]] = field(default_factory=dict)

    def put(self, author: int, text: str) -> int:
        nid = self.next_id
        self.next_id += 1
        words = frozenset(_WORD.findall(text.lower()))
        self.entries.append((nid, author, text, words))
        for w in words:
            self.index.setdefault(w, set()).add(nid)
        if len(self.entries) > self.capacity:
            old, _, _, old_words = self.entries.popleft()
            for w in old_words:
                holders = self.index[w]
                holders.discard(old)
                if not holders:
                    del self.index[w]
            self.evicted += 1
        return nid

    def search(self, query: str, k: int = 3) -> list[tuple[int, int, str]]:
        """The ``k`` entries sharing most words with the query; ties go to the newest."""
        shared: Counter[int] = Counter()
        for w in frozenset(_WORD.findall(query.lower())):
            shared.update(self.index.get(w, ()))
        # Most shared words first, then the newest: one int per hit, (count, id), compared in C.
        best = heapq.nlargest(k, [(n << _ID_BITS) | nid for nid, n in shared.items()])
        first = self.entries[0][0] if self.entries else 0  # ids are consecutive in the deque
        return [self.entries[(key & _ID_MASK) - first][:3] for key in best]


class Member(Protocol):
    """What communication reads and keeps of an agent (``collective.engine.actor.Actor``): who it
    is,
    where, its mailbox (made on first delivery), its channel cursors, whether it waits."""

    id: int
    role: str
    group: int
    local: int
    alive: bool
    waiting: bool
    acts: int
    inbox: deque[Message] | None
    cursors: dict[str, int]
    missed: int
    read_ids: tuple[int, ...]


# The episode's kind of member (``Actor``): what ``Outcome.wake`` hands back to it.
M = TypeVar("M", bound=Member)


@dataclass(slots=True)
class Outcome(Generic[M]):
    """What a primitive did, for the episode to apply in this order: log ``events``; let the
    sender's world hear ``heard`` (recipient's local id or None for a post, and the text); wake
    each of ``wake`` that is still waiting then (the world may have woken it while hearing)."""

    ok: bool
    result: str
    events: list[Event] = field(default_factory=list)
    heard: tuple[int | None, str] | None = None
    wake: list[tuple[M, str]] = field(default_factory=list)


class Comms(Generic[M]):
    """The communication primitives of one episode: ``msg``, ``post``, ``read``, ``put`` and
    ``search``, with the mailboxes, channels and archive they use.

    ``actors`` is the episode's table of agents by id (read only here: a message's recipient);
    ``stats`` is the episode's, whose communication counters only this class moves.
    """

    def __init__(
        self, cfg: EpisodeConfig, org: Organisation, actors: dict[int, M], stats: Stats
    ) -> None:
        self.cfg = cfg
        self.org = org
        self.actors = actors
        self.stats = stats
        self.channels: dict[str, Channel] = {}
        self.archive = Archive(cfg.archive_size)
        self.next_msg = 0
        self.posted = 0  # posts on any channel, the world's included: none, and no prompt has news

    def channel(self, name: str) -> Channel:
        ch = self.channels.get(name)
        if ch is None:
            ch = self.channels[name] = Channel(name, self.cfg.channel_history)
        return ch

    # -- the primitives ---------------------------------------------------------------------------

    def send(self, now: float, sender: Member, to: int, text: str) -> Outcome[M]:
        """``msg``: into the recipient's mailbox if the organisation allows it and the mailbox
        has room (or, evicting the oldest, makes room)."""
        msg_id = self.next_msg
        self.next_msg += 1
        self.stats.sent += 1
        events: list[Event] = [Sent(now, sender.id, msg_id, to, text)]
        recipient = self.actors.get(to)
        reason = ""
        if recipient is None or not recipient.alive:
            reason = "no_such_agent"
        elif not self.org.may_message(sender.group, recipient.group):
            reason = "not_allowed"
        elif recipient.inbox is not None and len(recipient.inbox) >= self.cfg.mailbox:
            if self.cfg.overflow == "drop_newest":
                reason = "mailbox_full"
            else:
                old = recipient.inbox.popleft()
                self.stats.evicted += 1
                events.append(Dropped(now, old.sender, old.id, to, "evicted"))
        if reason:
            self.stats.dropped += 1
            events.append(Dropped(now, sender.id, msg_id, to, reason))
            return Outcome(False, f"message to {to} dropped: {reason.replace('_', ' ')}", events)
        assert recipient is not None
        if recipient.inbox is None:
            recipient.inbox = deque()
        recipient.inbox.append(Message(msg_id, now, sender.id, text))
        self.stats.delivered += 1
        events.append(Delivered(now, sender.id, msg_id, to))
        heard = (recipient.local, text) if recipient.group == sender.group else None
        return Outcome(
            True, f"delivered to {to}", events, heard, [(recipient, f"message from {sender.id}")]
        )

    def post(self, now: float, sender: int, name: str, text: str) -> Outcome[M]:
        """``post`` (and ``World.post``, sender -1): stored once in the channel; its waiting
        subscribers are woken in id order, the sender never."""
        channel = self.channel(name)
        msg = Message(self.next_msg, now, sender, text)
        self.next_msg += 1
        channel.post(msg)
        self.posted += 1
        if sender >= 0:  # the world's posts are not agents' posts
            self.stats.posts += 1
        reason = f"post on #{channel.name}"
        wake = [(self.actors[w], reason) for w in sorted(channel.waiting) if w != sender]
        events: list[Event] = [Posted(now, sender, msg.id, channel.name, text)]
        heard = (None, text) if sender >= 0 else None  # the world does not hear itself
        return Outcome(True, f"posted on #{channel.name}", events, heard, wake)

    def read(self, name: str) -> Outcome[M]:
        channel = self.channel(name)
        posts = list(channel.posts)[-5:]
        if not posts:
            return Outcome(True, f"#{channel.name} is empty")
        return Outcome(True, " | ".join(f"[{sender_name(p.sender)}] {p.text}" for p in posts))

    def put(self, author: int, text: str) -> Outcome[M]:
        return Outcome(True, f"saved as note {self.archive.put(author, text)}")

    def search(self, query: str) -> Outcome[M]:
        hits = self.archive.search(query)
        if not hits:
            return Outcome(True, "no notes match")
        return Outcome(True, " | ".join(f"note {nid} by {a}: {text}" for nid, a, text in hits))

    # -- what an agent sees, and waiting for it ---------------------------------------------------

    def unread(self, actor: Member) -> list[str]:
        """The prompt's lines for what arrived since the agent's last turn: its mailbox, then
        each channel's new posts but its own. Reading consumes the mailbox and moves the
        channel cursors; the ids read are kept on the actor (``read_ids``) to travel with its
        next request, so the conductor logs the reads in canonical order, and the posts rolled
        past are counted (``missed``)."""
        lines = []
        read: tuple[int, ...] = ()
        if actor.inbox:
            lines.append("inbox: " + " | ".join(f"[{m.sender}] {m.text}" for m in actor.inbox))
            read = tuple(m.id for m in actor.inbox)
            actor.inbox.clear()
        cursors = actor.cursors
        for name in self.org.channels(actor.role, actor.group):
            channel = self.channels.get(name)
            if channel is None or channel.next_seq == cursors.get(name, 0):
                continue
            posts, cursors[name], missed = channel.since(cursors.get(name, 0), NEWS_LIMIT)
            actor.missed += missed  # counted by the conductor with the next request
            mine = [p for p in posts if p.sender != actor.id]
            if mine:
                lines.append(
                    f"#{name}: " + " | ".join(f"[{sender_name(p.sender)}] {p.text}" for p in mine)
                )
        actor.read_ids = read
        return lines

    def news_for(self, actor: Member) -> str:
        """Why a wait should end at once ("" if it should not): mail, or another's post."""
        if actor.inbox:
            return f"{len(actor.inbox)} new message(s)"
        for name in self.org.channels(actor.role, actor.group):
            ch = self.channels.get(name)
            if ch is not None and ch.next_seq > actor.cursors.get(name, 0):
                posts, _, _ = ch.since(actor.cursors.get(name, 0), ch.capacity)
                if any(p.sender != actor.id for p in posts):
                    return f"news on #{name}"
        return ""

    def subscribe(self, actor: Member) -> None:
        """A waiting agent: a post on any of its channels wakes it."""
        for name in self.org.channels(actor.role, actor.group):
            self.channel(name).waiting.add(actor.id)

    def unsubscribe(self, actor: Member) -> None:
        for name in self.org.channels(actor.role, actor.group):
            ch = self.channels.get(name)
            if ch is not None:
                ch.waiting.discard(actor.id)
