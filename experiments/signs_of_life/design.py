"""The study's design: what is trained and measured. The main run (:func:`base_config`) and
its ablations (:func:`variants`), each one change away from it, trained from the prior with the
set-up the lr sweep chose; the scripted controls and the kinds of policy every run is measured
with (:func:`kinds_of`); the limits the findings are judged at (``LOOSE``, ``HORIZON``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.setting import EVAL_T, LATENCY, MODEL, WORLD
from policy.scripted import workshop_scripts

#: Where the results go by default: bench/results/signs_of_life in a checkout of the project
#: (the figures its README cites), ./signs_of_life from an installed copy.
CHECKOUT = Path(__file__).resolve().parents[2]
OUT = (
    CHECKOUT / "bench" / "results" / "signs_of_life"
    if (CHECKOUT / "bench" / "signs_of_life.py").exists()
    else Path("signs_of_life")
)
HORIZON = 16  # the solo may run this many times the collective's limit: it rarely gets there
LOOSE = 720.0  # the no-pressure run's constant limit: the largest this run can afford (README)
PENALTY = 0.5  # the latency-penalty variant's beta (R = R_task - beta * pbar * T / T_max)
# The fourth edition's training set-up (issue 43): every run starts from the pre-registered
# prior (experiments/prior.py; bench/results/prior/README.md) unless its variant says
# "scratch", at the learning rate bench/lr_sweep.py chose (bench/results/lr_sweep/README.md),
# in groups of 4 so that most groups carry signal, with dynamic sampling replacing the rest.
PRIOR = Path("bench/results/prior/prior/latest.pt")  # from the checkout's root (main: there)
LEARNING_RATE = 1e-3
GROUPS, GROUP_SIZE, RESAMPLE = 4, 4, 4
STEPS = 100
SCRIPTS = tuple(workshop_scripts())  # oracle, hire_everyone, never_pass_keys, no_communication
#: Scripted controls that lack a skill a finding is about: a "yes" one of them also gets is
#: built into the world, not learned. The oracle is hand-written skill: where it shows a finding
#: the world allows it (it is "attainable"), which is what an oracle is for.
CONTROLS = tuple(k for k in SCRIPTS if k != "oracle")
KINDS = ("random", "untrained", "trained")
SEEDLESS = ("random", *SCRIPTS)  # no training seed, no weights (still a row per seed: below)


def base_config(quick: bool, steps: int | None = None, prior: Path = PRIOR) -> dict[str, Any]:
    """The main run: the FINDINGS workshop, a flat team of 1, 2, 3, 4 or 8 from the start (so
    the collective never contains the solo it is compared with, as a CEO who starts alone
    would), tokens that cost time (``tiny-paced``), a rising limit, from the prior."""
    return dict(
        world="workshop",
        params=dict(WORLD),
        org="flat",
        team_sizes=(1, 2, 3, 4, 8),
        latency=LATENCY,
        steps=steps or (2 if quick else STEPS),
        groups_per_step=GROUPS,
        group_size=GROUP_SIZE,
        resample=RESAMPLE,
        init=str(prior),
        seed=0,
        time_limit="linear",
        time_limit_start=90.0,
        time_limit_end=EVAL_T,
        learning_rate=LEARNING_RATE,
        max_output_tokens=24,
        concurrency=20,
        plots=False,
        # checkpoints at steps 10, 20, ... (quick: every step): the held-out training curve
        snapshot_every=1 if quick else 25,
        model=MODEL,
    )


def variants(
    quick: bool, steps: int | None = None, prior: Path = PRIOR
) -> dict[str, dict[str, Any]]:
    """The main run and its ablations, each one change away from it."""
    base = base_config(quick, steps, prior)
    loose = {"time_limit": "constant", "time_limit_start": LOOSE, "time_limit_end": LOOSE}
    out = {
        "main": base,
        "main_scratch": {**base, "init": ""},  # the untrained byte model: a second start
        "no_pressure": {**base, **loose},
        # pressure by the return instead of the limit: a loose limit, and beta > 0
        "latency_penalty": {**base, **loose, "latency_penalty": PENALTY},
        "per_agent": {**base, "advantage": "individual"},
        "ceo": {**base, "org": "ceo"},
        "orchestrator": {**base, "org": "orchestrator"},
        "islands": {**base, "org": "islands", "team_sizes": (2, 3, 4, 8)},
    }
    return out


ORGS = ("ceo", "orchestrator", "islands")  # runs whose baselines need their own protocol
OWN_START = ("main_scratch",)  # runs whose starting weights (their "untrained") are their own


def kinds_of(name: str) -> tuple[str, ...]:
    """The policies run ``name`` is measured with at EVAL_T: the main run every baseline and
    script; a run with its own protocol or its own start its random and starting weights too;
    any other only its trained weights (its baselines are the main run's)."""
    if name == "main":
        return (*KINDS, *SCRIPTS)
    return KINDS if name in ORGS + OWN_START else ("trained",)
