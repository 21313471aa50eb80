"""The engine's optimised hot paths against their plain definitions.

Each fast version must give exactly what the slow, obvious version gives: the archive's indexed
search against a scan of every note, the written-out seed mixers against ``splitmix64``, the
bucketed agenda against one heap of every entry, and the collector settings during play must come
back as they were.
"""

from __future__ import annotations

import gc
import heapq
import math
import re
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from collective import EpisodeConfig, run_episode
from collective.base.seeding import Stream, derive, derive_more, splitmix64
from collective.engine.agenda import Agenda, Priority
from collective.engine.comms import Archive
from policy.base import PolicyRequest, PolicyResponse
from policy.uniform import RandomPolicy

_WORD = re.compile(r"[a-z0-9]+")
_MASK = (1 << 64) - 1


def scan(entries: list[tuple[int, int, str, frozenset[str]]], query: str, k: int) -> list:
    """Archive.search by definition: every note, ranked by shared words, newest first on ties."""
    q = frozenset(_WORD.findall(query.lower()))
    scored = [(len(q & words), nid, author, text) for nid, author, text, words in entries]
    scored = [s for s in scored if s[0] > 0]
    scored.sort(key=lambda s: (-s[0], -s[1]))
    return [(nid, author, text) for _, nid, author, text in scored[:k]]


words = st.sampled_from(["a", "b", "C", "d7", "help", "x y", "", "--", "Zed!"])
texts = st.lists(words, max_size=4).map(" ".join)


@settings(max_examples=150, deadline=None)
@given(
    capacity=st.integers(1, 12),
    steps=st.lists(
        st.tuples(st.booleans(), st.integers(0, 5), texts, st.integers(1, 5)), max_size=60
    ),
)
def test_indexed_search_ranks_as_a_full_scan(capacity: int, steps: list) -> None:
    archive = Archive(capacity)
    for is_put, author, text, k in steps:
        if is_put:
            archive.put(author, text)
        else:
            assert archive.search(text, k) == scan(list(archive.entries), text, k)
    # The index holds exactly the words of the notes kept: bounded with the archive.
    assert set(archive.index) == {w for entry in archive.entries for w in entry[3]}
    assert len(archive.entries) <= capacity


class Probe:
    """An agenda entry of any priority (each real kind has one)."""

    __slots__ = ("priority",)

    def __init__(self, priority: Priority) -> None:
        self.priority = priority


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 3),  # how many of the current instant's entries to apply first
            st.lists(  # then push these: (delay from now, 0 = at the instant, priority, agent)
                st.tuples(
                    st.sampled_from([0.0, 0.0, 0.25, 0.5, 1.0, 7.0]),
                    st.integers(0, 4),
                    st.integers(0, 3),
                ),
                max_size=6,
            ),
        ),
        max_size=30,
    )
)
def test_agenda_applies_entries_in_the_order_of_one_heap(steps: list) -> None:
    """Entries pushed at the instant being applied (a tool's ``World.at(now)``, a rejected
    action's error) land where one heap of every entry, ``(t, priority, agent, seq)``, would."""
    agenda, seq = Agenda(), 0
    heap: list[tuple[float, int, int, int, Probe]] = []
    applied: list[Probe] = []
    expected: list[Probe] = []
    now = 0.0
    for take, pushes in steps:
        for _ in range(take):
            if not heap:
                break
            assert agenda.next_due() == heap[0][0]
            now = heap[0][0]
            expected.append(heapq.heappop(heap)[4])
            applied.append(agenda.pop_at(now))  # type: ignore[arg-type]
        for delay, priority, agent in pushes:
            seq += 1
            entry = Probe(Priority(priority))
            agenda.push(now + delay, agent, entry)  # type: ignore[arg-type]
            heapq.heappush(heap, (now + delay, priority, agent, seq, entry))
    assert agenda.next_due() == (heap[0][0] if heap else math.inf)
    assert [e for _, e in agenda.in_order()] == [h[4] for h in sorted(heap)]
    assert applied == expected


@given(st.lists(st.integers(-(2**70), 2**70), max_size=5))
def test_derive_is_a_fold_of_splitmix64(parts: list[int]) -> None:
    h = 0x243F6A8885A308D3
    for p in parts:
        h = splitmix64(h ^ (p & _MASK))
    assert derive(*parts) == h


@given(st.lists(st.integers(-(2**70), 2**70), max_size=4), st.integers(-(2**70), 2**70))
def test_derive_more_folds_one_part_more(parts: list[int], p: int) -> None:
    assert derive_more(derive(*parts), p) == derive(*parts, p)


@given(st.integers(0, _MASK))
def test_stream_draws_are_splitmix64_of_a_counter(seed: int) -> None:
    stream = Stream(seed)
    for k in range(1, 6):
        assert stream.bits() == splitmix64((seed + k * 0x9E3779B97F4A7C15) & _MASK)


class Watching(RandomPolicy):
    """The random policy, noting the collector's thresholds while the episode plays."""

    def __init__(self) -> None:
        self.seen: set[tuple[int, int, int]] = set()

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        self.seen.add(gc.get_threshold())
        return await super().generate(requests)


def test_play_collects_rarely_and_restores_the_collector_settings() -> None:
    before = gc.get_threshold()
    cfg = EpisodeConfig(world="tally", agents=3, time_limit=30.0)
    policy = Watching()
    run_episode(cfg, policy)
    assert policy.seen == {(max(before[0], 1_000_000), max(before[1], 50), max(before[2], 100))}
    assert gc.get_threshold() == before
    gc.set_threshold(0)  # the caller disabled collection this way: play must not enable it
    try:
        policy = Watching()
        run_episode(cfg, policy)
        assert {seen[0] for seen in policy.seen} == {0}
    finally:
        gc.set_threshold(*before)
