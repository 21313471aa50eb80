"""Rollouts on a real Ray cluster (a local one: 2 CPUs, 1 declared GPU, no dashboard, a small
object store).

Same science on any placement (per-step returns and episode files as the local run), a worker
killed mid-step (``ray.kill`` and SIGKILL of its process) replaced with nothing lost or used
twice, the placements refused before training starts, and rollouts sampled by an SGLang fleet.

Two stand-ins, for what this machine does not have:

- The GPU: the local cluster *declares* one GPU (``ray.init(num_gpus=1)``) that does not exist.
  Ray schedules by declared resources, so the learner actor of ``learner_gpus = 1`` is placed,
  holds that GPU and runs for real, on the CPU (the tiny backend), exactly as it would beside a
  real GPU, short of the CUDA kernels.
- SGLang: the fleet is two processes of ``tests/support/sglang_fake.py``, which answers SGLang's
  native HTTP API as a real server does (see its docstring) but samples from the action regex,
  seeded by ``sampling_seed``, instead of a model. The Ray workers talk to it over real HTTP with
  the real client; the learner loads each version on it with the real pause/update/continue
  calls.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import torch

from tests.support import ROOT, SUPPORT

ray = pytest.importorskip("ray")

from collective import load_episode  # noqa: E402
from collective.rl.cluster import (  # noqa: E402
    LEARNER_NAME,
    RayRollouts,
)
from collective.rl.config import ClusterConfig  # noqa: E402
from collective.rl.launch import launch  # noqa: E402
from collective.rl.rundir import episode_key  # noqa: E402
from collective.rl.train import (  # noqa: E402
    Interrupted,
    TrainConfig,
    load_config,
    read_metrics,
    train,
)
from collective.studies.study import ScaleConfig, scale_study  # noqa: E402
from policy.tiny import TinyConfig, TinyModel, save_checkpoint  # noqa: E402
from tests.support.busy import scaled  # noqa: E402
from tests.support.cli import CLI_AT_A_TERMINAL  # noqa: E402
from tests.support.training import comparable_metrics, small_mix  # noqa: E402

# configs/quick.toml, shortened to fit the suite (a busy machine's too): 3 steps of 2 groups of 2
# rollouts, 60 s each.
SHORT = [
    "steps=3",
    "groups_per_step=2",
    "group_size=2",
    "time_limit_start=60.0",
    "time_limit_end=60.0",
    "concurrency=4",
    "plots=false",
]


@pytest.fixture(scope="module")
def cluster() -> Any:
    ray.init(
        num_cpus=2,
        num_gpus=1,  # declared, not real: see the module docstring
        include_dashboard=False,
        object_store_memory=80 * 1024**2,
        log_to_driver=False,
        logging_level="ERROR",
        # Ray's memory monitor kills the newest worker once the *machine* passes 95% of its
        # memory, whoever holds it: beside another job holding 10.5 GB it killed this module's
        # workers, which need a few hundred MB. Off here; a real shortage is the kernel's to
        # settle, and a test that dies of it says so (tests/support/busy.py, memory_note).
        _system_config={"memory_monitor_refresh_ms": 0},
    )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("local") / "run"
    train(load_config(ROOT / "configs" / "quick.toml", SHORT), run, progress=False)
    return run


def _ray_cfg(*more: str) -> Any:
    return load_config(ROOT / "configs" / "quick.toml", [*SHORT, "cluster.backend=ray", *more])


def _used(run: Path) -> list[str]:
    lines = [json.loads(x) for x in (run / "ledger.jsonl").read_text().splitlines()]
    return [n for line in lines for n in line["used"] + line["dropped"]]


PER_STEP = 2 * 2  # episodes


def _same_run(a: Path, b: Path, episodes: int = 3 * PER_STEP) -> None:
    """Run ``b`` is run ``a``: every non-wall-clock metric, the ledger, every episode byte. A
    difference is reported by name, in a line (pytest's own report of two runs' metrics and
    episode bytes was megabytes, and once crashed pytest itself while it was formatted)."""
    ma, mb = comparable_metrics(a), comparable_metrics(b)
    assert len(ma) == len(mb), f"{len(ma)} steps vs {len(mb)}"
    fields = [
        f"step {x['step']}: {k}" for x, y in zip(ma, mb, strict=True) for k in x if x[k] != y.get(k)
    ]
    assert not fields, f"metrics differ: {fields[:8]}"
    names, other = _used(a), _used(b)
    assert names == other, f"the ledgers differ: {sorted(set(names) ^ set(other))[:8]}"
    assert len(names) == len(set(names)) == episodes, f"{len(names)} episodes used, not once each"
    differ = [
        n for n in names if (a / "episodes" / n).read_bytes() != (b / "episodes" / n).read_bytes()
    ]
    assert not differ, f"episode files differ: {differ[:8]}"


def test_two_workers_give_the_local_run(cluster: Any, local_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "ray"
    train(_ray_cfg("cluster.rollout_workers=2", "cluster.cpus_per_worker=1"), run, progress=False)
    _same_run(local_run, run)
    assert 'backend = "ray"' in (run / "config.toml").read_text()


def test_a_mix_of_worlds_on_two_workers_is_the_local_run(cluster: Any, tmp_path: Path) -> None:
    """[[worlds]]: each group's world is a draw seeded by (seed, group), so a worker that runs
    a group knows its world, and the run is the local one byte for byte."""
    train(small_mix(steps=2), tmp_path / "local", progress=False)
    ray_mix = small_mix(steps=2, cluster=ClusterConfig(backend="ray", rollout_workers=2))
    train(ray_mix, tmp_path / "ray", progress=False)
    _same_run(tmp_path / "local", tmp_path / "ray", episodes=2 * 4 * 2)
    assert (tmp_path / "ray" / "baselines.json").read_bytes() == (
        tmp_path / "local" / "baselines.json"
    ).read_bytes()


def test_killed_workers_are_replaced_and_nothing_is_lost(
    cluster: Any, local_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mid-step, worker 0 is killed through Ray and worker 1's process by SIGKILL: each is
    replaced, their unfinished episodes run again from their seeds, and the run is the local
    run, every episode used once.

    Each worker runs half of every step (6 episodes): at the 2nd and the 5th episode received,
    the one killed has work left, however the two happen to be paced. Worker 1's process id is
    asked for when it starts, idle: an actor runs one call at a time, so asked mid-run the
    question waited behind every share queued on it, and the kill could land after its last."""
    seen: list[RayRollouts] = []
    received = 0
    finished, checked = RayRollouts.finished, RayRollouts._checked
    pids: dict[int, int] = {}

    def checked_then_pid(self: RayRollouts, k: int, worker: Any) -> str:
        where = checked(self, k, worker)
        pids[k] = ray.get(worker.pid.remote())
        return where

    async def finished_then_kill(self: RayRollouts, group: int, member: int, ep: Any) -> None:
        nonlocal received
        await finished(self, group, member, ep)
        received += 1
        if received == 2:
            seen.append(self)
            ray.kill(self.workers[0])
        elif received == 5:
            os.kill(pids[1], signal.SIGKILL)

    monkeypatch.setattr(RayRollouts, "finished", finished_then_kill)
    monkeypatch.setattr(RayRollouts, "_checked", checked_then_pid)
    run = tmp_path / "ray"
    train(_ray_cfg("cluster.rollout_workers=2", "cluster.cpus_per_worker=1"), run, progress=False)
    replaced = seen[0].replaced if seen else None
    assert replaced == 2, f"{replaced} workers replaced, not 2"
    _same_run(local_run, run)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (["cluster.rollout_workers=3"], "3 rollout_workers x cpus_per_worker 1 need 3 CPUs"),
        (["cluster.learner_gpus=2"], "learner_gpus = 2, but the Ray cluster has 1 GPUs"),
        (["cluster.rollout_workers=0"], "cluster.rollout_workers must be >= 1"),
    ],
)
def test_placements_that_cannot_work_are_refused_before_training(
    cluster: Any, tmp_path: Path, setting: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        launch(_ray_cfg(*setting), tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists(), "nothing written"


def test_a_world_a_worker_cannot_import_is_refused_before_training(
    cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A world module this process can import but the Ray workers cannot (as on a node
    without the file): one line naming the worker and the world, before training."""
    (tmp_path / "here_only_world.py").write_text(
        "from worlds.tally import Tally\n\nclass Here(Tally):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"rollout worker 0: world 'here_only_world:Here'"):
        train(_ray_cfg("world=here_only_world:Here"), tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()
    sys.modules.pop("here_only_world", None)


def test_the_learner_actor_on_a_gpu_dies_and_the_run_resumes(
    cluster: Any, local_run: Path, tmp_path: Path
) -> None:
    """The learner as a Ray actor holding ``learner_gpus = 1`` (the cluster's one GPU, declared
    to Ray but not real: the learner runs on the CPU) killed after its first step: ``launch``
    (the command line's) stops with the resume line, and ``--resume``, again in a learner actor
    on the GPU, continues it to exactly the local run (one rollout worker here: 1, 2, any
    number)."""
    cfg = _ray_cfg("cluster.rollout_workers=1", "cluster.learner_gpus=1", 'device="cpu"')
    run = tmp_path / "ray"
    held: list[float] = []

    def kill_after_the_first_step() -> None:
        while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_bytes():
            time.sleep(0.05)
        held.append(ray.available_resources().get("GPU", 0.0))
        ray.kill(ray.get_actor(LEARNER_NAME))

    killer = threading.Thread(target=kill_after_the_first_step, daemon=True)
    killer.start()
    with pytest.raises(Interrupted, match=r"the learner actor died.*--resume"):
        launch(cfg, run, progress=False)
    killer.join()
    assert held == [0.0], "the learner actor held the GPU"
    assert len((run / "metrics.jsonl").read_bytes().splitlines()) < 3, "it died mid-run"
    launch(cfg, run, resume=True, progress=False)
    _same_run(local_run, run)
    deadline = time.monotonic() + scaled(30)
    while ray.available_resources().get("GPU", 0.0) < 1.0:
        assert time.monotonic() < deadline, "the learner actor still holds the GPU"
        time.sleep(0.1)


def test_the_scale_study_on_ray_is_the_local_study(cluster: Any, tmp_path: Path) -> None:
    ckpt = save_checkpoint(
        TinyModel.fresh(TinyConfig(d_model=32, n_heads=2, d_ff=64, context=96)),
        tmp_path / "tiny.pt",
    )
    cfg = ScaleConfig(checkpoint=str(ckpt), world="tally", agents=(1, 3), seeds=2, horizon=40.0)
    wall = {"wall_seconds"}
    local = [msgspec.to_builtins(r) for r in scale_study(cfg, progress=False)]
    on_ray = scale_study(cfg, progress=False, cluster=ClusterConfig(backend="ray"))
    assert [{k: v for k, v in msgspec.to_builtins(r).items() if k not in wall} for r in on_ray] == [
        {k: v for k, v in r.items() if k not in wall} for r in local
    ]


def test_ctrl_c_stops_the_cluster_work_cleanly(cluster: Any, tmp_path: Path) -> None:
    """``collective train`` joining this Ray cluster by its address, interrupted after its
    first step: exit 130 with the resume line, whole steps in the ledger, and the command's
    workers gone (their CPUs free again)."""
    run = tmp_path / "run"
    address = ray.get_runtime_context().gcs_address
    placement = ["cluster.backend=ray", f'cluster.address="{address}"', "cluster.rollout_workers=2"]
    sets = [a for kv in [*SHORT, *placement] for a in ("--set", kv)]
    cmd = [*CLI_AT_A_TERMINAL, "train", str(ROOT / "configs" / "quick.toml")]
    p = subprocess.Popen(
        [*cmd, "--out", str(run), *sets, "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + scaled(240)
    while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_bytes():
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()[1]
        time.sleep(0.05)
    assert ray.available_resources().get("CPU", 0) == 0, "its two workers hold the CPUs"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=scaled(60))
    assert p.returncode == 130, err
    assert "resume with `collective train --resume" in err
    assert len(_used(run)) == PER_STEP * len(read_metrics(run)), "whole steps only"
    while ray.available_resources().get("CPU", 0) < 2:
        assert time.monotonic() < deadline, "the command's workers still hold their CPUs"
        time.sleep(0.1)


# -- an SGLang fleet ------------------------------------------------------------------------------

FAKE = [sys.executable, str(SUPPORT / "sglang_fake.py")]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A starting Hugging Face model and two stand-in SGLang servers serving it, as processes."""
    from policy.hf.model import HFModel
    from policy.sglang import SGLangServer
    from tests.support.hf_tiny import make_model, make_tokenizer

    tokenizer = make_tokenizer()
    start = HFModel(make_model(tokenizer), tokenizer).save(tmp_path_factory.mktemp("hf") / "m")
    servers = []
    try:
        for _ in range(2):
            flags = ["--enable-deterministic-inference"]
            servers.append(SGLangServer.launch(start, args=flags, command=FAKE))
        yield start, servers
    finally:
        for server in servers:
            server.stop()


def _fleet_cfg(fleet: Any, sglang_train_config: Any, **more: Any) -> TrainConfig:
    start, servers = fleet
    # lag 0: locally, the fleet is updated under running episodes when lag > 0
    fields: dict[str, Any] = dict(device="cpu", lag=0)
    return sglang_train_config(start, [s.url for s in servers], **{**fields, **more})


def _versions(run: Path) -> dict[tuple[int, int], set[int]]:
    """The policy versions that sampled each episode's trained turns, by (group, member)."""
    out = {}
    for path in (run / "episodes").glob("g*.msgpack"):
        key = episode_key(path.name)
        assert key is not None
        out[key] = {t.version for t in load_episode(path).turns if t.policy == "trained"}
    return out


def test_two_workers_on_an_sglang_fleet_give_the_local_run(
    cluster: Any, fleet: Any, sglang_train_config: Any, tmp_path: Path
) -> None:
    """Rollout workers talking to a 2-server fleet over HTTP, the learner loading each version
    on it between steps, the run stopped after its first step and resumed: the local run with
    the same fleet, step for step and byte for byte, and every episode sampled by the version
    its step was dealt at (the updates followed)."""
    cfg = _fleet_cfg(fleet, sglang_train_config)
    train(cfg, tmp_path / "local", progress=False)
    on_ray = msgspec.structs.replace(
        cfg, cluster=ClusterConfig(backend="ray", rollout_workers=2, cpus_per_worker=1)
    )
    train(on_ray, tmp_path / "ray", progress=False, stop_after=1)
    assert len(read_metrics(tmp_path / "ray")) == 1
    train(on_ray, tmp_path / "ray", progress=False, resume=True)
    _same_run(tmp_path / "local", tmp_path / "ray", episodes=3 * 1 * 2)
    versions = _versions(tmp_path / "ray")
    assert len(versions) == 6
    assert all(v == {g} for (g, _), v in versions.items()), versions
    for server in fleet[1]:  # the last update (after the last step) reached every server
        assert httpx.get(server.url + "/model_info").json()["weight_version"] == "3"


def test_with_lag_a_fleet_keeps_each_episode_to_one_version_by_disk_and_from_memory(
    cluster: Any, sglang_train_config: Any, tmp_path: Path
) -> None:
    """At ``lag = 2`` the fleet (one version at a time) is updated only once the episodes dealt
    at the version it holds have come back: each episode is sampled by one version, the one its
    step is pinned to (``step - lag``). Meanwhile the learner trains on (version 2 is made from
    step 1 while step 2 still runs on version 0, and version 1 is sent only after step 2), so a
    version sent later must be the one kept when it was published: with
    ``weights=distributed`` every version each server holds is, bit for bit, what the same run
    by disk (written at publish time) gave it, nothing goes by disk and no served directory is
    written. The two stand-in servers run in this process, so what they received can be read."""
    from policy.hf.model import HFModel
    from tests.support.hf_tiny import make_model, make_tokenizer
    from tests.support.sglang_fake import FakeSGLang

    tokenizer = make_tokenizer()
    start = HFModel(make_model(tokenizer), tokenizer).save(tmp_path / "start")
    held: dict[str, list[dict[str, dict[str, Any]]]] = {}
    for weights in ("disk", "distributed"):
        servers = [FakeSGLang(start, deterministic=True).start() for _ in range(2)]
        try:
            urls = [s.url for s in servers]
            cfg = sglang_train_config(
                start,
                urls,
                device="cpu",
                lag=2,
                max_staleness=2,  # (the default, 1, would drop the episodes of version step - 2)
                steps=4,
                cluster=ClusterConfig(backend="ray", rollout_workers=1),
            )
            spec = f"sglang:{','.join(urls)} weights={weights}"
            cfg = msgspec.structs.replace(cfg, model=msgspec.structs.replace(cfg.hf, server=spec))
            train(cfg, tmp_path / weights, progress=False)
            versions = _versions(tmp_path / weights)
            assert len(versions) == 8
            assert all(v == {max(0, g - 2)} for (g, _), v in versions.items()), versions
            held[weights] = [s.held for s in servers]
            for s in servers:
                assert s.weight_version == "4"
                by_disk = s.posts("/update_weights_from_disk")
                assert (len(by_disk) == 4) if weights == "disk" else (by_disk == [])
        finally:
            for s in servers:
                s.stop()
    assert not list((tmp_path / "distributed" / "checkpoints" / "served").glob("v*"))
    for disk, memory in zip(held["disk"], held["distributed"], strict=True):
        assert sorted(disk) == sorted(memory) == ["1", "2", "3", "4"]
        for version in disk:
            a, b = disk[version], memory[version]
            assert set(a) == set(b)
            assert all(torch.equal(a[n], b[n]) for n in a), f"version {version} differs"
    # Where the learner moved (a step with signal), a version sent late would differ from its
    # own; a step without signal takes no optimiser step, so its version holds the weights of
    # the one before.
    by_version = held["disk"][0]
    stepped = [m.optimiser_step for m in read_metrics(tmp_path / "disk")]
    assert any(stepped[1:4]), "no step of 1-3 had signal: the check below would say nothing"
    for v in ("1", "2", "3"):
        a, b = by_version[v], by_version[str(int(v) + 1)]
        moved = any(not torch.equal(a[n], b[n]) for n in a)
        assert moved == stepped[int(v)], f"versions {v} and {int(v) + 1}: moved {moved}"


def test_a_launched_server_on_a_ray_cluster_is_refused(
    fleet: Any, sglang_train_config: Any, tmp_path: Path
) -> None:
    """``sglang:launch`` serves on the command's loopback, out of reach of the cluster's other
    nodes: refused in one line, before Ray is joined or anything is written."""
    on_cluster = ClusterConfig(backend="ray", address="127.0.0.1:1")
    cfg = _fleet_cfg(fleet, sglang_train_config, hf_server="sglang:launch", cluster=on_cluster)
    with pytest.raises(ValueError, match="loopback, which the Ray cluster's other nodes cannot"):
        train(cfg, tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()
