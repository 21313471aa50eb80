"""Which findings of the signs-of-life study a policy that never learns already shows.

Runs random, the untrained tiny policy (several initial weights) and each scripted control of
``policy/scripted.py`` (an oracle that passes keys by message and avoids clashes; hire-everyone
working slot 1; never-pass-keys, which talks as much as the oracle but names no key; no
communication at all) through one protocol on the workshop's ``FINDINGS`` variant
(worlds/workshop.py), and says for each finding whether each policy shows it:

1. useful work (world tool calls that landed, as ``collective/records/signs.py`` counts them) of a
team
   of 8 against the average rollout of teams 1, 2, 3, 4, 8 on the same instances: below 1 ("an
   untrained big team starts below") or at least 1.8 ("reaches about twice"); flat teams and a
   CEO hiring up to team - 1;
2. communication (message and post tokens per agent-second alive), with the score it buys;
3. a solo agent given a flat team of 8's output tokens (so no organisation contains the solo):
   the time it needs to reach the team's score over the team's, censored where the tokens run out
   first, and how often the horizon (not the tokens) stopped it; and its early lead.

A finding a script or an untrained policy reproduces is built into the world, not learned; the
world leaves something to learn when the oracle clearly beats random, untrained and the
no-communication script.

    nice .venv/bin/python bench/findings_controls.py            # a few minutes
    nice .venv/bin/python bench/findings_controls.py --bytes    # the prompt byte table alone
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from collective import Episode, EpisodeConfig, latency_preset, run_episodes
from policy.scripted import ScriptedPolicy, workshop_scripts
from policy.tiny import TinyConfig, TinyModel, TinyPolicy
from policy.uniform import RandomPolicy
from worlds.workshop import FINDINGS

ROOT = Path(__file__).resolve().parent.parent

OUT = ROOT / "bench" / "results" / "findings_controls"
TEAMS = (1, 2, 3, 4, 8)
LIMIT = 180.0
HORIZON = 16  # the solo may run this many times the team's limit: it should rarely get there
MAX_TOKENS = 24
CONTEXT = 256  # the tiny model's context for this world: the inbox fits (--bytes)
MODEL = TinyConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, context=CONTEXT)


def config(team: int, instance: int, org: str, limit: float, latency: str) -> EpisodeConfig:
    agents, budget = (1, team - 1) if org == "ceo" else (team, 0)
    return EpisodeConfig(
        world="workshop",
        params=dict(FINDINGS),
        org=org,
        agents=agents,
        world_agents=team,
        budget=budget,
        world_seed=70_000 + instance,
        sample_seed=instance,
        time_limit=limit,
        max_output_tokens=MAX_TOKENS,
        latency=latency_preset(latency),
        tokenizer="bytes",
    )


def play(kind: str, seed: int, cfgs: list[EpisodeConfig]) -> list[Episode]:
    """Episodes of ``cfgs`` under one policy: a script gets a fresh state per episode."""
    scripts = workshop_scripts()
    if kind in scripts:
        return [run_episodes([c], ScriptedPolicy(scripts[kind]()), concurrency=1)[0] for c in cfgs]
    if kind == "random":
        return run_episodes(cfgs, RandomPolicy(), concurrency=len(cfgs))
    tiny = TinyPolicy(TinyModel.fresh(TinyConfig(**{**_fields(MODEL), "seed": seed})))
    return run_episodes(cfgs, {"trained": tiny, "frozen": tiny}, concurrency=len(cfgs))


def _fields(cfg: TinyConfig) -> dict[str, Any]:
    return {f: getattr(cfg, f) for f in cfg.__struct_fields__}


def landed(ep: Episode) -> int:
    return sum(1 for t in ep.turns if t.kind == "world" and t.ok)


def talk(ep: Episode) -> int:
    return sum(len(t.token_ids) for t in ep.turns if t.tool in ("msg", "post") and t.ok)


def agent_seconds(ep: Episode) -> float:
    from collective.records import Fired, Spawned

    born = {e.agent: e.t for e in ep.events if isinstance(e, Spawned)}
    gone: dict[int, float] = {}
    for e in ep.events:
        if isinstance(e, Fired):
            gone.setdefault(e.target, e.t)
    return float(sum(max(0.0, gone.get(a, ep.duration) - t0) for a, t0 in born.items()))


def by_team(kind: str, seeds: list[int], n: int, org: str, latency: str) -> dict[str, Any]:
    """Per seed x team x instance: landed units, agents, talk per agent-second, score."""
    units, agents, comm, score, taught = [], [], [], [], []
    for s in seeds:
        cfgs = [config(t, i, org, LIMIT, latency) for t in TEAMS for i in range(n)]
        eps = play(kind, s, cfgs)
        shape = (len(TEAMS), n)
        units.append(np.array([landed(e) for e in eps], float).reshape(shape))
        agents.append(np.array([len(agents_of(e)) for e in eps], float).reshape(shape))
        comm.append(np.array([talk(e) / max(agent_seconds(e), 1e-9) for e in eps]).reshape(shape))
        score.append(np.array([e.score for e in eps]).reshape(shape))
        taught.append(np.array([e.world_metrics.get("taught", 0) for e in eps]).reshape(shape))
    u, a = np.array(units), np.array(agents)
    avg = u.mean(axis=(1, 2), keepdims=True)  # each seed's average rollout, every team alike
    rel = np.where(avg > 0, u / np.maximum(avg, 1e-9), 0.0)
    per_agent = u / a
    pa_avg = per_agent.mean(axis=(1, 2), keepdims=True)
    return {
        "landed_rel": dict(
            zip(map(str, TEAMS), rel.mean(axis=(0, 2)).round(3).tolist(), strict=True)
        ),
        "landed_rel_per_seed_team8": rel[:, -1].mean(axis=1).round(3).tolist(),
        "landed_per_agent_rel": dict(
            zip(
                map(str, TEAMS),
                (per_agent / np.maximum(pa_avg, 1e-9)).mean(axis=(0, 2)).round(3).tolist(),
                strict=True,
            )
        ),
        "agents": dict(zip(map(str, TEAMS), a.mean(axis=(0, 2)).round(2).tolist(), strict=True)),
        "talk_per_agent_second": dict(
            zip(map(str, TEAMS), np.array(comm).mean(axis=(0, 2)).round(4).tolist(), strict=True)
        ),
        "score": dict(
            zip(map(str, TEAMS), np.array(score).mean(axis=(0, 2)).round(3).tolist(), strict=True)
        ),
        "keys_taught": dict(
            zip(map(str, TEAMS), np.array(taught).mean(axis=(0, 2)).round(2).tolist(), strict=True)
        ),
    }


def agents_of(ep: Episode) -> set[int]:
    from collective.records import Spawned

    return {e.agent for e in ep.events if isinstance(e, Spawned)}


def curve_at(curve: list[tuple[float, float]], t: float) -> float:
    v = 0.0
    for at, s in curve:
        if at > t:
            break
        v = s
    return v


def first_at(curve: list[tuple[float, float]], level: float) -> float | None:
    return next((t for t, s in curve if s >= level - 1e-9), None)


def solo(kind: str, seeds: list[int], n: int, latency: str) -> dict[str, Any]:
    """A flat team of 8 at LIMIT against a solo on the same instances, allowed the team's output
    tokens (or HORIZON times the limit, whichever comes first)."""
    rows = []
    for s in seeds:
        team = play(kind, s, [config(8, i, "flat", LIMIT, latency) for i in range(n)])
        one = play(kind, s, [config(1, i, "flat", LIMIT * HORIZON, latency) for i in range(n)])
        for c, o in zip(team, one, strict=True):
            budget = c.stats.output_tokens
            spent, stop = 0, None
            for t in sorted(o.turns, key=lambda t: t.answered):
                spent += len(t.token_ids)
                if spent >= budget:
                    stop = t.answered
                    break
            ran_out = stop is not None
            stop = o.duration if stop is None else stop
            level = c.score
            t_team = first_at(c.curve, level) if level > 0 else None
            t_solo = first_at(o.curve, level) if level > 0 else None
            reached = t_solo is not None and t_solo <= stop
            used = sum(len(t.token_ids) for t in o.turns if reached and t.answered <= t_solo)
            grid = np.linspace(0, LIMIT, 37)
            lead = max(curve_at(o.curve, g) - curve_at(c.curve, g) for g in grid)
            rows.append(
                {
                    "team_score": level,
                    "team_tokens": budget,
                    "solo_end": "budget" if ran_out else o.end,
                    "solo_stopped_at": stop,
                    "solo_score_at_stop": curve_at(o.curve, stop),
                    "ratio": (t_solo / t_team) if reached and t_team else None,
                    "solo_tokens_to_team_score_over_team_tokens": (
                        round(used / budget, 3) if reached and budget else None
                    ),
                    "censored": not reached,
                    "solo_early_lead": lead,
                }
            )
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    thrift = [
        r["solo_tokens_to_team_score_over_team_tokens"]
        for r in rows
        if r["solo_tokens_to_team_score_over_team_tokens"] is not None
    ]
    return {
        "instances": rows,
        "ratio_mean_uncensored": float(np.mean(ratios)) if ratios else None,
        "censored_share": float(np.mean([r["censored"] for r in rows])),
        "solo_tokens_to_team_score_over_team_tokens": float(np.mean(thrift)) if thrift else None,
        "horizon_share": float(np.mean([r["solo_end"] == "time_limit" for r in rows])),
        "solo_ends": {
            e: sum(r["solo_end"] == e for r in rows)
            for e in ("budget", "done", "time_limit", "idle")
        },
        "budget_ran_out_share": float(np.mean([r["solo_end"] == "budget" for r in rows])),
        "done_first_share": float(np.mean([r["solo_end"] == "done" for r in rows])),
        "solo_time_to_spend_budget_over_limit": float(
            np.mean(
                [r["solo_stopped_at"] / LIMIT for r in rows if r["solo_end"] == "budget"] or [0]
            )
        ),
        "solo_early_lead_max": float(max(r["solo_early_lead"] for r in rows)),
    }


def prompt_bytes(latency: str, n: int = 2) -> dict[str, Any]:
    """Bytes each part of a prompt takes, on real prompts (untrained tiny policy, 180 s): of
    FINDINGS episodes (a flat team of 8), and of the study's world as it was (the default
    layout, bench/signs_of_life.py's FAIR, a CEO hiring up to 7); and how often the model sees
    the whole inbox line at each context (``fit_prompt``, 24-token answers)."""
    from policy.tiny.decode import fit_prompt

    old = {"modules": 32, "holders": "first", "onboard_seconds": 20.0}
    cases = {
        "findings (terse), flat 8": [config(8, i, "flat", LIMIT, latency) for i in range(n)],
        "signs_of_life FAIR (default layout), ceo 8": [
            msgspec.structs.replace(config(8, i, "ceo", LIMIT, latency), params=old)
            for i in range(n)
        ],
    }
    out: dict[str, Any] = {}
    for name, cfgs in cases.items():
        eps = play("untrained", 0, cfgs)
        parts: dict[str, list[int]] = {}
        seen: dict[int, list[float]] = {128: [], 192: [], 256: []}
        for ep in eps:
            for t in ep.turns:
                lines = t.prompt.split("\n")
                cut = (
                    min(i for i in (lines[0].find("1=m"), lines[0].find("slots:")) if i >= 0)
                    if ("1=m" in lines[0] or "slots:" in lines[0])
                    else len(lines[0])
                )
                row = {
                    "observation: header (built, keys, wanted)": len(lines[0][:cut].encode()),
                    "observation: desk (slots)": len(lines[0][cut:].encode()),
                    "inbox line": sum(
                        len(x.encode()) + 1 for x in lines if x.startswith("inbox: ")
                    ),
                    "channel lines": sum(len(x.encode()) + 1 for x in lines if x.startswith("#")),
                    "last: line and '>'": sum(
                        len(x.encode()) + 1 for x in lines if x.startswith(("last: ", ">"))
                    ),
                    "whole prompt": len(t.prompt.encode()),
                }
                for k, v in row.items():
                    parts.setdefault(k, []).append(v)
                inbox = next((x for x in lines if x.startswith("inbox: ")), "")
                if inbox:
                    for ctx in seen:
                        kept = bytes(fit_prompt(t.prompt, ctx - MAX_TOKENS)[1:])
                        seen[ctx].append(float(inbox.encode() in kept))
        out[name] = {
            "turns": len(parts["whole prompt"]),
            "parts_share_median_p90_where_present": {
                k: [
                    round(float(np.mean(np.array(v) > 0)), 3),
                    float(np.median([x for x in v if x > 0] or [0])),
                    float(np.percentile([x for x in v if x > 0] or [0], 90)),
                ]
                for k, v in parts.items()
            },
            "inbox_wholly_seen_share_by_context": {
                str(c): round(float(np.mean(v)), 3) if v else None for c, v in seen.items()
            },
        }
    return out


def verdicts(res: dict[str, Any]) -> dict[str, dict[str, bool]]:
    """Per finding and policy: does it show it (without learning)?"""
    out: dict[str, dict[str, bool]] = {}
    for kind, r in res["policies"].items():
        for org in ("flat", "ceo"):
            rel8 = r[org]["landed_rel"]["8"]
            out.setdefault(f"team 8 below the average rollout ({org})", {})[kind] = rel8 < 1.0
            out.setdefault(f"team 8 at >= 1.8x the average rollout ({org})", {})[kind] = rel8 >= 1.8
        s = r["solo"]
        ratio = s["ratio_mean_uncensored"]
        out.setdefault(
            "solo needs >= 3x the team's time to its score (uncensored, horizon < 25%)", {}
        )[kind] = bool(ratio is not None and ratio >= 3 and s["horizon_share"] < 0.25)
        out.setdefault("solo leads early (by >= 2 of 64 modules)", {})[kind] = (
            s["solo_early_lead_max"] >= 2 / 64
        )
        f = r["flat"]
        out.setdefault("team 8 passes keys by message (flat)", {})[kind] = f["keys_taught"]["8"] > 0
        out.setdefault("team 8 talks more per agent-second than the untrained (flat)", {})[kind] = (
            f["talk_per_agent_second"]["8"]
            > res["policies"]["untrained"]["flat"]["talk_per_agent_second"]["8"]
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--instances", type=int, default=6)
    p.add_argument("--seeds", type=int, default=2, help="untrained initial weights")
    p.add_argument("--latency", default="tiny-paced")
    p.add_argument("--bytes", action="store_true", help="only the prompt byte table")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res: dict[str, Any] = {
        "world": {"name": "workshop", "params": FINDINGS},
        "protocol": {
            "teams": TEAMS,
            "limit": LIMIT,
            "solo_horizon": LIMIT * HORIZON,
            "instances": a.instances,
            "untrained_seeds": a.seeds,
            "latency": a.latency,
            "max_output_tokens": MAX_TOKENS,
            "tiny_context": CONTEXT,
        },
        "prompt_bytes": prompt_bytes(a.latency),
    }
    print(json.dumps(res["prompt_bytes"], indent=1), flush=True)
    if a.bytes:
        (a.out / "prompt_bytes.json").write_text(json.dumps(res["prompt_bytes"], indent=1) + "\n")
        return 0
    kinds = ["random", "untrained", *workshop_scripts()]
    res["policies"] = {}
    for kind in kinds:
        seeds = list(range(a.seeds)) if kind == "untrained" else [0]
        t1 = time.perf_counter()
        r = {org: by_team(kind, seeds, a.instances, org, a.latency) for org in ("flat", "ceo")}
        r["solo"] = solo(kind, seeds, a.instances, a.latency)
        res["policies"][kind] = r
        print(
            f"{kind:17s} flat landed/avg {r['flat']['landed_rel']} score {r['flat']['score']}\n"
            f"{'':17s} ceo  landed/avg {r['ceo']['landed_rel']} agents {r['ceo']['agents']}\n"
            f"{'':17s} talk/agent-s flat {r['flat']['talk_per_agent_second']}"
            f" keys taught {r['flat']['keys_taught']}\n"
            f"{'':17s} solo ratio {r['solo']['ratio_mean_uncensored']} censored "
            f"{r['solo']['censored_share']:.2f} horizon {r['solo']['horizon_share']:.2f} "
            f"budget ran out {r['solo']['budget_ran_out_share']:.2f} "
            f"lead {r['solo']['solo_early_lead_max']:.3f} ({time.perf_counter() - t1:.0f} s)",
            flush=True,
        )
    res["verdicts"] = verdicts(res)
    o8 = {k: res["policies"][k]["flat"]["score"]["8"] for k in kinds}
    res["something_to_learn"] = {
        "team8_flat_score": o8,
        "oracle_beats_random_untrained_no_communication": all(
            o8["oracle"] > 1.5 * o8[k] for k in ("random", "untrained", "no_communication")
        ),
    }
    res["wall_seconds"] = round(time.perf_counter() - t0, 1)
    for f, per in res["verdicts"].items():
        print(f"{f}: " + ", ".join(k for k, v in per.items() if v), flush=True)
    print(json.dumps(res["something_to_learn"]), flush=True)
    (a.out / "findings_controls.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
