"""Bit-exact reruns of a training run: the README's main job (``configs/quick.toml``) three times.

1. **twice**: two uninterrupted runs of the same config;
2. **killed twice**: a third run killed with SIGKILL (no cleanup runs) once its ``metrics.jsonl``
   has ``--kill-at`` steps, resumed with ``collective train --resume``, killed again at the
   second mark, and resumed to the end.

All three must write the same ``metrics.jsonl`` apart from the wall-clock fields (``WALL_CLOCK``:
how long things took and how requests happened to be batched) and the same episode files, byte
for byte. What makes that hold on any x86 CPU is the tiny policy's sampler
(``policy.tiny.invariant``): a request's tokens and logprobs do not depend on what shares its
batch, and how requests are batched is all that the wall clock decides.

Prints the verdict and saves ``rerun.json`` (``--out``); exits 1 on any difference. Run from the
repository root: ``python bench/rerun.py [--set steps=12 ...]`` (about three times the main
job's time: run it when the CPU is not shared with other measurements).
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

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "rerun"
#: The only fields of a metrics line a rerun does not reproduce (``collective.train.StepMetrics``).
WALL_CLOCK = frozenset(
    {"wall_time", "learner_seconds", "learner_tokens_per_s", "rollout_batch_mean"}
)


def collective(*args: str) -> list[str]:
    return [sys.executable, "-m", "collective.cli", *args]


def steps_written(run: Path) -> int:
    metrics = run / "metrics.jsonl"
    return metrics.read_text().count("\n") if metrics.exists() else 0


def kill_at(argv: list[str], run: Path, steps: int) -> None:
    """Run ``argv`` and SIGKILL it once ``run`` has ``steps`` metrics lines."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL)
    while steps_written(run) < steps:
        if proc.poll() is not None:
            raise SystemExit(f"the run ended (exit {proc.returncode}) before step {steps}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    print(f"killed at {steps_written(run)} steps", flush=True)


def comparable(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in WALL_CLOCK} for x in lines]


def differences(a: Path, b: Path) -> list[str]:
    """What differs between runs ``a`` and ``b``: metrics fields by step, then episode files."""
    out = []
    ma, mb = comparable(a), comparable(b)
    if len(ma) != len(mb):
        out.append(f"metrics: {len(ma)} vs {len(mb)} steps")
    for la, lb in zip(ma, mb, strict=False):
        out += [f"step {la['step']}: {k}" for k in sorted(la) if la[k] != lb.get(k)]
    ea = {p.name: p for p in (a / "episodes").glob("*.msgpack")}
    eb = {p.name: p for p in (b / "episodes").glob("*.msgpack")}
    out += [f"episode {n}: in one run only" for n in sorted(set(ea) ^ set(eb))]
    out += [
        f"episode {n}: bytes differ"
        for n in sorted(set(ea) & set(eb))
        if ea[n].read_bytes() != eb[n].read_bytes()
    ]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "quick.toml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--kill-at", default="7,23", help="the steps after which to kill (two)")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args()
    first, second = (int(x) for x in a.kill_at.split(","))
    sets = [x for kv in [*a.set, "plots=false"] for x in ("--set", kv)]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rerun-") as tmp:
        runs = {name: Path(tmp) / name for name in ("first", "second", "killed")}
        for name in ("first", "second"):
            print(f"run {name}", flush=True)
            argv = collective("train", str(a.config), "--out", str(runs[name]), *sets)
            subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        print("run killed twice", flush=True)
        killed = runs["killed"]
        kill_at(collective("train", str(a.config), "--out", str(killed), *sets), killed, first)
        kill_at(collective("train", "--resume", str(killed)), killed, second)
        resume = collective("train", "--resume", str(killed), "--quiet")
        subprocess.run(resume, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        rerun = differences(runs["first"], runs["second"])
        resumed = differences(runs["first"], killed)
        result = {
            "config": str(a.config.resolve().relative_to(ROOT)),
            "set": a.set,
            "steps": len(comparable(runs["first"])),
            "episodes": len(list((runs["first"] / "episodes").glob("*.msgpack"))),
            "killed_after_steps": [first, second],
            "rerun_differences": rerun[:20],
            "killed_twice_differences": resumed[:20],
            "fields_compared": sorted(comparable(runs["first"])[0]),
            "fields_not_compared": sorted(WALL_CLOCK),
            "last_step": json.loads((runs["first"] / "metrics.jsonl").read_text().splitlines()[-1]),
            "seconds": round(time.monotonic() - started, 1),
            "cpu": os.uname().machine,
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
