"""Golden digests: proof that an optimisation of the engine changed no behaviour.

Runs a fixed set of episodes (tally with 1, 4 and 30 agents, several seeds, with and without a
hiring budget, small mailboxes under both overflow policies, the bench's Crowd world, scripted
actions of every kind, a world with a bug, and wildfire's world events and posts), and
digests the exact bytes of each episode file, of its replay and of a fork. ``--record`` writes
the digests; ``--check`` (the default) recomputes them and names every config that differs.
Record on the code before a change, check after: byte-identical files mean identical behaviour.

    python bench/golden.py --record   # before
    python bench/golden.py            # after: exits 1 on any difference

``--against REF`` needs no recording: it runs the same cases on the engine as it is at a git
ref (``collective/``, ``policy/`` and ``worlds/`` from ``git archive``, in a subprocess) and
compares with the working tree, e.g. ``--against main`` before a merge.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import msgspec

ROOT = Path(__file__).resolve().parent.parent
# Brittle's bug is recorded with its place (this file, line 80) in the episodes digested here:
# a line added above it or taken away changes their bytes, and the digests recorded before
# (``--against`` a ref before the change says so: move the lines, or record again).
from bench.city import CROWD, SparsePolicy  # noqa: E402
from collective.base import log as logsetup  # noqa: E402
from collective.engine.conductor import run_episode, run_episodes  # noqa: E402
from collective.records import EpisodeConfig, encode_episode  # noqa: E402
from collective.replay import fork, replay  # noqa: E402
from collective.world import Range, tool  # noqa: E402
from policy.base import Policy, PolicyRequest  # noqa: E402
from policy.scripted import ScriptedPolicy  # noqa: E402
from policy.uniform import RandomPolicy  # noqa: E402
from worlds.tally import Tally  # noqa: E402

# Actions the random policy never takes: malformed, out of range, refused, raising, hiring.
SCRIPT = (
    "add 2",
    "bogus 1",
    "add 9",
    'note "forbidden word"',
    "crash 1",
    "hire worker",
    'msg 99 "anyone"',
    'msg 1 "hello"',
    "fire 5",
    "wait 0",
    "wait 3",
    'post all "news"',
    "read all",
    'put "a note"',
    'search "note"',
    "mark red",
)


def scripted(req: PolicyRequest) -> str:
    return SCRIPT[(3 * req.agent + req.turn) % len(SCRIPT)]


class Brittle(Tally):
    """Tally with a tool that fails the way a buggy world does (not a ToolError): the episode
    ends ``world_error`` at the first crash."""

    @tool(duration=1.0)
    def crash(self, agent: int, n: Annotated[int, Range(1, 2)]) -> str:
        """a bug"""
        raise RuntimeError(f"bug number {n}")


GOLDEN = ROOT / "bench" / "results" / "engine" / "golden.json"


def cases() -> list[tuple[str, EpisodeConfig, Policy]]:
    out: list[tuple[str, EpisodeConfig, Policy]] = []
    for agents in (1, 4, 30):
        for seed in (0, 1, 2):
            for budget in (0, 2):
                cfg = EpisodeConfig(
                    world="tally",
                    agents=agents,
                    world_seed=seed,
                    sample_seed=seed + 7,
                    time_limit=300.0,
                    budget=budget,
                )
                out.append((f"tally-a{agents}-s{seed}-b{budget}", cfg, RandomPolicy()))
    for overflow in ("drop_newest", "drop_oldest"):
        cfg = EpisodeConfig(
            world="tally",
            agents=12,
            world_seed=3,
            sample_seed=4,
            mailbox=1,
            overflow=overflow,
            max_wait=20,
            budget=1,
            channel_history=3,
            archive_size=4,
            time_limit=200.0,
        )
        out.append((f"tally-a12-mailbox1-{overflow}", cfg, RandomPolicy()))
    cfg = EpisodeConfig(
        world="tally", agents=5, time_limit=50.0, max_events=300, keep_prompts=False
    )
    out.append(("tally-a5-event-limit", cfg, RandomPolicy()))
    for org, activity in (("flat", 1.0), ("city", 1.0), ("city", 0.2)):
        cfg = EpisodeConfig(world=CROWD, agents=40, org=org, time_limit=60.0, max_wait=30)
        out.append((f"crowd-a40-{org}-{activity:g}", cfg, SparsePolicy(activity)))
    for budget in (0, 2):
        cfg = EpisodeConfig(
            world="bench.golden:Brittle", agents=6, budget=budget, mailbox=2, time_limit=80.0
        )
        out.append((f"scripted-brittle-b{budget}", cfg, ScriptedPolicy(scripted)))
        # The same script where "crash" is an unknown tool: every other action, to the end.
        cfg = msgspec.structs.replace(cfg, world="tally")
        out.append((f"scripted-tally-b{budget}", cfg, ScriptedPolicy(scripted)))
    for agents, org in ((1, "flat"), (5, "flat"), (6, "islands:2")):
        cfg = EpisodeConfig(
            world="wildfire", agents=agents, org=org, world_seed=agents, time_limit=300.0
        )
        out.append((f"wildfire-a{agents}-{org}", cfg, RandomPolicy()))
    return out


def concurrent() -> list[bytes]:
    """Three episodes in one conductor share policy batches; each must still be its own."""
    cfgs = [
        EpisodeConfig(world="tally", agents=n, world_seed=n, sample_seed=n, time_limit=120.0)
        for n in (2, 5, 9)
    ]
    return [encode_episode(ep) for ep in run_episodes(cfgs, RandomPolicy(), concurrency=3)]


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def compute(known_only: bool = False) -> dict[str, dict[str, str]]:
    """Every case's digests; with ``known_only``, cases of worlds this engine does not have
    (an older ref than the case) are left out rather than failing."""
    from collective.engine.registry import resolve_world

    result = {}
    for name, cfg, policy in cases():
        if known_only:
            try:
                resolve_world(cfg.world)
            except ValueError:
                continue
        ep = run_episode(cfg, policy)
        forked = fork(ep, cfg.time_limit / 3, RandomPolicy(), sample_seed=99)
        result[name] = {
            "episode": digest(encode_episode(ep)),
            "replay": digest(encode_episode(replay(ep))),
            "fork": digest(encode_episode(forked)),
        }
    for org in ("flat", "city"):  # one large episode each: batches of thousands
        cfg = EpisodeConfig(world=CROWD, agents=2000, org=org, time_limit=15.0, max_wait=10)
        data = encode_episode(run_episode(cfg, SparsePolicy(0.5)))
        result[f"crowd-a2000-{org}"] = {"episode": digest(data), "replay": "", "fork": ""}
    for i, data in enumerate(concurrent()):
        result[f"concurrent-{i}"] = {"episode": digest(data), "replay": "", "fork": ""}
    return result


def at_ref(ref: str) -> dict[str, dict[str, str]]:
    """The digests the engine at git ``ref`` gives for the same cases (this file's)."""
    # (imported here: this file runs on the engine at the ref too, which may not have it)
    from experiments.gitref import engine_at, python_env

    with tempfile.TemporaryDirectory() as tmp:
        engine_at(ref, Path(tmp), ROOT)
        shutil.copytree(
            ROOT / "bench", Path(tmp) / "bench", ignore=shutil.ignore_patterns("results")
        )
        done = subprocess.run(
            [sys.executable, str(Path(tmp) / "bench" / "golden.py"), "--print"],
            cwd=tmp,
            env=python_env(Path(tmp)),
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise SystemExit(f"golden: the cases fail on the engine at {ref}:\n{done.stderr}")
    return json.loads(done.stdout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--record", action="store_true", help="write the digests instead of checking")
    p.add_argument("--against", metavar="REF", help="compare with the engine at this git ref")
    p.add_argument("--print", action="store_true", help="print the digests as JSON and exit")
    p.add_argument("--file", type=Path, default=GOLDEN)
    a = p.parse_args()
    logsetup.configure(0)
    # The Brittle world's bug is on purpose: its warnings would only bury the verdict.
    logging.getLogger("collective").setLevel(logging.ERROR)
    got = compute(known_only=a.print)
    if a.print:
        print(json.dumps(got, sort_keys=True))
        return 0
    if a.record:
        a.file.parent.mkdir(parents=True, exist_ok=True)
        a.file.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"recorded {len(got)} golden digests in {a.file}")
        return 0
    want = at_ref(a.against) if a.against else json.loads(a.file.read_text())
    new = sorted(set(got) - set(want)) if a.against else []  # worlds the ref does not have
    bad = [
        f"{name}: {part} differs"
        for name in sorted((set(want) | set(got)) - set(new))
        for part in ("episode", "replay", "fork")
        if want.get(name, {}).get(part) != got.get(name, {}).get(part)
    ]
    for line in bad:
        print(line)
    if new:
        print(f"not at {a.against} (its engine lacks their world): {', '.join(new)}")
    print(f"{len(want) - len({b.split(':')[0] for b in bad})} of {len(want)} configs identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
