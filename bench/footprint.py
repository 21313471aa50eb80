"""Measure what a run holds, for the memory guard's constants (``collective/engine/limits.py``).

Each point runs in a fresh Python process and reports its peak resident set (``ru_maxrss``);
the cost of one unit is the slope between the smallest and the largest point, so the
interpreter, the imports and the allocator's fixed overhead cancel out:

- **per agent of a run**: ``collective run workshop --agents N --time-limit 3`` (every agent
  thinks at t=0: its actor, its observation and prompt, its request and response in the one
  big batch, its turn record on the way to disk; workshop's own modules measured apart and
  taken off);
- **per workshop module**: ``Workshop(n_agents=1, size=S)`` built, nothing else;
- **per training episode, in flight and then held for the learner**: ``collective train
  configs/quick.toml --set steps=1`` with ``groups_per_step = 1`` and ``group_size =
  concurrency`` at 64 and 256 (beyond the learner's 512-turn chunk at both, so its chunk's
  memory cancels out too).

Run: ``python bench/footprint.py`` (about five minutes on 2 shared cores; prints
JSON). ``--streamed`` adds the agents at 40,000 and 200,000 with the record streamed to
``--out`` (two more minutes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "collective.cli"]


def peak_rss(argv: list[str]) -> int:
    """Peak resident bytes of the process ``argv`` (it must exit 0)."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{argv} failed: {err[-500:]}")
    return usage.ru_maxrss * 1024  # kilobytes on Linux


def slope(points: dict[int, int]) -> float:
    lo, hi = min(points), max(points)
    return (points[hi] - points[lo]) / (hi - lo)


def main() -> None:
    out: dict[str, object] = {}
    build = "from worlds.workshop import Workshop; Workshop(n_agents=1, size={})"
    modules = {s: peak_rss([sys.executable, "-c", build.format(s)]) for s in (20_000, 400_000)}
    out["module_bytes"] = slope(modules)
    points: dict[str, dict[int, int]] = {"modules": modules}
    run = ["run", "workshop", "--time-limit", "3", "--agents"]
    # workshop sizes itself at size=4 modules per agent: those are the world's, not the run's
    points["agents"] = {n: peak_rss([*CLI, *run, str(n)]) for n in (2_000, 40_000)}
    out["agent_bytes"] = slope(points["agents"]) - 4 * out["module_bytes"]
    with tempfile.TemporaryDirectory() as tmp:
        if "--streamed" in sys.argv:
            streamed = [*CLI, *run[:-1], "--out", str(Path(tmp) / "e.msgpack"), "--agents"]
            points["streamed"] = {n: peak_rss([*streamed, str(n)]) for n in (40_000, 200_000)}
            out["agent_bytes_streamed"] = slope(points["streamed"]) - 4 * out["module_bytes"]
        train = [*CLI, "train", "configs/quick.toml", "--quiet", "--set", "steps=1"]
        train += ["--set", "plots=false", "--set", "groups_per_step=1"]
        points["train"] = {}
        for c in (64, 256):
            sizes = ["--set", f"concurrency={c}", "--set", f"group_size={c}"]
            points["train"][c] = peak_rss([*train, *sizes, "--out", str(Path(tmp) / f"r{c}")])
        out["train_episode_bytes"] = slope(points["train"])
        out["train_agent_bytes"] = out["train_episode_bytes"] / 3  # teams of 2 and 4
    out["points"] = points
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
