"""Instructions per agent-turn: the engine, SimPy, the bare trio floor and the turns' own work,
counted by valgrind.

``bench/engine.py``'s comparison times the three side by side, but on a shared 2-core machine
the same code's CPU time per turn swings by half between runs. An instruction count does not:
repeated runs agree within about 0.1%. So this script runs each case of the comparison (same
world, policy, records: ``bench.engine.comparison_config``) under ``valgrind --tool=callgrind``
in a fresh process, once to warm up and once counted (collection is on only inside
``sys.call_tracing``, so imports, set-up and the warm-up are not counted), and divides the
count by the agent-turns played. The ratio SimPy / engine is the engine's speed relative to
SimPy in instructions (1.0 = as fast); floor / engine is how much of the engine's cost is
trio's own scheduling in the engine's pattern (``bench.engine.play_floor``). The work
(``bench.engine.play_work``) is the engine's turns done with no scheduler at all, as SimPy's
processes do each one; SimPy / (floor + work) is the ceiling, the most an engine whose agents
are trio tasks could reach with no bookkeeping of its own, and engine - floor - work is that
bookkeeping (batches, the agenda, the event record, quiescence), per turn.

    python bench/engine_instructions.py            # 1,000 agents, activity 1, 0.1, 0.01
    python bench/engine_instructions.py --quick    # 100 agents, activity 1 (a few minutes)

Writes ``bench/results/engine/instructions.json`` (``--out`` to change it). Needs valgrind.
Instructions are not time (a cache miss costs more than an add), so the wall and CPU figures of
``bench/engine.py`` stay the issue's measure; this one says which way a change moved the code.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "engine" / "instructions.json"
SYSTEMS = ("engine", "simpy", "floor", "work")


def child(system: str, agents: int, activity: float, turns: int) -> None:
    """In the process valgrind runs: play the case twice, the second inside sys.call_tracing
    (the only frame callgrind collects in), and print the agent-turns it played."""
    import bench.engine as engine
    from bench.city import SparsePolicy

    cfg = engine.comparison_config(agents, activity, turns)
    if system in ("floor", "work"):  # the engine's own turns, read from an uncounted run
        engine.learn_case(cfg, activity, engine.play_engine(cfg, SparsePolicy(activity))[2])
    play = engine.SYSTEMS[system][1]  # the comparison's own way to play this system

    def once() -> int:
        return play(cfg, SparsePolicy(activity))[0]

    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True,
                   capture_output=True)  # fmt: skip
    once()  # warm: first-call costs (imports inside, caches) are not the engine's per turn
    played = sys.call_tracing(once, ())
    print(json.dumps({"turns": played}))


def count(system: str, agents: int, activity: float, turns: int) -> dict[str, Any]:
    """Run ``child`` under callgrind and read its total instruction count."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            "--collect-atstart=no",
            "--toggle-collect=sys_call_tracing",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--child",
            f"{system},{agents},{activity},{turns}",
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        if done.returncode != 0:
            raise RuntimeError(f"{system} under valgrind failed: {done.stderr[-2000:]}")
        played = json.loads(done.stdout.strip().splitlines()[-1])["turns"]
        text = out.read_text(errors="replace")
        total = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
        if total is None:
            raise RuntimeError(f"no instruction total in callgrind's output for {system}")
        ir = int(total.group(1))
    return {
        "turns": played,
        "instructions": ir,
        "per_turn": ir / played,
        "valgrind_s": round(time.perf_counter() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=1_000)
    p.add_argument("--activities", default="1,0.1,0.01")
    p.add_argument("--turns", type=int, default=20_000, help="agent-turns a case aims at")
    p.add_argument("--quick", action="store_true", help="100 agents, activity 1, 2,000 turns")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="valgrind runs at once")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        system, agents, activity, turns = a.child.split(",")
        child(system, int(agents), float(activity), int(turns))
        return 0
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("needs valgrind (apt install valgrind)", file=sys.stderr)
        return 2
    agents, turns = (100, 2_000) if a.quick else (a.agents, a.turns)
    activities = [1.0] if a.quick else [float(x) for x in a.activities.split(",")]
    out = a.out or (OUT.with_name("instructions-quick.json") if a.quick else OUT)
    jobs = [(s, x) for x in activities for s in SYSTEMS]
    rows: dict[float, dict[str, Any]] = {x: {"agents": agents, "activity": x} for x in activities}
    # Instruction counts do not depend on what else runs, so the runs may share the cores.
    with ThreadPoolExecutor(a.jobs) as pool, tqdm(total=len(jobs), desc="valgrind") as bar:
        counted = {job: pool.submit(count, job[0], agents, job[1], turns) for job in jobs}
        for future in as_completed(counted.values()):
            future.result()  # (an error here, not after the rest)
            bar.update()
    for (system, x), future in counted.items():
        rows[x][system] = future.result()
    table = []
    for x in activities:
        r = rows[x]
        per = {k: r[k]["per_turn"] for k in SYSTEMS}
        r["simpy_over_engine"] = per["simpy"] / per["engine"]
        r["floor_share"] = per["floor"] / per["engine"]
        # SimPy / (floor + work): the most an engine of trio tasks with no bookkeeping could
        # reach (bench.engine.play_work); the engine's own bookkeeping is what it pays above.
        r["ceiling"] = per["simpy"] / (per["floor"] + per["work"])
        r["bookkeeping_per_turn"] = per["engine"] - per["floor"] - per["work"]
        table.append(r)
    result = {"python": sys.version.split()[0], "rows": table}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"instructions per agent-turn, {agents:,} agents (valgrind callgrind)")
    print(
        f"{'activity':>8} {'engine':>9} {'SimPy':>9} {'floor':>9} {'work':>9} "
        f"{'SimPy/engine':>13} {'ceiling':>8} {'bookkeeping':>12}"
    )
    for r in table:
        e, s, f, w = (r[k]["per_turn"] / 1000 for k in SYSTEMS)
        print(
            f"{r['activity']:>8g} {e:>8.1f}k {s:>8.1f}k {f:>8.1f}k {w:>8.1f}k "
            f"{r['simpy_over_engine']:>12.2f}x {r['ceiling']:>7.2f}x "
            f"{r['bookkeeping_per_turn'] / 1000:>11.1f}k"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
