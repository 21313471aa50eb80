"""The village-to-city study's key measurement (bench/city_study.py) on small real episodes:
the times it reads from a record agree with what the world let agents do."""

from __future__ import annotations

import re
from typing import Any

import pytest
import trio

from bench.city_study import (
    FIELDS,
    GRID,
    episode_config,
    key_times,
    policy_label,
    split_name,
    summarise,
    summarise_episode,
)
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


def _cell(finals: list[float], ids: bool = True) -> dict[str, Any]:
    """A city.json cell whose episodes end at these scores (a straight rise from 0), with their
    instance numbers (``ids``) or, as cells run before they were recorded, without."""
    eps = [
        {
            **({"instance": i} if ids else {}),
            "score": [f * t / GRID[-1] for t in GRID],
            **dict.fromkeys(FIELDS, 0.0),
        }
        for i, f in enumerate(finals)
    ]
    return {"episodes": eps, "wall_seconds": 0.0}


def test_cells_are_named_by_training_seed_and_pooled_over_seeds() -> None:
    assert [split_name(policy_label(b, 2)) for b in ("trained", "untrained", "random")] == [
        ("trained", 2),
        ("untrained", 2),
        ("random", None),
    ]
    cells = {
        "trained_s0/flat/8": _cell([0.6, 0.6, 0.6]),
        "trained_s0/flat/64": _cell([0.5, 0.5]),
        "trained_s1/flat/8": _cell([0.8, 0.8, 0.8, 0.8]),  # an extra instance: not pooled
        "trained_s1/flat/64": _cell([0.6, 0.6]),
        "trained_s2/flat/8": _cell([0.9, 0.9, 0.9]),  # no 64: not in the drop
        "trained_s0/keys_public/8": _cell([0.9, 0.9, 0.9]),
        "trained_s0/keys_public/64": _cell([0.9, 0.9]),
        "trained_s1/keys_public/8": _cell([0.9, 0.9, 0.9]),
        "trained_s1/keys_public/64": _cell([0.9, 0.9]),
        "random/flat/8": _cell([0.3, 0.4]),
        "random/flat/64": _cell([0.3, 0.3]),
    }
    s = summarise(cells, boot=200)
    flat8 = s["cells"]["trained/flat/8"]
    assert flat8["seeds"] == [0, 1, 2]
    assert flat8["score_at"]["120"]["mean"] == pytest.approx((0.6 + 0.8 + 0.9) / 3, abs=1e-4)
    assert (flat8["score_at"]["120"]["seeds"], flat8["score_at"]["120"]["instances"]) == (3, 3)
    assert s["cells"]["random/flat/8"]["seeds"] == []  # the random policy has no training seed
    drop = s["drop_8_to_64"]["trained/flat"]["120"]
    assert drop["seeds"] == 2 and drop["mean"] == pytest.approx(
        0.15, abs=1e-4
    )  # seeds 0 and 1 only
    assert drop["lo"] <= 0.1 and drop["hi"] >= 0.2  # the seeds' own drops: 0.1 and 0.2
    per_seed = s["per_seed"]["drop_8_to_64"]
    assert per_seed["trained_s0/flat"]["120"]["mean"] == pytest.approx(0.1, abs=1e-4)
    assert per_seed["trained_s1/flat"]["120"]["mean"] == pytest.approx(0.2, abs=1e-4)
    assert "trained_s2/flat" not in per_seed
    # keys_public scores the same at both sizes, so it removes all of flat's drop, per seed too
    assert s["drop_removed_8_to_64"]["trained/keys_public"]["mean"] == pytest.approx(0.15, abs=1e-4)
    assert s["per_seed"]["drop_removed_8_to_64"]["trained_s1/keys_public"]["mean"] == (
        pytest.approx(0.2, abs=1e-4)
    )
    assert s["drop_8_to_64"]["random/flat"]["120"]["mean"] == pytest.approx(0.05, abs=1e-4)
    # episodes that do not say their instance pool only when every seed ran as many
    legacy = {"trained_s0/flat/8": _cell([0.5, 0.6], ids=False), "trained_s1/flat/8": _cell([0.7])}
    with pytest.raises(ValueError, match="do not say which"):
        summarise(legacy, boot=50)


def test_cells_are_reused_only_under_their_digest(tmp_path: Any) -> None:
    """run_all keeps a cell made exactly so, and runs again one whose configs changed or that
    was recorded without a digest (an old city.json)."""
    import json

    from bench.city_study import run_all
    from policy.tiny import TinyConfig, TinyModel, save_checkpoint

    ckpt = save_checkpoint(
        TinyModel.fresh(TinyConfig(d_model=32, n_heads=2, d_ff=64, context=96)), tmp_path / "t.pt"
    )
    out = tmp_path / "out"
    cells = run_all(str(ckpt), out, [8], ["keys_off"], ["random"], {8: 2})
    first = (out / "city.json").read_text()
    assert len(cells["random/keys_off/8"]["episodes"]) == 2 and cells["random/keys_off/8"]["digest"]
    run_all(str(ckpt), out, [8], ["keys_off"], ["random"], {8: 2})
    assert (out / "city.json").read_text() == first  # re-used, not re-run
    more = run_all(str(ckpt), out, [8], ["keys_off"], ["random"], {8: 3})
    assert len(more["random/keys_off/8"]["episodes"]) == 3
    old = json.loads((out / "city.json").read_text())
    del old["cells"]["random/keys_off/8"]["digest"]
    old["cells"]["random/keys_off/8"]["episodes"] = old["cells"]["random/keys_off/8"]["episodes"][
        :1
    ]
    (out / "city.json").write_text(json.dumps(old))
    again = run_all(str(ckpt), out, [8], ["keys_off"], ["random"], {8: 3})
    assert len(again["random/keys_off/8"]["episodes"]) == 3
