"""The controlled village-to-city study's world and scripts (bench/city_controlled.py): task,
keys and desks scale with n as its docstring says, and its scripts do what their names say,
on real worlds and real episodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.city_controlled import (
    BLOCK,
    CityWorkshop,
    episode_config,
    nopass,
    oracle,
    play,
    record,
    run_cells,
)
from collective.records import Posted, Sent
from policy.scripted import ScriptedPolicy
from policy.tiny import TinyConfig, TinyModel, save_checkpoint


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
    w = CityWorkshop(64, seed=3, block=0)
    assert w.blocks == 1 and w.n_keys == 4
    plain_desks = {len(w._desk(a)) for a in range(64)}
    assert plain_desks == {3}


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
