"""The suite's hooks and fixtures: deadlines scaled by load, a clean run after a trio timeout, the
workers' environment and schedule under pytest-xdist. What tests import lives in ``support/``."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# Deadlines that scale with the machine's load (tests/support/busy.py): the hooks (a test's own
# waits import ``scaled`` from there).
from tests.support.busy import (  # noqa: F401
    pytest_report_header,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
)

# A test stopped by pytest-timeout inside trio.run must not break the tests after it.
from tests.support.trio_timeouts import pytest_runtest_call  # noqa: F401  (a hook, found here)

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


#: Test modules whose tests all run on one worker, as in one process: tests/rl/test_ray.py's tests
#: share one Ray cluster, one local run and one SGLang fleet (module fixtures).
ONE_WORKER = ("tests/rl/test_ray.py",)


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
    ``tests/support/sglang_fake.py``), on tally: ``(model directory, server URLs, **more)``."""
    from collective.rl.config import read_config
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
        return read_config({**fields, **more})

    return config
