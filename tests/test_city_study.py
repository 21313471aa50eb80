"""The village-to-city study's key measurement (bench/city_study.py) on small real episodes:
the times it reads from a record agree with what the world let agents do."""

from __future__ import annotations

import re

import pytest
import trio

from bench.bootstrap import diff_ci, mean_ci
from bench.city_study import episode_config, key_times, summarise_episode
from collective import Conductor, Episode
from collective.records import Committed, Posted
from policy.uniform import RandomPolicy

_REFUSED = re.compile(r"needs key k(\d+)")


def play(condition: str, n: int = 8, instance: int = 0) -> Episode:
    policy = RandomPolicy()
    cfg = episode_config(condition, n, instance, policy.name)
    return trio.run(lambda: Conductor(policy).play([cfg], concurrency=1))[0]


def refusals(ep: Episode) -> list[tuple[float, int, int]]:
    out = []
    for ev in ep.events:
        if isinstance(ev, Committed) and not ev.ok and (m := _REFUSED.search(ev.result)):
            out.append((ev.t, ev.agent, int(m.group(1))))
    return out


@pytest.mark.parametrize("instance", [0, 1])
def test_a_public_key_was_posted_then_and_refuses_nobody_after(instance: int) -> None:
    ep = play("flat", instance=instance)
    kt = key_times(ep)
    assert kt["keys"] == 4
    published = [(k, t) for k, t in enumerate(kt["public_at"]) if t is not None]
    assert published, "the random policy posts keys by chance within 180 s"
    posts = [ev for ev in ep.events if isinstance(ev, Posted)]
    for k, t in published:
        assert any(p.t == t and re.search(rf"\bk{k}\b", p.text) for p in posts)
        assert not [r for r in refusals(ep) if r[2] == k and r[0] > t]
    # every wait is the gap from a refusal to knowing: nobody is refused after it ends
    assert kt["refused"] == len({(a, k) for _, a, k in refusals(ep)})
    assert len(kt["waits"]) == kt["refused"]
    for _, agent, key, first, wait in kt["waits"]:
        later = [t for t, a, k in refusals(ep) if a == agent and k == key and t > first]
        if wait is not None:  # refused until it knew the key, never after
            assert all(t < first + wait for t in later)
            assert wait > 0  # it was refused, so it did not know the key then


def test_direct_keys_never_go_public_and_public_keys_are_public_at_start() -> None:
    dm = key_times(play("dm_only"))
    assert dm["public_at"] == [None] * 4 and dm["publishing_posts"] == 0
    pub = play("keys_public")
    kt = key_times(pub)
    assert kt["public_at"] == [0.0] * 4 and not refusals(pub) and kt["waits"] == []
    s = summarise_episode(pub)
    assert s["published"] == 1.0 and s["publication_time"] == 0.0 and s["wait"] is None


def test_islands_keep_their_keys_apart() -> None:
    ep = play("islands", n=16)
    kt = key_times(ep)
    assert kt["keys"] == 8  # two islands of 8, four keys each
    assert ep.config.org == "islands_mean:2"


def test_bootstrap_interval_holds_the_mean() -> None:
    m, lo, hi = mean_ci([0.1, 0.5, 0.3, 0.9])
    assert lo <= m <= hi and hi - lo > 0
    assert mean_ci([0.4, 0.4]) == pytest.approx((0.4, 0.4, 0.4))
    d, lo, hi = diff_ci([1.0, 1.1, 0.9], [0.0, 0.1, -0.1])
    assert lo > 0.5 and d == pytest.approx(1.0)
