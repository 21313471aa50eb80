"""The village-to-city study (experiments/city.py) and its world (worlds/city.py): task,
keys and desks scale with n as the world's docstring says, the scripts do what their names say,
the keys' times read from a record agree with what the world let agents do, and cells are
re-used by digest; on real worlds and real episodes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from collective.records import Committed, Episode, Posted, Sent
from experiments.city import (
    episode_config,
    key_times,
    nopass,
    oracle,
    play,
    record,
    run_cells,
)
from policy.scripted import ScriptedPolicy
from policy.tiny import TinyConfig, TinyModel, save_checkpoint
from policy.uniform import RandomPolicy
from worlds.city import BLOCK, CityWorkshop

_REFUSED = re.compile(r"needs key k(\d+)")


@pytest.mark.parametrize("n", [8, 16, 64])
def test_task_keys_and_desks_scale_with_the_team(n: int) -> None:
    w = CityWorkshop(n, seed=3)
    blocks = n // BLOCK
    assert w.modules == 4 * n and w.n_keys == 4 * blocks  # task and keys in proportion to n
    gated = [m for m in range(w.modules) if w.key_of[m] >= 0]
    for m in gated:  # a gated module's key is held in the module's own block
        assert w.holder[w.key_of[m]] // BLOCK == m % blocks
    for a in range(n):  # a desk shows only its own block's modules
        assert all(m % blocks == a // BLOCK for m in w._desk(a))
    # the chance a key's holder has a given module of its block on its desk does not fall with n
    ready = [m for m in w.ready if m % blocks == 0]
    seen = sum(m in w._desk(a) for a in range(BLOCK) for m in ready) / len(ready)
    assert 1.0 <= seen <= 3.0  # ~view desks of the block's 8 show each ready module


def test_one_block_is_the_plain_workshops_desk() -> None:
    """At n <= 8 (and with block=0 at any n) the desk is the workshop's own: global."""
    from worlds.workshop import Workshop

    for w in (CityWorkshop(64, seed=3, block=0), CityWorkshop(8, seed=3)):
        assert w.blocks == 1 and w.n_keys == 4
        assert all(w._desk(a) == Workshop._desk(w, a) for a in range(w.n_agents))
        assert {len(w._desk(a)) for a in range(w.n_agents)} == {3}


def test_nopass_never_talks_and_the_oracle_posts_wanted_keys() -> None:
    cfgs = [episode_config("city", 16, i, "s") for i in range(2)]
    quiet = play(ScriptedPolicy(nopass, name="nopass"), cfgs)
    assert all(not isinstance(ev, Posted | Sent) for e in quiet for ev in e.events)
    assert all(record(e)["published"] == 0.0 for e in quiet)
    told = play(ScriptedPolicy(oracle, name="oracle"), cfgs)
    assert all(record(e)["published"] > 0 for e in told)
    assert sum(e.score for e in told) > sum(e.score for e in quiet)


def test_islands_post_on_their_own_channel() -> None:
    eps = play(ScriptedPolicy(oracle, name="oracle"), [episode_config("islands", 16, 0, "o")])
    chans = {ev.channel for ev in eps[0].events if isinstance(ev, Posted)}
    assert chans and chans <= {"g0", "g1"}


def test_cells_are_reused_by_digest(tmp_path: Path) -> None:
    ckpt = save_checkpoint(
        TinyModel.fresh(TinyConfig(d_model=32, n_heads=2, d_ff=64, context=96)), tmp_path / "t.pt"
    )
    out = tmp_path / "out"
    cells = run_cells(ckpt, out, [8], ["city"], ["nopass", "random"], 2)
    before = json.loads((out / "cells.json").read_text())
    assert set(cells) == {"nopass/city/8", "random/city/8"}
    again = run_cells(ckpt, out, [8], ["city"], ["nopass", "random"], 2)
    assert json.loads((out / "cells.json").read_text()) == before and again == cells
    more = run_cells(ckpt, out, [8], ["city"], ["nopass"], 3)  # other instances: measured again
    assert len(more["nopass/city/8"]["episodes"]) == 3
    assert more["nopass/city/8"]["digest"] != before["cells"]["nopass/city/8"]["digest"]


def refusals(ep: Episode) -> list[tuple[float, int, int]]:
    out = []
    for ev in ep.events:
        if isinstance(ev, Committed) and not ev.ok and (m := _REFUSED.search(ev.result)):
            out.append((ev.t, ev.agent, int(m.group(1))))
    return out


@pytest.mark.parametrize("instance", [0, 1])
def test_a_public_key_was_posted_then_and_refuses_nobody_after(instance: int) -> None:
    (ep,) = play(ScriptedPolicy(oracle, name="oracle"), [episode_config("city", 8, instance, "o")])
    kt = key_times(ep)
    assert kt["keys"] == 4
    published = [(k, t) for k, t in enumerate(kt["public_at"]) if t is not None]
    assert published, "the oracle posts a key once a refusal marks it wanted"
    posts = [ev for ev in ep.events if isinstance(ev, Posted)]
    for k, t in published:
        assert any(p.t == t and re.search(rf"\bk{k}\b", p.text) for p in posts)
        assert not [r for r in refusals(ep) if r[2] == k and r[0] > t]
    # every wait is the gap from a refusal to knowing: nobody is refused after it ends
    assert kt["refused"] == len({(a, k) for _, a, k in refusals(ep)}) > 0
    assert len(kt["waits"]) == kt["refused"]
    for _, agent, key, first, wait in kt["waits"]:
        later = [t for t, a, k in refusals(ep) if a == agent and k == key and t > first]
        if wait is not None:  # refused until it knew the key, never after
            assert all(t < first + wait for t in later)
            assert wait > 0  # it was refused, so it did not know the key then


def test_direct_keys_never_go_public_and_public_keys_are_public_at_start() -> None:
    city = episode_config("city", 8, 0, "random")
    dm_only = msgspec.structs.replace(city, params={"posts_teach": False})
    (dm,) = play(RandomPolicy(), [dm_only])
    assert key_times(dm)["public_at"] == [None] * 4 and key_times(dm)["publishing_posts"] == 0
    (pub,) = play(RandomPolicy(), [episode_config("keys_public", 8, 0, "random")])
    kt = key_times(pub)
    assert kt["public_at"] == [0.0] * 4 and not refusals(pub) and kt["waits"] == []
    assert record(pub)["published"] == 1.0


def test_islands_keep_their_keys_apart() -> None:
    (ep,) = play(RandomPolicy(), [episode_config("islands", 16, 0, "random")])
    assert key_times(ep)["keys"] == 8  # two islands of 8, four keys each
    assert ep.config.org == "islands_mean:2"


def test_the_city_passes_the_training_checks() -> None:
    """A training run on the city is checked as any other (the memory check reads the
    workshop's footprint, whose default size a subclass taking **params does not restate)."""
    from collective.rl.checks import validate
    from experiments.city import village_config

    validate(village_config(steps=1))
    assert CityWorkshop.footprint(8) == CityWorkshop.footprint(8, size=4) > 0
