"""Shared test helpers: small worlds and a run helper. Everything here runs the real engine."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

# Deadlines that scale with the machine's load (tests/busy.py): the hooks, and ``scaled`` for a
# test's own waits.
from busy import pytest_report_header, pytest_runtest_protocol, scaled  # noqa: F401
from hypothesis import settings

# A test stopped by pytest-timeout inside trio.run must not break the tests after it.
from trio_timeouts import pytest_runtest_call  # noqa: F401  (a hook: pytest finds it here)

from collective import Episode, EpisodeConfig, run_episode
from collective.rl.config import TrainConfig
from collective.rl.rundir import StepMetrics, read_metrics
from policy.base import PolicyRequest
from policy.scripted import ScriptedPolicy
from policy.tiny import TinyConfig

# Under pytest-xdist (the README's `-n 2`), before any test imports torch: each worker gets one
# torch thread, inherited by the commands it starts (two workers of two threads each would fight
# over 2 cores), and a temporary directory of its own, so that tests of what the sandbox leaves
# in the temporary directory, and of its sweep of a killed run's leftovers, see only their own
# worker's folders. Ray keeps the shared one (its socket paths have a length limit).
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if WORKER:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("RAY_TMPDIR", tempfile.gettempdir())
    _tmp = tempfile.mkdtemp(prefix=f"collective-tests-{WORKER}-")
    os.environ["TMPDIR"] = _tmp
    tempfile.tempdir = None
    atexit.register(shutil.rmtree, _tmp, ignore_errors=True)

settings.register_profile("ci", deadline=None, max_examples=25)
settings.load_profile("ci")


# ``collective.cli`` as at a terminal, where Ctrl-C raises KeyboardInterrupt: a suite started in
# the background inherits SIGINT ignored, and Python then installs no handler. The child sets the
# handler itself (a ``preexec_fn`` would run Python between fork and exec, which CPython calls
# unsafe in a process with threads, as a Ray driver is).
CLI_AT_A_TERMINAL = [
    sys.executable,
    "-c",
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('collective.cli', run_name='__main__', alter_sys=True)",
]
FRAGILE = f"{Path(__file__).parent / 'fragile.py'}:Fragile"
BUMPS = f"{Path(__file__).parent / 'fragile.py'}:Bumps"
HALTS = f"{Path(__file__).parent / 'fragile.py'}:Halts"
CHIMES = f"{Path(__file__).parent / 'fragile.py'}:Chimes"


# A training run small enough for a test: a few seconds a step on the tally world.
SMALL_TRAIN = dict(
    world="tally",
    params={"target": 12},
    team_sizes=(1, 3),
    groups_per_step=2,
    group_size=3,
    time_limit_start=60.0,
    time_limit_end=60.0,
    concurrency=6,
    max_output_tokens=12,
    plots=False,
    model=TinyConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, context=96),
)

# The same run as a config file, for the command line.
SMALL_TOML = """
world = "tally"
params = {target = 12}
team_sizes = [1, 3]
steps = 2
groups_per_step = 2
group_size = 3
time_limit_start = 60.0
time_limit_end = 60.0
concurrency = 6
max_output_tokens = 12
plots = false

[model]
d_model = 32
n_layers = 1
n_heads = 2
d_ff = 64
context = 96
"""


def small_train(**over: object) -> TrainConfig:
    """``SMALL_TRAIN`` with ``over`` set."""
    return TrainConfig(**{**SMALL_TRAIN, **over})  # type: ignore[arg-type]


def comparable_metrics(run: Path) -> list[dict]:
    """A run's metrics.jsonl without the wall-clock fields: what a rerun must match exactly."""
    return [
        {k: v for k, v in msgspec.to_builtins(m).items() if k not in StepMetrics.WALL_CLOCK}
        for m in read_metrics(run)
    ]


def ctrl_c_everywhere(*args: str, timeout: float) -> str:
    """``tests/ctrl_c_everywhere.py ARGS`` in a subprocess (where a hang is a timeout): its
    report, once it says every interrupted run passed."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("ctrl_c_everywhere.py")), *args],
        capture_output=True,
        text=True,
        timeout=scaled(timeout),
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout


def run(script: object, **cfg: object) -> Episode:
    """Run one episode with a scripted policy (a function of the request) or a given policy.

    Scripts write whole actions, a file of the repo world (up to 4,000 characters, a token a
    byte) included, so answers may be that long unless a test sets ``max_output_tokens``: past
    it an answer is an invalid action."""
    cfg.setdefault("max_output_tokens", 4096)
    policy = ScriptedPolicy(script) if callable(script) else script  # type: ignore[arg-type]
    return run_episode(EpisodeConfig(**cfg), policy)  # type: ignore[arg-type]


def by_turn(*actions: str):
    """A script that plays ``actions`` in turn order for every agent, then waits forever."""

    def script(req: PolicyRequest) -> str:
        return actions[req.turn] if req.turn < len(actions) else "wait 0"

    return script


#: Test modules whose tests all run on one worker, as in one process: tests/test_ray.py's tests
#: share one Ray cluster, one local run and one SGLang fleet (module fixtures).
ONE_WORKER = ("tests/test_ray.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """With -n 2, the tests marked ``heavy`` (15 s or more) go to the workers first: started
    last, one would keep a worker busy long after the other ran out of tests."""
    if WORKER:
        items.sort(key=lambda item: item.get_closest_marker("heavy") is None)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With -n N (pytest-xdist's ``--dist load``): the tests go to the workers one at a time,
    in order (the heavy first), but the modules of ``ONE_WORKER`` go to one worker whole, and
    before anything else (the largest unit first). xdist's own ``--dist loadgroup`` would do
    this with ``xdist_group`` marks, but under pytest 9 (xdist 3.8) it runs the tests of a
    group on both workers."""
    if config.getvalue("dist") != "load":
        return None  # another --dist asked for: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerModules(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in ONE_WORKER else nodeid

    return OneWorkerModules(config, log)


@pytest.fixture
def sglang_train_config() -> Callable[..., Any]:
    """A short RLCR run of a Hugging Face model served by SGLang servers (the stand-ins of
    ``tests/sglang_fake.py``), on tally: ``(model directory, server URLs, **other fields)``."""
    from collective.rl.train import TrainConfig  # here, not above: torch after the worker's setup

    def config(model: Path | str, urls: Sequence[str], **more: Any) -> TrainConfig:
        fields: dict[str, Any] = dict(
            backend="hf",
            hf_model=str(model),
            hf_server="sglang:" + ",".join(urls),
            world="tally",
            params={"target": 12},
            team_sizes=(2,),
            groups_per_step=1,
            group_size=2,
            steps=3,
            time_limit_start=30.0,
            time_limit_end=30.0,
            max_output_tokens=16,
            concurrency=2,
            plots=False,
        )
        return TrainConfig(**{**fields, **more})

    return config
