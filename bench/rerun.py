"""Bit-exact reruns of a training run: the README's main job (``configs/quick.toml``) three times,
each on a loaded machine.

1. **twice**: two uninterrupted runs of the same config;
2. **killed twice**: a third run killed with SIGKILL (no cleanup runs) once its ``metrics.jsonl``
   has ``--kill-at`` steps, resumed with ``collective train --resume``, killed again at the
   second mark, and resumed to the end.

Every run (and each part of the killed one) competes with ``--hogs`` CPU hogs (processes that
spin on a core) started at another moment each time (``LOADS``: their delay and whether
``OMP_NUM_THREADS`` is set), so the rollouts' batches, the learner's pace and the threads'
interleaving differ from run to run, and so does Python's hash seed (each run a new process).

All three must write the same ``metrics.jsonl`` apart from the wall-clock fields
(``StepMetrics.WALL_CLOCK``: how long things took and how requests happened to be batched) and
the same episode files, byte for byte. What makes that hold is the tiny policy's sampler
(``policy.tiny.invariant``): a request's tokens and logprobs do not depend on what shares its
batch, and how requests are batched is all that the wall clock decides; and one instruction set
on every x86 CPU (``collective.ISA``), so that another machine's run is this one's too.

Prints the verdict and saves ``rerun.json`` (``--out``); exits 1 on any difference. Run from the
repository root: ``python bench/rerun.py [--set steps=12 ...] [--hogs 2]`` (three times the main
job's time and more: its hogs slow it down).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from collective.rl.rundir import StepMetrics
from collective.studies.rerun import comparable, differences, loaded

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "rerun"
#: Each run's competition: when its hogs start (seconds after it) and OMP_NUM_THREADS (None:
#: unset), the killed run's three parts in turn.
LOADS: dict[str, tuple[float, str | None]] = {
    "first": (0.0, None),
    "second": (7.5, "1"),
    "killed": (2.0, None),
    "resumed": (0.5, "1"),
    "resumed again": (4.0, None),
}


def collective(*args: str) -> list[str]:
    return [sys.executable, "-m", "collective.cli", *args]


def steps_written(run: Path) -> int:
    metrics = run / "metrics.jsonl"
    return metrics.read_text().count("\n") if metrics.exists() else 0


def kill_at(argv: list[str], run: Path, steps: int, env: dict[str, str] | None = None) -> None:
    """Run ``argv`` and SIGKILL it once ``run`` has ``steps`` metrics lines."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, env=env)
    while steps_written(run) < steps:
        if proc.poll() is not None:
            raise SystemExit(f"the run ended (exit {proc.returncode}) before step {steps}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    print(f"killed at {steps_written(run)} steps", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "quick.toml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--kill-at", default="7,23", help="the steps after which to kill (two)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--hogs", type=int, default=2, help="CPU hogs beside every run (0: none)")
    a = p.parse_args()
    first, second = (int(x) for x in a.kill_at.split(","))
    sets = [x for kv in [*a.set, "plots=false"] for x in ("--set", kv)]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rerun-") as tmp:
        runs = {name: Path(tmp) / name for name in ("first", "second", "killed")}
        for name in ("first", "second"):
            print(f"run {name}", flush=True)
            argv = collective("train", str(a.config), "--out", str(runs[name]), *sets)
            with loaded(a.hogs, *LOADS[name]) as env:
                subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env=env)
        print("run killed twice", flush=True)
        killed = runs["killed"]
        with loaded(a.hogs, *LOADS["killed"]) as env:
            start = collective("train", str(a.config), "--out", str(killed), *sets)
            kill_at(start, killed, first, env)
        with loaded(a.hogs, *LOADS["resumed"]) as env:
            kill_at(collective("train", "--resume", str(killed)), killed, second, env)
        resume = collective("train", "--resume", str(killed), "--quiet")
        with loaded(a.hogs, *LOADS["resumed again"]) as env:
            subprocess.run(resume, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env=env)
        rerun = differences(runs["first"], runs["second"])
        resumed = differences(runs["first"], killed)
        result = {
            "config": str(a.config.resolve().relative_to(ROOT)),
            "set": a.set,
            "steps": len(comparable(runs["first"])),
            "episodes": len(list((runs["first"] / "episodes").glob("*.msgpack"))),
            "killed_after_steps": [first, second],
            "hogs": a.hogs,
            "loads": {k: {"hogs_after_s": d, "OMP_NUM_THREADS": o} for k, (d, o) in LOADS.items()},
            "rerun_differences": rerun[:20],
            "killed_twice_differences": resumed[:20],
            "fields_compared": sorted(comparable(runs["first"])[0]),
            "fields_not_compared": sorted(StepMetrics.WALL_CLOCK),
            "last_step": json.loads((runs["first"] / "metrics.jsonl").read_text().splitlines()[-1]),
            "seconds": round(time.monotonic() - started, 1),
            "cpu": os.uname().machine,
            "load_average_after": os.getloadavg()[0],
        }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "rerun.json").write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"{result['steps']} steps, {result['episodes']} episodes: rerun "
        f"{'identical' if not rerun else f'{len(rerun)} differences'}; killed twice and "
        f"resumed {'identical' if not resumed else f'{len(resumed)} differences'} "
        f"({result['seconds']} s)"
    )
    for line in (rerun + resumed)[:20]:
        print(line)
    return 1 if rerun or resumed else 0


if __name__ == "__main__":
    sys.exit(main())
