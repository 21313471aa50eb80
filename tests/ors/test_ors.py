"""Open Reward Standard environments as worlds, and worlds served as ORS environments, for real:
the SDK's own server on loopback (``tests/support/ors_envs.py``), a collective of 4 on it on
the hybrid clock, replay byte-exact without it, a fork past the record, two training steps,
the SDK's own client against ``collective serve-ors``, and the bad input, each one line."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

os.environ.setdefault("OPENREWARD_LOG_LEVEL", "CRITICAL")  # the SDK logs every call to stdout
pytest.importorskip("openreward", reason="the ors extra (openreward) is not installed")
httpx = pytest.importorskip("httpx", reason="the ors extra (httpx) is not installed")

from collective import EpisodeConfig, load_episode, run_episode  # noqa: E402
from collective.cli import main  # noqa: E402
from collective.records import Committed, Happened, encode_episode, save_episode  # noqa: E402
from collective.replay import fork, replay  # noqa: E402
from collective.rl.train import train  # noqa: E402
from policy.uniform import RandomPolicy  # noqa: E402
from tests.support import ROOT  # noqa: E402
from tests.support.busy import scaled  # noqa: E402
from tests.support.training import small_train  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(args: list[str], port: int) -> subprocess.Popen[bytes]:
    """A server process on 127.0.0.1:port, once it answers /health."""
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    deadline = time.monotonic() + scaled(60)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read().decode()[-2000:] if proc.stderr else "")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("the server did not start")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(scaled(10))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The SDK's server with the tests' environments: ``http://127.0.0.1:PORT``."""
    port = _free_port()
    proc = _serve([sys.executable, "-m", "tests.support.ors_envs", str(port)], port)
    yield f"http://127.0.0.1:{port}"
    _stop(proc)


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _cfg(world: str, **kw: object) -> EpisodeConfig:
    base: dict = dict(
        world=world,
        agents=4,
        time_limit=120.0,
        clock="hybrid",
        world_seed=1,
        sample_seed=3,
        policy="random",
        tokenizer="bytes",
        params={"task": 1},
    )
    return EpisodeConfig(**{**base, **kw})  # type: ignore[arg-type]


def test_a_collective_of_4_on_a_served_environment_replays_byte_exact_without_it(
    server: str,
) -> None:
    cfg = _cfg(f"ors:{server}/tiles")
    ep = run_episode(cfg, RandomPolicy())
    assert ep.end in ("done", "time_limit")
    calls = [
        e for e in ep.events if isinstance(e, Committed) and e.tool in ("look", "flip", "submit")
    ]
    assert {e.agent for e in calls} == {0, 1, 2, 3} or ep.end == "done"
    assert calls and all(e.real > 0 for e in calls)  # real work, measured on the hybrid clock
    opened = [e for e in ep.events if isinstance(e, Happened)]
    assert opened[0].t == 0 and "Find the target tiles" in opened[0].call
    assert all(r.result.startswith("[") for r in calls if r.ok)  # the reward's mark first
    # The prompt opens every agent's first observation.
    firsts = {}
    for t in ep.turns:
        firsts.setdefault(t.agent, t.prompt)
    assert all("Find the target tiles" in p for p in firsts.values())
    # Same seed, same recorded results: the same bytes.
    again = replay(ep, world="ors:http://127.0.0.1:9/tiles")  # nobody answers there
    assert encode_episode(msgspec.structs.replace(again, config=ep.config)) == encode_episode(ep)


def test_islands_open_a_session_each_and_replay_takes_each_its_own(server: str) -> None:
    from collective.engine.organisation import make_organisation

    islands = make_organisation("islands")
    seed = next(s for s in range(50) if len({islands.variant_seed(g, s) % 3 for g in (0, 1)}) == 2)
    cfg = _cfg(f"ors:{server}/tiles", org="islands", params={}, world_seed=seed)
    ep = run_episode(cfg, RandomPolicy())
    opened = [e for e in ep.events if isinstance(e, Happened) and e.t == 0]
    assert len(opened) == 2 and opened[0].call != opened[1].call  # two groups, two tasks
    again = replay(ep, world="ors:http://127.0.0.1:9/tiles")
    assert encode_episode(msgspec.structs.replace(again, config=ep.config)) == encode_episode(ep)


def test_the_score_is_the_rewards_so_far_capped_at_1_and_the_calls_keep_the_engines_order(
    server: str,
) -> None:
    a = run_episode(_cfg(f"ors:{server}/tiles", time_limit=300.0), RandomPolicy())
    b = run_episode(_cfg(f"ors:{server}/tiles", time_limit=300.0), RandomPolicy())
    strip = [(e.t, e.agent, e.tool, e.ok, e.result) for e in a.events if isinstance(e, Committed)]
    assert strip == [
        (e.t, e.agent, e.tool, e.ok, e.result) for e in b.events if isinstance(e, Committed)
    ]
    rewards = [
        float(e.result[len("[reward ") :].split("]")[0].split(",")[0])
        for e in a.events
        if isinstance(e, Committed) and e.result.startswith("[reward")
    ]
    assert a.score == pytest.approx(min(1.0, sum(rewards)))
    assert [s for _, s in a.curve] == sorted(s for _, s in a.curve)


def test_an_environment_class_runs_in_process_and_replays_from_the_record(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "ep.msgpack"
    rc, said, err = _cli(
        capsys,
        "run",
        "tests.support.ors_envs:Tiles",
        "--agents",
        "4",
        "--param",
        "task=2",
        "--time-limit",
        "60",
        "--out",
        str(out),
    )
    assert rc == 0, err
    rc, said, err = _cli(capsys, "replay", str(out), "--world", "tests.support.ors_envs:Tiles")
    assert rc == 0 and '"replay": "identical"' in said, err


def test_a_fork_past_the_record_needs_the_server_and_says_so(
    server: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ep = run_episode(
        _cfg(f"ors:{server}/tiles", clock="virtual", time_limit=300.0, params={"task": 0}),
        RandomPolicy(),
    )
    forked = fork(ep, 2.0, RandomPolicy(), sample_seed=9)
    before = [e for e in ep.events if e.t < 2.0]
    assert [e for e in forked.events if e.t < 2.0] == before
    assert any(
        isinstance(e, Committed) and e.t >= 2.0 and e.tool in ("look", "flip", "submit")
        for e in forked.events
    )  # live past the record: the session caught up first
    path = tmp_path / "ep.msgpack"
    save_episode(ep, path)
    rc, _, err = _cli(
        capsys, "replay", str(path), "--world", "ors:http://127.0.0.1:9/tiles", "--until", "2"
    )
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "no server answers" in err and "a fork goes on past the record" in err


def test_a_forks_first_live_call_finds_the_session_where_the_record_left_it(server: str) -> None:
    import trio

    from collective.engine.registry import make_world, resolve_world
    from collective.world.outside import from_record

    ref = f"ors:{server}/tiles"
    live = make_world(ref, 2, 0, {"task": 0})  # task 0: targets 1 and 4
    opening = [f"ors_opened({_opened(live)!r})"]  # what its record would hold at t = 0
    live.close()
    with from_record(opening):
        world = resolve_world(ref)(n_agents=2, seed=0, task=0)
    assert world.session is None  # built from the record: no server asked
    world.replayed("flip", 0, (1,), True, "[reward 0.2] flipped 1")  # recorded: tile 1 flipped
    try:
        again = trio.run(world.call_tool, "flip", 1, (1,))
        fresh = trio.run(world.call_tool, "flip", 1, (4,))
    finally:
        world.close()
    assert again == "[reward 0.0] flipped 1"  # the new session was sent the recorded flip first
    assert fresh == "[reward 0.2] flipped 4" and world.score() == pytest.approx(0.4)


def _opened(world: Any) -> str:
    opened = {"split": world.split, "task": world.task, "prompt": world.prompt}
    return json.dumps({**opened, "tools": world.tools}, sort_keys=True)


def test_two_training_steps_on_a_served_environment(server: str, tmp_path: Path) -> None:
    cfg = small_train(
        world=f"ors:{server}/tiles",
        params={"duration": 5.0},
        steps=2,
        team_sizes=(4,),
        groups_per_step=2,
        group_size=2,
        concurrency=4,
    )
    rows = train(cfg, tmp_path / "run", progress=False)
    assert len(rows) == 2
    episodes = sorted((tmp_path / "run").rglob("*.msgpack"))
    assert len(episodes) == 8
    tasks = {
        next(e.call for e in load_episode(p).events if isinstance(e, Happened)) for p in episodes
    }
    assert 1 <= len(tasks) <= 2


def test_a_mix_names_ors_worlds_in_worlds_tables_both_ways(
    server: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "mix.toml"
    config.write_text(
        f"""
steps = 1
groups_per_step = 2
group_size = 2
concurrency = 4
max_output_tokens = 12
plots = false

[[worlds]]
world = "ors:{server}/tiles"
params = {{task = 2}}
team_sizes = [4]
time_limit_start = 60.0
time_limit_end = 60.0

[[worlds]]
world = "examples/ors_coins.py:Coins"
team_sizes = [2]
time_limit_start = 30.0
time_limit_end = 30.0

[model]
d_model = 32
n_layers = 1
n_heads = 2
d_ff = 64
context = 96
"""
    )
    rc, _, err = _cli(capsys, "train", str(config), "--out", str(tmp_path / "run"))
    assert rc == 0, err
    worlds = {load_episode(p).config.world for p in (tmp_path / "run").rglob("*.msgpack")}
    assert worlds <= {f"ors:{server}/tiles", "examples/ors_coins.py:Coins"} and worlds


def test_the_sdks_own_client_drives_a_world_served_by_serve_ors() -> None:
    from openreward import AsyncOpenReward

    port = _free_port()
    proc = _serve(
        [
            sys.executable,
            "-m",
            "collective.cli",
            "serve-ors",
            "tally",
            "--port",
            str(port),
            "--agents",
            "2",
            "--tasks",
            "3",
            "--param",
            "target=4",
        ],
        port,
    )
    url = f"http://127.0.0.1:{port}"

    async def drive() -> tuple[list, list, list]:
        client = AsyncOpenReward(api_key="none", base_url=url)
        env = client.environments.get("tally", base_url=url)
        try:
            splits = await env.list_splits()
            outs = []
            async with env.session(split="train", index=2) as s:
                prompt = await s.get_prompt()
                for agent in (0, 1, 0, 1):
                    outs.append(await s.call_tool("add", {"agent": agent, "amount": 1}))
            return splits, prompt, outs
        finally:
            await client.environments.aclose()

    try:
        splits, prompt, outs = asyncio.run(drive())
    finally:
        _stop(proc)
    assert splits == ["train", "test"]
    assert "count 0 of 4" in prompt[0].text
    assert [o.reward for o in outs] == pytest.approx([0.25] * 4)  # they sum to the score
    assert [o.finished for o in outs] == [False, False, False, True]
    assert "agent 1" in outs[1].blocks[0].text


def test_check_says_when_rewards_only_come_with_finished(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, said, err = _cli(
        capsys,
        "check",
        "tests.support.ors_envs:Late",
        "--agents",
        "2",
        "--seeds",
        "1",
        "--rollouts",
        "2",
        "--time-limit",
        "30",
    )
    assert "rewards arrive only with `finished`" in said, said + err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["ors:{dead}/tiles"], "no server answers"),
        (["ors:localhost:8080"], "give ors:http://HOST:PORT/NAME"),
        (["ors:{silent}/tiles", "--param", "deadline=1"], "no answer within the deadline (1 s)"),
        (
            ["ors:{url}/tiles", "--param", "task=7"],
            "task 7 is out of range: split 'train' has 3 tasks (0..2)",
        ),
        (["ors:{url}/tiles", "--param", "split=dev"], "no split 'dev'"),
        (
            ["tests.support.ors_envs:Tile"],
            "no World subclass named 'Tile' (nor an openreward Environment); it is a "
            "ModelMetaclass",
        ),
        (["tests.support.ors_envs:Wide"], "tool 'pay', field 'amount': a number field"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_any_work(
    server: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], says: str
) -> None:
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        spots = {
            "dead": f"http://127.0.0.1:{_free_port()}",
            "url": server,
            "silent": f"http://127.0.0.1:{silent.getsockname()[1]}",
        }
        out = tmp_path / "ep.msgpack"
        rc, said, err = _cli(capsys, "run", *[a.format(**spots) for a in args], "--out", str(out))
    assert rc == 2 and said == "" and len(err.strip().splitlines()) == 1, err
    assert says in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("world", "split", "says"),
    [
        ("ors:{url}/broken", "raise", "broken.poke (tool, agent 0) raised OrsError: "),
        (
            "tests.support.ors_envs:Broken",
            "raise",
            "Broken.poke (tool, agent 0) raised OrsError:"
            " Broken.poke raised RuntimeError: the grader",
        ),
        ("ors:{url}/broken", "big", "the reward 1.5 is outside [0, 1]"),
        # (served, a NaN reaches the client as null: the SDK's JSON has no NaN; the split's
        # name quoted, as any string that would read as a number is: --param reads nan so)
        ("tests.support.ors_envs:Broken", '"nan"', "the reward nan is outside [0, 1]"),
    ],
)
def test_an_environment_that_breaks_mid_episode_is_one_line_exit_2_the_record_kept(
    server: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    world: str,
    split: str,
    says: str,
) -> None:
    out = tmp_path / "ep.msgpack"
    rc, _, err = _cli(
        capsys,
        "run",
        world.format(url=server),
        "--param",
        f"split={split}",
        "--agents",
        "1",
        "--out",
        str(out),
    )
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert says in err and "the episode is in" in err
    ep = load_episode(out)
    assert ep.end == "world_error" and ep.events  # nothing lost
    # and its replay fails where it failed, as recorded, with nobody at the server's address
    again = replay(ep, world=world.format(url="http://127.0.0.1:9"))
    assert encode_episode(msgspec.structs.replace(again, config=ep.config)) == encode_episode(ep)


def test_the_docs_example_is_the_file_and_runs_and_replays(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    source = (ROOT / "examples" / "ors_coins.py").read_text()
    assert source.split('"""\n\n', 1)[1] in (ROOT / "docs" / "ors.md").read_text()
    out = tmp_path / "coins.msgpack"
    rc, said, err = _cli(
        capsys,
        "run",
        "examples/ors_coins.py:Coins",
        "--agents",
        "4",
        "--seed",
        "1",
        "--time-limit",
        "60",
        "--out",
        str(out),
    )
    assert rc == 0 and '"score": ' in said, err
    rc, said, err = _cli(capsys, "replay", str(out), "--world", "examples/ors_coins.py:Coins")
    assert rc == 0 and '"replay": "identical"' in said, err
