"""Do two roles trained apart improve together? (issue 30, item 4)

Trains ``configs/roles.toml`` (an orchestrator and its sub-agents on the workshop, each role
its own policy: ``role_policies = true``) at ``--seeds`` training seeds, and the same config with
one shared policy. Then every policy plays the same held-out task instances (``--instances`` per
team size, never trained on) through one protocol: random, each seed's untrained weights, its
shared policy, and its per-role policies whole and with one role's weights swapped back to the
untrained ones. Contrasts are
paired by seed and instance with a t-interval over the seeds (``collective.studies.intervals``):

- both trained - untrained: the per-role run learned;
- both trained - one role's weights untrained: what that role's own learning adds (one
  contrast a role);
- per role - shared: whether separate policies beat one shared policy at the same steps.

"Improve together" is said only where both roles' contributions lie above zero.

    python bench/role_policies.py            # 4 seeds x 24 steps x 2 runs, ~40 min on 2 cores
    python bench/role_policies.py --quick    # 2 seeds x 2 steps: the machinery only

Writes ``bench/results/role_policies/`` (``summary.json``, ``role_policies.png``, ``runs/``);
runs and measurements are re-used by digest, so a stopped study resumes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from tqdm import tqdm

from collective.engine.conductor import run_episodes
from collective.records import EpisodeConfig
from collective.rl.config import TrainConfig, load_config, mix
from collective.rl.roles import trained_roles
from collective.rl.rollouts import episode_config
from collective.studies.intervals import interval_text, paired_contrast, seed_interval
from experiments.resumable import digest, file_digest, train_digest, train_exact
from policy.roles import RolePolicy
from policy.tiny import TinyModel, TinyPolicy
from policy.uniform import RandomPolicy

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "role_policies"


def variant(cfg: TrainConfig, seed: int, per_role: bool) -> TrainConfig:
    fields = {**msgspec.to_builtins(cfg), "seed": seed, "role_policies": per_role}
    return msgspec.convert(fields, TrainConfig)


def held_out(cfg: TrainConfig, instances: int) -> list[EpisodeConfig]:
    """``instances`` task instances per team size, world seeds apart from training's, played as
    training plays them (the organisation, its budget, latency, tokens, temperature)."""
    (world,) = mix(cfg)
    return [
        episode_config(
            cfg,
            world,
            team,
            world_seed=10_000 + k,
            sample_seed=k,
            time_limit=world.time_limit_end,
            version=-1,
        )
        for team in world.team_sizes
        for k in range(instances)
    ]


def scores(configs: list[EpisodeConfig], policy: Any) -> list[float]:
    return [e.score for e in run_episodes(configs, policy, concurrency=16)]


def _train(args: tuple[str, str]) -> str:
    cfg = msgspec.json.decode(args[0], type=TrainConfig)
    return train_exact(cfg, Path(args[1]), log=lambda _: None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "roles.toml")
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--instances", type=int, default=16, help="held-out instances a team size")
    p.add_argument("--jobs", type=int, default=2, help="training runs at once")
    p.add_argument("--quick", action="store_true", help="2 seeds x 2 steps: the machinery only")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    base = load_config(a.config)
    if not base.role_policies:
        print(
            f"{a.config}: role_policies is off: this study is about per-role policies",
            file=sys.stderr,
        )
        return 2
    seeds, instances = (2, 3) if a.quick else (a.seeds, a.instances)
    if a.quick:
        base = msgspec.structs.replace(base, steps=2)
    out = a.out or (OUT / "quick" if a.quick else OUT)
    runs = {
        (kind, s): out / "runs" / f"{kind}-s{s}"
        for s in range(seeds)
        for kind in ("roles", "shared")
    }
    configs = {(kind, s): variant(base, s, kind == "roles") for kind, s in runs}
    jobs = [(msgspec.json.encode(configs[k]).decode(), str(runs[k])) for k in runs]
    ctx = multiprocessing.get_context("spawn")  # (a child of a process torch has used: spawn)
    with ctx.Pool(max(1, min(a.jobs, len(jobs)))) as workers:
        done = list(tqdm(workers.imap(_train, jobs), total=len(jobs), desc="train", unit="run"))
    print("training:", dict(zip((p.name for p in runs.values()), done, strict=True)))

    roles = trained_roles(base.org)
    cfgs = held_out(base, instances)
    measure = out / "measured.json"
    kept = json.loads(measure.read_text()) if measure.exists() else {}
    key = digest("random", msgspec.to_builtins(cfgs))
    if kept.get("random", {}).get("digest") != key:
        kept["random"] = {"digest": key, "scores": scores(cfgs, RandomPolicy())}
    table: dict[str, list[list[float]]] = {"random": [kept["random"]["scores"]]}
    for s in tqdm(range(seeds), desc="measure", unit="seed"):
        per_role = runs[("roles", s)] / "checkpoints" / "roles"
        shared = runs[("shared", s)] / "checkpoints" / "latest.pt"
        files = [per_role / r / "latest.pt" for r in roles] + [shared]
        key = digest(
            "roles",
            train_digest(configs[("roles", s)]),
            train_digest(configs[("shared", s)]),
            [file_digest(f) for f in files],
            msgspec.to_builtins(cfgs),
        )
        name = f"seed{s}"
        if kept.get(name, {}).get("digest") != key:
            fresh = TinyModel.fresh(configs[("roles", s)].tiny)
            trained = {r: TinyModel.load(per_role / r / "latest.pt") for r in roles}

            def with_trained(*which: str, trained: Any = trained, fresh: Any = fresh) -> Any:
                return RolePolicy(
                    {r: TinyPolicy(trained[r] if r in which else fresh) for r in roles}
                )

            kept[name] = {
                "digest": key,
                "untrained": scores(cfgs, TinyPolicy(fresh)),
                "shared": scores(cfgs, TinyPolicy(TinyModel.load(shared))),
                "both": scores(cfgs, with_trained(*roles)),
                **{
                    f"{r}_untrained": scores(cfgs, with_trained(*(x for x in roles if x != r)))
                    for r in roles
                },
            }
            measure.write_text(json.dumps(kept) + "\n")
        for kind, v in kept[name].items():
            if kind != "digest":
                table.setdefault(kind, []).append(v)
    measure.write_text(json.dumps(kept) + "\n")

    def c(x: str, y: str) -> dict[str, Any]:
        return msgspec.to_builtins(paired_contrast(table[x], table[y]))

    summary: dict[str, Any] = {
        "config": str(a.config.relative_to(ROOT) if a.config.is_relative_to(ROOT) else a.config),
        "seeds": seeds,
        "steps": base.steps,
        "instances_per_team": instances,
        "random": float(np.mean(table["random"])),
        "scores": {
            k: msgspec.to_builtins(seed_interval(np.mean(v, axis=1)))
            for k, v in table.items()
            if k != "random"
        },
        "contrasts": {
            "both - untrained": c("both", "untrained"),
            "both - random": c("both", "random"),
            **{
                f"both - {r}_untrained (the {r}'s learning)": c("both", f"{r}_untrained")
                for r in roles
            },
            "both - shared (per role vs one policy)": c("both", "shared"),
            "shared - untrained": c("shared", "untrained"),
        },
    }
    add = [summary["contrasts"][f"both - {r}_untrained (the {r}'s learning)"] for r in roles]
    summary["improve_together"] = all(x["lo"] is not None and x["lo"] > 0 for x in add)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(
        f"held-out score over {seeds} seeds x {instances} instances a team size "
        f"(random {summary['random']:.3f}):"
    )
    for k, r in summary["scores"].items():
        print(f"  {k:22s} {interval_text(r)}")
    for k, r in summary["contrasts"].items():
        print(f"  {k:60s} {interval_text(r)}")
    print("two roles improve together:", "yes" if summary["improve_together"] else "not shown")
    plot(summary, out / "role_policies.png")
    print(f"wrote {out}")
    return 0


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [
        "untrained",
        *(k for k in summary["scores"] if k.endswith("_untrained") and k != "untrained"),
        "both",
        "shared",
    ]
    means = [summary["scores"][k]["mean"] for k in kinds]
    errs = [
        0.0 if summary["scores"][k]["lo"] is None else means[i] - summary["scores"][k]["lo"]
        for i, k in enumerate(kinds)
    ]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(range(len(kinds)), means, yerr=errs, capsize=3, color="#4a7")
    ax.axhline(summary["random"], color="grey", ls="--", label="random")
    names = {"untrained": "untrained", "both": "both\n(per role)", "shared": "one shared\npolicy"}
    ax.set_xticks(
        range(len(kinds)),
        [names.get(k, k.replace("_untrained", "\nuntrained")) for k in kinds],
    )
    ax.set(
        ylabel="held-out score (95% t-interval over seeds)",
        title=f"A policy per role: {summary['seeds']} seeds x {summary['steps']} steps",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
