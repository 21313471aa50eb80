"""What docs/writing-a-world.md says of a refusal (``ToolError``) and of ``metrics()`` holds:
the real command line on a world built to show it (``tests/support/fragile.py:Refuses``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from collective import load_episode
from collective.cli import main
from collective.records import Committed, Happened, Posted
from tests.support import FRAGILE, ROOT

REFUSES = f"{FRAGILE}:Refuses"
GUIDE = ROOT / "docs" / "writing-a-world.md"


def test_what_a_tool_changed_before_its_tool_error_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "ep.msgpack"
    assert main(["run", REFUSES, "--agents", "3", "--seed", "2", "--time-limit", "30",
                 "--out", str(out)]) == 0  # fmt: skip
    ep = load_episode(out)
    refused = [e for e in ep.events if isinstance(e, Committed) and e.tool == "spend"]
    assert refused and not any(e.ok for e in refused)
    assert all(e.result == "error: refused after all" for e in refused)
    # each refused call's change stayed: its post, its event, its count (so the score)
    posts = [e for e in ep.events if isinstance(e, Posted) and e.agent < 0]
    assert [p.t for p in posts] == [e.t for e in refused]
    rung = [e.t for e in ep.events if isinstance(e, Happened)]
    assert rung == [e.t + 1.0 for e in refused if e.t + 1.0 < ep.config.time_limit]
    assert ep.world_metrics == {"count": float(len(refused)), "rang": float(len(rung))}
    assert ep.score == pytest.approx(len(refused) / 10)
    assert "Nothing is undone" in GUIDE.read_text()


def test_metrics_are_kept_and_diff_prints_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a.msgpack", tmp_path / "b.msgpack"
    for path, seed in ((a, "2"), (b, "3")):
        assert main(["run", REFUSES, "--agents", "3", "--seed", seed, "--time-limit", "30",
                     "--out", str(path)]) == 0  # fmt: skip
    x, y = load_episode(a).world_metrics, load_episode(b).world_metrics
    assert x != y
    capsys.readouterr()
    assert main(["diff", str(a), str(b)]) == 1
    assert f"world_metrics: {x!r} vs {y!r}" in capsys.readouterr().out
    assert "| `metrics()` |" in GUIDE.read_text()


def test_the_guide_lists_every_primitive_an_agent_has() -> None:
    from collective.base.primitives import NAMES

    text = GUIDE.read_text()
    table = text[text.index("### What every agent can do besides your tools") :]
    for name in NAMES:
        assert f"| `{name} " in table, name


def test_a_lexicon_set_per_instance_is_what_the_agents_draw_from() -> None:
    """The guide says a lexicon may be set in the constructor, growing with the world: the
    random team's messages then name words only the instance's lexicon holds."""
    from collective import EpisodeConfig, run_episode
    from collective.records import Sent
    from policy.uniform import RandomPolicy

    assert "self.lexicon = " in GUIDE.read_text()
    ep = run_episode(
        EpisodeConfig(world=f"{FRAGILE}:Named", agents=16, time_limit=120), RandomPolicy()
    )
    said = {w for e in ep.events if isinstance(e, Sent) for w in e.text.split()}
    assert {w for w in said if w.startswith("p") and w[1:].isdigit() and int(w[1:]) >= 8}
