"""Episodes as Chrome Trace Event files: the format's rules hold, and every turn, message, post
and hire of the episode is in the trace exactly once.

``check_trace`` reads the JSON back and applies the rules of the Trace Event Format that
Perfetto and chrome://tracing rely on: known phases; numeric ts, integer pid and tid; ``B``/``E``
pairs that close in stack order with matching names; ``X`` slices that nest with everything else
on their thread (no partial overlaps); each thread's slice events in time order (counters too,
per counter); metadata naming every process and thread that has events; flow starts ``s`` and
ends ``f`` paired one to one by (cat, name, id), the start inside a slice of its thread, the end
(binding point ``e``) inside a slice of its own thread, never before its start.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collective import Episode, EpisodeConfig, run_episode, save_episode, write_trace
from collective.cli import main
from collective.records import Asked, Began, Posted, Spawned, Thought
from collective.views.trace import parse_agents
from policy.uniform import RandomPolicy
from tests.support.episodes import run

PHASES = set("BEXiICMstfbenPOND")
META = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def check_trace(doc: Any) -> list[dict[str, Any]]:
    """Assert the trace obeys the format's rules; return its events."""
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    assert isinstance(events, list)
    named_procs: set[int] = set()
    named_threads: set[tuple[int, int]] = set()
    used: set[tuple[int, int]] = set()
    last_ts: dict[tuple[Any, ...], float] = {}
    stacks: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    spans: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    flows: dict[tuple[str, str, Any], list[dict[str, Any]]] = defaultdict(list)
    for ev in events:
        ph = ev["ph"]
        assert ph in PHASES, ev
        assert isinstance(ev["pid"], int)
        if ph == "M":
            assert ev["name"] in META, ev
            if ev["name"] == "process_name":
                named_procs.add(ev["pid"])
            elif ev["name"] == "thread_name":
                named_threads.add((ev["pid"], ev["tid"]))
            key = "name" if ev["name"].endswith("_name") else "sort_index"
            assert key in ev["args"], ev
            continue
        assert isinstance(ev["tid"], int) and isinstance(ev["ts"], int | float), ev
        assert ev["ts"] >= 0 and math.isfinite(ev["ts"]), ev
        track = (ev["pid"], ev["tid"])
        used.add(track)
        order_key: tuple[Any, ...] = (*track, "C", ev["name"]) if ph == "C" else track
        if ph != "s" and ph != "f":
            assert ev["ts"] >= last_ts.get(order_key, 0.0), f"out of time order on {track}: {ev}"
            last_ts[order_key] = ev["ts"]
        if ph == "B":
            stacks[track].append(ev)
        elif ph == "E":
            assert stacks[track], f"E without B: {ev}"
            b = stacks[track].pop()
            assert (b["name"], b["cat"]) == (ev["name"], ev["cat"]), (b, ev)
            spans[track].append((b["ts"], ev["ts"]))
        elif ph == "X":
            assert isinstance(ev["dur"], int | float) and ev["dur"] >= 0, ev
            spans[track].append((ev["ts"], ev["ts"] + ev["dur"]))
            for b in stacks[track]:  # inside every slice open on its thread
                assert b["ts"] <= ev["ts"], (b, ev)
        elif ph == "C":
            assert ev["args"] and all(isinstance(v, int | float) for v in ev["args"].values())
        elif ph in "sf":
            flows[(ev["cat"], ev["name"], ev["id"])].append(ev)
    for track, stack in stacks.items():
        assert not stack, f"unclosed slices on {track}: {stack}"
    for track, intervals in spans.items():  # proper nesting: no partial overlap
        open_: list[tuple[float, float]] = []
        for start, end in sorted(intervals, key=lambda iv: (iv[0], -iv[1])):
            while open_ and open_[-1][1] <= start and open_[-1] != (start, end):
                open_.pop()
            if open_:
                assert end <= open_[-1][1], f"{track}: {(start, end)} overlaps {open_[-1]}"
            open_.append((start, end))
    for pid, tid in used:
        assert pid in named_procs, f"process {pid} has no name"
        assert (pid, tid) in named_threads, f"thread {(pid, tid)} has no name"
    for key, pair in flows.items():
        assert sorted(e["ph"] for e in pair) == ["f", "s"], f"flow {key}: {pair}"
        s, f = sorted(pair, key=lambda e: e["ph"], reverse=True)
        assert f.get("bp") == "e" and s["ts"] <= f["ts"], pair
        for end in (s, f):
            t = (end["pid"], end["tid"])
            assert any(a <= end["ts"] <= b for a, b in spans[t]), f"flow end in no slice: {end}"
    return events


def expect_counts(ep: Episode, events: list[dict[str, Any]]) -> None:
    """Every turn, action, message, post, hire, batch and score change, exactly once."""
    by = Counter((e["ph"], e.get("cat"), e["name"]) for e in events)
    flows = Counter(e["name"] for e in events if e["ph"] == "s")
    marks = Counter(e["name"] for e in events if e.get("cat") == "mark")
    spawned = sum(isinstance(e, Spawned) for e in ep.events)
    assert sum(n for (ph, cat, _), n in by.items() if (ph, cat) == ("B", "life")) == spawned
    assert sum(1 for e in events if e["name"] == "thread_name" and e["pid"] == 1) == spawned
    thinks = [e for e in events if e["ph"] == "E" and e["cat"] == "think"]
    assert len(thinks) == sum(isinstance(e, Asked) for e in ep.events)
    answered = [e for e in thinks if "text" in e["args"]]
    assert len(answered) == ep.stats.turns == sum(isinstance(e, Thought) for e in ep.events)
    acts = sum(n for (ph, cat, _), n in by.items() if ph == "B" and cat in ("work", "comm", "wait"))
    assert acts == sum(isinstance(e, Began) for e in ep.events)
    assert flows["msg"] == ep.stats.delivered
    assert flows["post"] == ep.stats.posts == by[("X", "board", "post")]
    assert flows["hire"] == ep.stats.hires
    assert marks["dropped"] == ep.stats.dropped and marks["evicted"] == ep.stats.evicted
    assert marks["unread"] == ep.stats.unread
    assert marks["rejected"] == ep.stats.rejected
    reads = [e for e in events if e["ph"] == "B" and e["cat"] == "think"]
    assert sum(len(e["args"]["read"]) for e in reads) == ep.stats.read
    assert ep.stats.read + ep.stats.evicted + ep.stats.unread == ep.stats.delivered
    batches = [e for e in events if e.get("cat") == "batch"]
    assert sum(e["args"]["requests"] for e in batches) == len(ep.turns)
    assert by[("C", None, "score")] == len(ep.curve)


def trace_of(ep: Episode, tmp_path: Path, **kw: Any) -> list[dict[str, Any]]:
    path = tmp_path / "ep.trace.json"
    written = write_trace(ep, path, **kw)
    assert written.bytes == path.stat().st_size
    events = check_trace(json.loads(path.read_bytes()))
    assert written.events == len(events)
    return events


def test_a_workshop_episode_is_a_valid_trace_with_everything_in_it(tmp_path: Path) -> None:
    ep = run_episode(
        EpisodeConfig(world="workshop", agents=4, world_seed=1, sample_seed=1, time_limit=300),
        RandomPolicy(),
    )
    assert ep.stats.delivered and ep.stats.posts and ep.stats.turns > 100  # something to show
    events = trace_of(ep, tmp_path)
    expect_counts(ep, events)
    think = next(e for e in events if e["ph"] == "E" and e["cat"] == "think")
    assert {"text", "output_tokens", "version"} <= think["args"].keys()
    opened = next(e for e in events if e["ph"] == "B" and e["cat"] == "think")
    assert opened["args"]["prompt"].endswith(">") and opened["args"]["batch"] >= 0
    landed = next(e for e in events if e["ph"] == "E" and e["cat"] == "work")
    assert {"tool", "ok", "result"} <= landed["args"].keys()
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"#all", "archive", "batches", "agent 0 (worker)"} <= names


def test_hired_and_fired_agents_appear_and_disappear(tmp_path: Path) -> None:
    plan = ["hire specialist", "hire specialist", 'msg 1 "x"', 'msg 2 "y"', "fire 1"]
    ep = run(
        lambda r: plan[r.turn] if r.agent == 0 and r.turn < len(plan) else "wait 0",
        world="workshop",
        org="ceo",
        budget=2,
        agents=1,
        time_limit=100,
    )
    assert ep.stats.hires == 2 and ep.stats.fires == 1
    events = trace_of(ep, tmp_path)
    expect_counts(ep, events)
    life = {e["tid"] - 1: e for e in events if e["ph"] == "E" and e["cat"] == "life"}
    born = {e["tid"] - 1: e for e in events if e["ph"] == "B" and e["cat"] == "life"}
    fire = next(e for e in ep.events if type(e).__name__ == "Fired")
    assert life[1]["ts"] == fire.t * 1e6 and life[1]["args"]["end"] == "fired by 0"
    assert born[1]["ts"] > 0 and born[1]["args"]["hired_by"] == 0
    assert life[2]["args"]["end"] == life[0]["args"]["end"] == ep.end


@pytest.mark.parametrize("overflow", ["drop_oldest", "drop_newest"])
def test_lost_and_dropped_messages_each_end_somewhere(tmp_path: Path, overflow: str) -> None:
    # Agent 0 floods the two-message mailbox of agent 1, who is busy working: messages are
    # evicted (drop_oldest) or refused (drop_newest), and some are still unread at the end.
    def script(r: Any) -> str:
        return 'msg 1 "k1 mine"' if r.agent == 0 else "work 1"

    ep = run(script, world="workshop", agents=2, mailbox=2, overflow=overflow, time_limit=60)
    lost = ep.stats.evicted if overflow == "drop_oldest" else ep.stats.dropped
    assert lost and ep.stats.unread and ep.stats.read
    expect_counts(ep, trace_of(ep, tmp_path))


def test_hybrid_tools_are_busy_for_their_real_seconds(tmp_path: Path) -> None:
    ep = run(lambda r: "sleep 5", world="tally", agents=2, clock="hybrid", time_limit=5)
    events = trace_of(ep, tmp_path)
    expect_counts(ep, events)
    sleeps = [e for e in events if e["ph"] == "E" and e["name"] == "sleep" and "ok" in e["args"]]
    assert sleeps and all(e["args"]["real_seconds"] > 0 for e in sleeps)


def test_agents_filter_keeps_only_their_tracks_and_whole_arrows(tmp_path: Path) -> None:
    ep = run_episode(
        EpisodeConfig(world="workshop", agents=6, world_seed=3, sample_seed=3, time_limit=200),
        RandomPolicy(),
    )
    events = trace_of(ep, tmp_path, keep=parse_agents("1-2,4"))
    tracks = {e["tid"] - 1 for e in events if e["pid"] == 1 and e["ph"] in "BEX"}
    assert tracks == {1, 2, 4}
    msgs = [e for e in events if e["ph"] == "s" and e["name"] == "msg"]
    assert msgs and all(e["tid"] - 1 in {1, 2, 4} for e in msgs)
    posts = [e for e in events if e["name"] == "post" and e["ph"] == "X"]
    assert sorted({e["args"]["by"] for e in posts}) == [1, 2, 4]
    assert len(posts) == sum(isinstance(e, Posted) and e.agent in (1, 2, 4) for e in ep.events)


def test_one_agent_and_a_real_clock_episode(tmp_path: Path) -> None:
    ep = run(lambda r: "add 1", world="tally", agents=1, clock="real", time_limit=0.3)
    events = trace_of(ep, tmp_path, real=True)
    expect_counts(ep, events)


@settings(max_examples=12, deadline=None)
@given(
    world=st.sampled_from(["tally", "workshop", "relay", "market"]),
    org=st.sampled_from(["flat", "ceo", "islands:2", "orchestrator"]),
    agents=st.integers(2, 6),
    seed=st.integers(0, 10_000),
    mailbox=st.integers(1, 4),
)
def test_any_episode_makes_a_valid_trace_with_matching_counts(
    tmp_path_factory: pytest.TempPathFactory,
    world: str,
    org: str,
    agents: int,
    seed: int,
    mailbox: int,
) -> None:
    cfg = EpisodeConfig(
        world=world,
        org=org,
        budget=2 if org == "ceo" else 0,
        agents=agents,
        world_seed=seed,
        sample_seed=seed,
        time_limit=120,
        mailbox=mailbox,
        overflow="drop_oldest" if seed % 2 else "drop_newest",
    )
    ep = run_episode(cfg, RandomPolicy())
    expect_counts(ep, trace_of(ep, tmp_path_factory.mktemp("t")))


def test_the_trace_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ep = run(lambda r: "add 1", world="tally", agents=3, time_limit=30)
    save_episode(ep, tmp_path / "ep.msgpack")
    assert main(["trace", str(tmp_path / "ep.msgpack")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["agents"] == 3 and Path(out["path"]) == tmp_path / "ep.trace.json"
    check_trace(json.loads((tmp_path / "ep.trace.json").read_text()))
    assert main(["trace", str(tmp_path / "ep.msgpack"), "--real"]) == 2
    assert "clock=virtual" in capsys.readouterr().err
    assert main(["trace", str(tmp_path / "ep.msgpack"), "--agents", "3-1"]) == 2
    assert "--agents" in capsys.readouterr().err


def test_a_large_episode_warns_and_streams(tmp_path: Path) -> None:
    ep = run_episode(
        EpisodeConfig(world="tally", agents=1_200, time_limit=3, sample_seed=1), RandomPolicy()
    )
    save_episode(ep, tmp_path / "big.msgpack")
    proc = subprocess.run(
        [sys.executable, "-m", "collective.cli", "trace", str(tmp_path / "big.msgpack")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "warning: 1200 agent tracks" in proc.stderr and "--agents" in proc.stderr
    events = check_trace(json.loads((tmp_path / "big.trace.json").read_text()))
    expect_counts(ep, events)


def test_a_random_episodes_batches_say_random(tmp_path: Path) -> None:
    """The batches named the organisation's policy slot (``trained``) as their policy, in an
    episode run with ``--policy random``: the real command line, start to end."""
    ep, trace = tmp_path / "ep.msgpack", tmp_path / "ep.trace.json"
    cli = [sys.executable, "-m", "collective.cli"]
    run_args = [
        "--org",
        "orchestrator",
        "--budget",
        "2",
        "--policy",
        "random",
        "--time-limit",
        "60",
    ]
    r = subprocess.run(
        [*cli, "run", "workshop", *run_args, "--out", str(ep)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        [*cli, "trace", str(ep), "--out", str(trace)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    batches = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "batch"]
    assert batches
    assert {b["args"]["policy"] for b in batches} == {"random"}
    assert {b["args"]["org_policy"] for b in batches} <= {"trained", "frozen"}
