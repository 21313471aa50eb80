"""The engine's optimised hot paths against their plain definitions.

Each fast version must give exactly what the slow, obvious version gives: the archive's indexed
search against a scan of every note, the written-out seed mixers against ``splitmix64``, and the
collector settings during play must come back as they were.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from collective import EpisodeConfig, run_episode
from collective.base.seeding import Stream, derive, splitmix64
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


@given(st.lists(st.integers(-(2**70), 2**70), max_size=5))
def test_derive_is_a_fold_of_splitmix64(parts: list[int]) -> None:
    h = 0x243F6A8885A308D3
    for p in parts:
        h = splitmix64(h ^ (p & _MASK))
    assert derive(*parts) == h


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
