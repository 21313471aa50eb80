"""Signs of life, earned: do collectives trained with RLCR learn to use parallel inference?

Trains the tiny policy with RLCR (collective/rl/train.py) on the workshop's ``FINDINGS`` variant
(worlds/workshop.py: its docstring tables which knob would force which finding, and what each
part of a prompt takes in bytes): one fixed 64-module task for every team size, every key with
agent 0 and keys passed by direct message only (so a lone agent can build everything and a team
must pass knowledge to use its hands), shared desks where overlapping units are refused and a
message heard mid-unit loses the unit (so an uncoordinated big team really pays), terse desks
that say who wants which key. Tokens cost time (latency ``tiny-paced``: 50 ms an output token),
so a solo spending a team's tokens needs measurably longer. The tiny model's context is 256
bytes, which holds the inbox in every prompt measured (128 showed it in about one in twenty).
The main run is a flat team of 1, 2, 3, 4 or 8 from the start, so the collective never contains
the solo it is compared with (a CEO starts alone: it is an organisation ablation here).

Each variant is trained with several seeds; every figure is then measured on held-out task
instances through one protocol for every kind of policy side by side: uniformly random,
untrained (each seed's initial weights), trained, and the scripted controls of
policy/scripted.py (``SCRIPTS``: an oracle that avoids clashes and passes keys, hire-everyone
working slot 1, never-pass-keys, no communication). A finding a control lacking the skill
(``CONTROLS``) also shows is built into the world: its "yes" is no yes. Where the oracle shows
it, the finding is attainable. Every figure has a mean over training seeds and its 95%
Student-t interval over the per-seed values, reported with them (collective/studies/intervals.py;
with 3 seeds the earlier bootstrap over seeds x instances covered 78-90% where it said 95%:
bench/coverage.py). Each finding is judged by paired contrasts, by (seed, instance): the
trained policy against the same seed's untrained weights and against random on the same
instances (and the claim's size, where it has one). Its p-value is the largest of its parts'
two-sided t-tests over seeds (1 for a part on the wrong side), and "yes" needs it below 5% after
Holm's correction over the PRIMARY findings, named in advance (SECONDARY ones are judged alone,
so said). Useful work is the world tool calls that landed, communication the message and post
tokens per agent-second (collective/records/signs.py; keys taught by message, ``taught``, beside
it).
The solo runs until it has spent the collective's output tokens or ``HORIZON`` times the limit;
its time to the collective's score is censored when it never gets there, compared by
restricted mean time (Kaplan-Meier), its censored share reported.

The findings, as the reference work states them:

1. a team of 5-8 starts below the average rollout in useful work and reaches about twice it
   (useful tokens per rollout / the average rollout of the same step, or of the same held-out
   evaluation: every team size's episodes on the same instances);
2. communication rises over training;
3. a solo agent given the collective's token budget needs about 4x as long to reach the
   collective's score, after an early phase where the solo leads;
4. ablations: no latency pressure (a constant limit ``LOOSE``, evaluated at its own limit and at
   the main run's, with the share of its episodes that the limit ends), pressure by a latency
   penalty in the return instead of the limit (``latency_penalty``, ``PENALTY``, at ``LOOSE``), a
   per-agent advantage (leave-one-out credit, collective/rl/credit.py, less the group's mean credit
   so it sums to zero), and three other organisations instead of the flat team: a CEO who
   hires, the orchestrator (the trained policy answers only for the orchestrator, agent 0;
   its sub-agents answer with the run's initial weights, frozen, and their turns are never
   training data) and islands (two groups, each on its own variant of the task; the
   organisation scores the better island). Each organisation's random and untrained baselines
   run through its own protocol (the same organisation, instances and limit).

Every run starts from the prior (``PRIOR``: the same weights for every seed; seeds differ in what
they sample and which instances they see), except ``main_scratch``, whose seeds each start from
their own fresh weights (TrainConfig sets the model's seed to the run's). A run's "untrained"
baseline is its starting weights, whichever they are.

Findings about change over training are read from the training curve held out: the main run's
saved checkpoints (step 0 = the initial weights, every ``snapshot_every`` steps, the last), each
evaluated on the same held-out instances at one limit (``EVAL_T``), seeds as the unit
(``training_curve.png``, ``training_curve_heldout`` in summary.json). The training steps' own
curves (each step at its own rising limit, steps not independent) are shown beside them as
notes, never as verdicts.

Resumable run by run (experiments.resumable): a training run is re-used only when the
digest of its full resolved TrainConfig (``runs/NAME-sSEED/config.digest``) matches, resumed (as
``collective train --resume``) when it matches but stopped midway, and trained afresh (the old
one moved aside) when it differs; a measurement (``measured/PART-nN.npz``) only when its digest,
over the run's digest, the trained checkpoint's bytes, its settings and MEASURE_VERSION, stored
beside it, matches. Stop it at any time and run the same command again.

    python bench/signs_of_life.py                 # everything: 7 variants x 3 seeds x 60 steps
    python bench/signs_of_life.py --only main --seeds 6   # the main run at the seed's scale
    python bench/signs_of_life.py --quick --out /tmp/sol
    python bench/signs_of_life.py --complete-only  # summarise the runs that finished, train none
    collective experiment signs-of-life --quick   # the same, from an installed copy too

The parallel jobs are forks of this process (each job a child that starts with everything this
one has imported, so a job pays no second start-up of torch), so it needs no checkout; its
results go to ``bench/results/signs_of_life`` in one, ``./signs_of_life`` otherwise (``--out``
says where).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from collective.base.args import Parser, count
from collective.rl.train import read_config
from experiments.setting import EVAL_T
from experiments.signs_of_life.design import OUT, STEPS, base_config, variants
from experiments.signs_of_life.estimates import contrast, estimate, versus
from experiments.signs_of_life.judge import PRIMARY, SECONDARY, finding, findings, judge_findings
from experiments.signs_of_life.measure import MEASURE_VERSION, evaluate, measure_all, measure_key
from experiments.signs_of_life.report import Study, report
from experiments.signs_of_life.runs import (
    FACTS,
    complete_runs,
    frozen_check,
    limit_share,
    pool,
    run_all,
    starting_point,
    training_facts,
)

#: What other programs take from the study by this module's name (bench/lr_sweep.py, the
#: tests); the rest is in its parts: design (the variants), runs (training them), measure (the
#: held-out protocol), estimates (the figures), judge (the findings) and report.
__all__ = [
    "EVAL_T",
    "FACTS",
    "MEASURE_VERSION",
    "OUT",
    "PRIMARY",
    "SECONDARY",
    "base_config",
    "contrast",
    "evaluate",
    "finding",
    "frozen_check",
    "judge_findings",
    "limit_share",
    "main",
    "measure_key",
    "pool",
    "run_all",
    "training_facts",
    "variants",
    "versus",
]

#: Training seeds and held-out instances an experiment may ask for: each seed is a training run
#: of every variant (minutes each), each instance an episode of every cell; past these no run on
#: any machine finishes, and a range that large would be built before the first run.
MAX_SEEDS = 1_000
MAX_INSTANCES = 100_000


def check_sizes(p: Parser, a: argparse.Namespace, specs: dict[str, dict[str, Any]]) -> None:
    """The sizes asked for, checked as totals before any work: every variant's config at every
    seed must be a config (``--steps`` within its domain), and the seeds and instances must be
    counts a run can hold."""
    if a.seeds > MAX_SEEDS:
        p.error(f"--seeds {a.seeds}: at most {MAX_SEEDS:,} (each is a training run per variant)")
    if a.instances > MAX_INSTANCES:
        p.error(f"--instances {a.instances}: at most {MAX_INSTANCES:,}")
    for name, fields in specs.items():
        try:
            read_config({**fields, "seed": max(0, (a.seeds or 1) - 1)})
        except (ValueError, TypeError) as e:
            p.error(f"variant {name}: {e}")


def parser() -> Parser:
    """The command line's parser and number syntax (collective.base.args): a usage error is one
    line, exit 2, before any work, as in every other command."""
    p = Parser(prog="collective experiment signs-of-life", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a few-minute smoke version")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--only", default="", help="comma-separated variants (default: all)")
    p.add_argument("--seeds", type=count, default=0, help="training seeds (default 3; quick 1)")
    p.add_argument(
        "--steps", type=count, default=0, help=f"training steps (default {STEPS}; quick 2)"
    )
    p.add_argument(
        "--instances",
        type=count,
        default=0,
        help="held-out instances a team size, fresh for each training seed (default 32)",
    )
    p.add_argument(
        "--jobs", type=count, default=2, help="training runs at once (default 2: the two cores)"
    )
    p.add_argument(
        "--complete-only",
        action="store_true",
        help="train nothing: summarise the runs already complete in --out (each variant with "
        "the seeds that finished; one with none is left out)",
    )
    p.add_argument(
        "--train-only",
        action="store_true",
        help="train (or resume) the runs and stop: measure and summarise later, e.g. with "
        "--complete-only",
    )
    return p


def asked(p: Parser, a: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The variants asked for (``--only``), checked before any work, each starting from the
    prior (found, or made, after the checks)."""
    specs = variants(a.quick, a.steps or None)
    if a.jobs < 1:
        p.error(f"--jobs must be >= 1, got {a.jobs}")
    only = set(filter(None, a.only.split(","))) or None
    if only is not None and not only <= set(specs):
        p.error(f"--only: unknown variants {sorted(only - set(specs))}")
    if only is not None and "main" not in only:
        p.error("--only must include main: every finding compares against the main run")
    check_sizes(p, a, {k: v for k, v in specs.items() if only is None or k in only})
    specs = variants(a.quick, a.steps or None, starting_point(a.out, a.quick))
    return {k: v for k, v in specs.items() if only is None or k in only}


def main(argv: list[str] | None = None) -> int:
    """The study: train every run (or take the complete ones), measure each on held-out
    instances, judge the findings, report them."""
    p = parser()
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    specs = asked(p, a)
    seeds = list(range(a.seeds or (1 if a.quick else 3)))
    n = a.instances or (2 if a.quick else 32)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.complete_only:
        runs = complete_runs(a.out, specs, seeds)
        if "main" not in runs:
            p.error(f"--complete-only: no complete main run in {a.out / 'runs'}")
        print("complete runs: " + ", ".join(f"{k} {len(v)}" for k, v in runs.items()), flush=True)
    else:
        runs = run_all(a.out, specs, seeds, a.jobs)
        if a.train_only:
            return 0
    t_train = time.perf_counter() - t0
    measured = estimate(runs, measure_all(a.out, runs, n, a.jobs))
    found = findings(measured)
    judge_findings(found)
    study = Study(a.quick, t0, t_train, a.jobs, seeds, a.complete_only, n, specs)
    report(a.out, measured, found, study)
    return 0
