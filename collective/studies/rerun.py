"""Reruns of a training run, compared: what ``bench/rerun.py`` and the rerun tests share.

:func:`differences` names what differs between two run directories (metrics fields by step,
outside :attr:`StepMetrics.WALL_CLOCK`, then episode files byte for byte); :func:`loaded` is the
competition a rerun runs beside (CPU hogs, ``OMP_NUM_THREADS`` set or not), so that its batches,
pace and interleavings differ from the run it must match."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from collective.rl.rundir import StepMetrics


@contextlib.contextmanager
def loaded(hogs: int, delay: float, omp: str | None) -> Iterator[dict[str, str]]:
    """``hogs`` processes that each spin on a core, started ``delay`` seconds from now and
    stopped on leaving; yields the environment for the run beside them (``OMP_NUM_THREADS``
    set to ``omp``, or unset)."""
    spin = f"import time\ntime.sleep({delay})\nwhile True:\n    pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(hogs)]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    try:
        yield env
    finally:
        for p in procs:
            p.kill()
            p.wait()


def comparable(run: Path) -> list[dict]:
    """``run``'s metrics.jsonl lines without the wall-clock fields: what a rerun must match."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [
        {k: v for k, v in json.loads(x).items() if k not in StepMetrics.WALL_CLOCK} for x in lines
    ]


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
