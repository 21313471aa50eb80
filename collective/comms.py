"""The communication primitives' state: messages, channels, the archive. All bounded.

These are plain data structures, mutated only by the conductor while every actor is parked, so
they need no locks. Broadcast is a subscription: a post is stored once in its channel and each
subscriber keeps a cursor into it, so posting costs O(1) whatever the number of subscribers;
only subscribers that are actually waiting are woken.
"""

from __future__ import annotations

import heapq
import re
from collections import Counter, deque
from dataclasses import dataclass, field

_WORD = re.compile(r"[a-z0-9]+")
_ID_BITS = 48  # note ids stay far below 2**48 in any episode
_ID_MASK = (1 << _ID_BITS) - 1


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
        return [self.entries[(key & _ID_MASK) - first][:3] for key in best]  # type: ignore[misc]
