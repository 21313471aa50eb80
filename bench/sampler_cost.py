"""What the batch-invariant sampler costs: tokens/s of ``TinyModel.sample`` on this tree against
the same at a git ref (by default ``main``), side by side.

Both sample the same requests (recorded from real concurrent ``workshop`` episodes, the training
default world) with the same weights (``TinyConfig()``, the README's main job's shape) at several
batch sizes, one sampling thread each. The two run as two worker processes (the ref's
``collective/``, ``policy/`` and ``worlds/`` from ``git archive``) that take turns, batch size by
batch size and round by round, so the machine's load falls on both alike; the figure is the
ratio of the best of ``--rounds`` per batch size, on CPU seconds (what a core costs) and on wall
seconds. Prints a table and saves ``sampler_cost.json`` to ``--out``.

    python bench/sampler_cost.py [--against REF] [--sizes 1,16,256] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

OUT = ROOT / "bench" / "results" / "sampler_cost"


def worker(pool_file: Path) -> None:
    """Answer lines on stdin: a batch size in, ``[wall s, CPU s, tokens]`` of one call out; on
    the engine its ``PYTHONPATH`` names (the tree under test), imported only here."""
    import msgspec
    import torch

    import collective  # noqa: F401  (the engine before policy: policy.base imports it)
    from collective.base.seeding import derive
    from policy.tiny import TinyConfig, TinyModel

    torch.set_num_threads(1)
    pool = pickle.loads(pool_file.read_bytes())
    model = TinyModel.fresh(TinyConfig(), workers=1, max_rows=4096)
    for salt, line in enumerate(sys.stdin):
        n = int(line)
        batch = [
            msgspec.structs.replace(pool[i % len(pool)], seed=derive(salt, i)) for i in range(n)
        ]
        t0, c0 = time.perf_counter(), time.process_time()
        tokens = sum(len(r.token_ids) for r in model.sample(batch))
        print(json.dumps([time.perf_counter() - t0, time.process_time() - c0, tokens]), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", default="main", metavar="REF")
    p.add_argument("--sizes", default="1,16,256")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]

    from bench.policy_speed import record_workload
    from experiments.gitref import engine_at, python_env
    from policy.tiny import TinyConfig

    pool = record_workload(TinyConfig(), "workshop", (2, 4), episodes=8, limit=300.0)
    with tempfile.TemporaryDirectory(prefix="sampler-cost-") as tmp:
        old = engine_at(a.against, Path(tmp) / "ref", ROOT)
        pool_file = Path(tmp) / "pool.pickle"
        pool_file.write_bytes(pickle.dumps(pool))
        trees = {"this": ROOT, a.against: old}
        procs = {
            name: subprocess.Popen(
                [sys.executable, __file__, "--worker", str(tree), str(pool_file)],
                cwd=tree,
                env=python_env(tree),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for name, tree in trees.items()
        }
        best: dict[tuple[str, int], list[float]] = {}
        for r in range(a.rounds + 1):  # round 0 warms up and is not counted
            for n in sizes:
                for name, proc in procs.items():
                    assert proc.stdin is not None and proc.stdout is not None
                    proc.stdin.write(f"{n}\n")
                    proc.stdin.flush()
                    wall, cpu, tokens = json.loads(proc.stdout.readline())
                    if r:
                        got = best.setdefault((name, n), [wall / tokens, cpu / tokens])
                        got[:] = [min(got[0], wall / tokens), min(got[1], cpu / tokens)]
            print(f"round {r} of {a.rounds} done", file=sys.stderr, flush=True)
        for proc in procs.values():
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait()
    rows = []
    ref = f"{a.against} tok/s"
    print(f"{'batch':>6} {'this tok/s':>11} {ref:>12} {'CPU ratio':>10} {'wall ratio':>10}")
    for n in sizes:
        (tw, tc), (ow, oc) = best["this", n], best[a.against, n]
        row = {
            "batch": n,
            "this_tokens_per_cpu_s": round(1 / tc),
            "ref_tokens_per_cpu_s": round(1 / oc),
            "cpu_cost_ratio": round(tc / oc, 3),
            "wall_cost_ratio": round(tw / ow, 3),
        }
        rows.append(row)
        print(
            f"{n:>6} {row['this_tokens_per_cpu_s']:>11} {row['ref_tokens_per_cpu_s']:>12} "
            f"{row['cpu_cost_ratio']:>10} {row['wall_cost_ratio']:>10}"
        )
    a.out.mkdir(parents=True, exist_ok=True)
    result = {"against": a.against, "rounds": a.rounds, "requests": len(pool), "rows": rows}
    (a.out / "sampler_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker(Path(sys.argv[sys.argv.index("--worker") + 2]))
    else:
        sys.exit(main())
