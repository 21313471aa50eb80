"""Weights sent to SGLang without the disk, against the stand-in server (``sglang_fake``) over a
real torch.distributed group on the CPU (gloo): what the learner sends is what the stand-in then
holds, bit for bit; every way it cannot work falls back to the disk in one warning line."""

from __future__ import annotations

import datetime
import functools
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import pytest
import structlog
import torch
import trio

from collective import ActionSpace, ToolSpec
from policy.base import PolicyError, PolicyRequest
from policy.hf.model import HFModel
from policy.sglang import SGLangPolicy, parse_spec
from policy.sglang.weights import (
    UpdateGroup,
    buckets,
    checkpoint_tensors,
    flatten,
    unflatten,
)
from tests.support import ROOT
from tests.support.busy import scaled
from tests.support.hf_tiny import make_model, make_tokenizer
from tests.support.sglang_fake import FakeSGLang, read_safetensors


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint the stand-ins start with (seed 0)."""
    tokenizer = make_tokenizer()
    return HFModel(make_model(tokenizer, seed=0), tokenizer).save(
        tmp_path_factory.mktemp("served") / "m"
    )


@pytest.fixture(scope="module")
def learner() -> HFModel:
    """The learner's next weights (seed 1: every tensor differs from the served ones)."""
    tokenizer = make_tokenizer()
    return HFModel(make_model(tokenizer, seed=1), tokenizer, version=1)


@pytest.fixture
def fake(served: Path):
    server = FakeSGLang(served, deterministic=True).start()
    server.group_timeout = 3.0
    yield server
    server.stop()


def client(urls, **kw) -> SGLangPolicy:
    kw = {"timeout": 5.0, "attempts": 2, "backoff": 0.01, "wait": 5.0, "sync_timeout": 5.0, **kw}
    return SGLangPolicy(urls, **kw)


class Saver:
    """The disk path's ``path`` argument: writes the learner's weights only when called."""

    def __init__(self, model: HFModel, directory: Path) -> None:
        self.model, self.directory, self.calls = model, directory, 0

    def __call__(self) -> Path:
        self.calls += 1
        return self.model.save(self.directory)


def holds(server: FakeSGLang, model: HFModel) -> bool:
    """The server holds exactly the model's tensors, bit for bit."""
    return server.holds(checkpoint_tensors(model))


def update(policy: SGLangPolicy, model: HFModel, saver: Saver, version: int = 1, **kw) -> None:
    tensors = kw.pop("tensors", lambda: checkpoint_tensors(model))
    trio.run(functools.partial(policy.update_weights, saver, version, tensors=tensors))


# -- what travels -------------------------------------------------------------------------------


def test_the_learner_names_its_tensors_as_its_checkpoint_does(learner, tmp_path):
    saved = read_safetensors(learner.save(tmp_path / "m"))
    assert [n for n, _ in checkpoint_tensors(learner)] == list(learner.model.state_dict())
    assert set(saved) == {n for n, _ in checkpoint_tensors(learner)}


def test_buckets_keep_the_order_within_their_limit_and_flatten_round_trips():
    named = [
        ("a", torch.arange(6, dtype=torch.float32).reshape(2, 3)),
        ("b", torch.ones(5, dtype=torch.bfloat16)),
        ("c", torch.arange(40, dtype=torch.int64)),
        ("d", torch.zeros(1, dtype=torch.float16)),
    ]
    parts = buckets(named, limit=40)
    assert [[n for n, _ in b] for b in parts] == [["a", "b"], ["c"], ["d"]]  # c alone: 320 B
    for bucket in parts:
        flat = flatten(bucket)
        assert flat.dtype == torch.uint8
        assert flat.numel() == sum(t.numel() * t.element_size() for _, t in bucket)
        back = unflatten(
            flat,
            [n for n, _ in bucket],
            [str(t.dtype).removeprefix("torch.") for _, t in bucket],
            [list(t.shape) for _, t in bucket],
        )
        for (n, t), (m, u) in zip(bucket, back, strict=True):
            assert n == m and u.dtype == t.dtype and torch.equal(u, t)


def test_the_learners_group_meets_a_rank_that_joins_through_torchs_own_helper():
    """A server joins as SGLang's init_custom_process_group does (a c10d rendezvous, the store
    prefixed by the group name, torch's process-group helper); the learner's side is
    :class:`UpdateGroup`, which keeps out of torch's registry of groups."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from policy.sglang.server import free_port

    port, name, got = free_port(), f"helper-check-{time.monotonic_ns()}", {}
    group = UpdateGroup("127.0.0.1", port, 2, name, "gloo", 10.0)
    wait = datetime.timedelta(seconds=10)

    def server() -> None:
        store, _, _ = next(dist.rendezvous(f"tcp://127.0.0.1:{port}", 1, 2, timeout=wait))
        store = dist.PrefixStore(name, store)
        pg, _ = c10d._new_process_group_helper(
            2, 1, [], dist.Backend("gloo"), store, group_name=name, timeout=wait
        )
        received = torch.zeros(16, dtype=torch.uint8)
        options = dist.BroadcastOptions()
        options.rootRank = 0
        pg.broadcast([received], options).wait()
        got["bytes"] = received

    thread = threading.Thread(target=server)
    thread.start()
    group.join()
    group.broadcast(torch.arange(16, dtype=torch.uint8))
    thread.join(timeout=10)
    assert torch.equal(got["bytes"], torch.arange(16, dtype=torch.uint8))
    group.close()


# -- the two paths --------------------------------------------------------------------------------


def test_distributed_weights_are_held_bit_for_bit_and_the_version_confirmed(
    fake, learner, tmp_path
):
    policy = client(fake.url, weights="distributed", bucket_bytes=4096)
    saver = Saver(learner, tmp_path / "v1")
    assert not holds(fake, learner)
    update(policy, learner, saver)

    assert holds(fake, learner) and fake.weight_version == "1" and policy.version == 1
    assert saver.calls == 0 and not (tmp_path / "v1").exists()  # nothing written to disk
    assert policy.last_sync_method == "distributed" and policy.weights_by_disk_why is None
    calls = [p for p, _ in fake.log]
    assert calls[0] == "/pause_generation" and calls[1] == "/init_weights_update_group"
    assert calls[-1] == "/continue_generation"
    (init,) = fake.posts("/init_weights_update_group")
    assert (init["rank_offset"], init["world_size"], init["backend"]) == (1, 2, "gloo")
    sent = fake.posts("/update_weights_from_distributed")
    assert len(sent) > 2  # several buckets
    assert [n for body in sent for n in body["names"]] == [
        n for n, _ in checkpoint_tensors(learner)
    ]
    for body in sent:
        assert body["load_format"] == "flattened_bucket" and body["abort_all_requests"] is False
        assert body["group_name"] == init["group_name"]
    assert [b["weight_version"] for b in sent] == [None] * (len(sent) - 1) + ["1"]
    assert [b["flush_cache"] for b in sent] == [False] * (len(sent) - 1) + [True]

    # the next update reuses the group
    update(policy, learner, saver, version=2)
    assert len(fake.posts("/init_weights_update_group")) == 1 and fake.weight_version == "2"


def test_a_fleet_joins_one_group_each_server_at_its_rank(served, learner, tmp_path):
    fleet = [FakeSGLang(served, deterministic=True).start() for _ in range(2)]
    try:
        policy = client([s.url for s in fleet], weights="distributed")
        update(policy, learner, Saver(learner, tmp_path / "v1"))
        inits = [s.posts("/init_weights_update_group")[0] for s in fleet]
        assert [(i["rank_offset"], i["world_size"]) for i in inits] == [(1, 3), (2, 3)]
        assert all(holds(s, learner) and s.weight_version == "1" for s in fleet)
    finally:
        for s in fleet:
            s.stop()


def test_tensor_weights_are_held_bit_for_bit(fake, learner, tmp_path):
    policy = client(fake.url, weights="tensor")
    saver = Saver(learner, tmp_path / "v1")
    update(policy, learner, saver)
    assert holds(fake, learner) and fake.weight_version == "1" and saver.calls == 0
    (body,) = fake.posts("/update_weights_from_tensor")
    assert len(body["serialized_named_tensors"]) == 1  # one entry per TP rank
    assert body["abort_all_requests"] is False and body["weight_version"] == "1"


def test_auto_sends_cpu_weights_over_the_group(fake, learner, tmp_path):
    policy = client(fake.url, weights="auto")
    update(policy, learner, Saver(learner, tmp_path / "v1"))
    assert policy.last_sync_method == "distributed" and holds(fake, learner)


def test_the_disk_call_sets_every_field_explicitly(fake, learner, tmp_path):
    policy = client(fake.url)  # weights=disk, the default
    saver = Saver(learner, tmp_path / "v1")
    update(policy, learner, saver)
    assert saver.calls == 1 and holds(fake, learner)
    (body,) = fake.posts("/update_weights_from_disk")
    assert body == {"model_path": str(tmp_path / "v1"), "abort_all_requests": False} | {
        "weight_version": "1"
    }


def test_a_server_that_does_not_take_the_label_fails_the_check(fake, learner, tmp_path):
    fake.records_version = False
    policy = client(fake.url, weights="distributed")
    with pytest.raises(PolicyError, match="reports weight_version 'default'"):
        update(policy, learner, Saver(learner, tmp_path / "v1"))
    assert not fake.paused and policy.version == 0


# -- bad input: one line, then the disk -----------------------------------------------------------


def fell_back(policy, fake, learner, saver, logs, *, cause: str) -> str:
    """The update went by disk after one warning naming the cause; nothing was lost."""
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1, warnings
    line = warnings[0]["event"]
    assert "\n" not in line and cause in line and "by disk" in line
    assert policy.last_sync_method == "disk" and saver.calls == 1
    assert holds(fake, learner) and fake.weight_version == "1" and policy.version == 1
    assert not fake.paused
    return line


@pytest.mark.parametrize("method", ["distributed", "tensor"])
def test_a_server_refusing_the_update_falls_back_to_disk(fake, learner, tmp_path, method):
    policy = client(fake.url, weights=method)
    saver = Saver(learner, tmp_path / "v1")
    fake.weight_faults = ["refuse"] if method == "tensor" else [None, "refuse"]  # init, bucket
    with structlog.testing.capture_logs() as logs:
        update(policy, learner, saver)
    line = fell_back(policy, fake, learner, saver, logs, cause="stand-in refusal")
    assert f"SGLang server {fake.url} refused /update_weights_from_{method}" in line
    update(policy, learner, saver, version=2)  # and later updates go by disk at once
    assert saver.calls == 2 and policy.last_sync_method == "disk"


def test_unknown_parameter_names_fall_back_to_disk(fake, learner, tmp_path):
    policy = client(fake.url, weights="distributed")
    saver = Saver(learner, tmp_path / "v1")

    def renamed():
        return [(n.replace("model.", "transformer."), t) for n, t in checkpoint_tensors(learner)]

    with structlog.testing.capture_logs() as logs:
        update(policy, learner, saver, tensors=renamed)
    line = fell_back(policy, fake, learner, saver, logs, cause="has no parameter named")
    assert fake.url in line


def test_a_group_whose_port_is_taken_falls_back_to_disk(fake, learner, tmp_path, monkeypatch):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    monkeypatch.setattr("policy.sglang.sinks.distributed.free_port", lambda: taken.getsockname()[1])
    policy = client(fake.url, weights="distributed")
    saver = Saver(learner, tmp_path / "v1")
    try:
        with structlog.testing.capture_logs() as logs:
            update(policy, learner, saver)
    finally:
        taken.close()
    fell_back(policy, fake, learner, saver, logs, cause="cannot host weight-update group")
    assert fake.posts("/init_weights_update_group") == []  # no server was asked to join


def test_a_group_that_cannot_form_ends_at_the_deadline_and_falls_back(fake, learner, tmp_path):
    fake.weight_faults = ["wrong-world"]  # the server counts one rank more
    fake.group_timeout = 1.0
    policy = client(fake.url, weights="distributed", sync_timeout=1.0)
    saver = Saver(learner, tmp_path / "v1")
    started = time.monotonic()
    with structlog.testing.capture_logs() as logs:
        update(policy, learner, saver)
    assert time.monotonic() - started < 4.0
    line = fell_back(policy, fake, learner, saver, logs, cause="did not form")
    assert fake.url in line or "the learner" in line


def test_a_hung_broadcast_ends_at_the_deadline_and_falls_back(fake, learner, tmp_path):
    policy = client(fake.url, weights="distributed", sync_timeout=1.0)
    saver = Saver(learner, tmp_path / "v0")
    update(policy, learner, saver, version=1)  # the group formed and works
    fake.weight_faults = ["hang"]  # the next bucket call is never served in time
    fake.hang = 2.0
    fake.group_timeout = 1.0
    started = time.monotonic()
    with structlog.testing.capture_logs() as logs:
        update(policy, learner, saver, version=2)
    assert time.monotonic() - started < 4.0
    warnings = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1 and "hung collective" in warnings[0] and fake.url in warnings[0]
    assert saver.calls == 1 and fake.weight_version == "2" and holds(fake, learner)


def test_an_update_past_its_total_deadline_is_one_error_and_the_next_one_mends_it(
    fake, learner, tmp_path
):
    """Each call is within its own bound (timeout 5 s, the load answers after 3 s), yet the
    update as a whole is past ``update_deadline`` (1 s): one error naming it, in about that
    time, the server resumed, and nothing generated until an update reaches every server."""
    fake.weight_faults = ["hang"]
    fake.hang = 3.0
    policy = client(fake.url, update_deadline=1.0)
    saver = Saver(learner, tmp_path / "v1")
    started = time.monotonic()
    with pytest.raises(PolicyError, match=r"did not finish within update_deadline=1s") as e:
        update(policy, learner, saver)
    assert time.monotonic() - started < 2.5 and "\n" not in str(e.value)
    assert policy.version == 0 and not fake.paused
    with pytest.raises(PolicyError, match="nothing is generated until an update reaches"):
        trio.run(policy.generate, one_request())
    time.sleep(fake.hang)  # (the stand-in's hung call ends)
    update(policy, learner, saver, version=2)
    assert fake.weight_version == "2" and policy.version == 2 and holds(fake, learner)


def one_request() -> list[PolicyRequest]:
    space = ActionSpace((ToolSpec("wait", (), ""),))
    return [PolicyRequest(agent=0, turn=0, prompt="x", space=space, seed=1, max_tokens=8)]


def test_the_spec_takes_the_update_deadline_in_the_one_number_syntax():
    assert parse_spec("http://a:1 update-deadline=30").update_deadline == 30.0
    assert parse_spec("http://a:1").update_deadline == 1800.0
    for bad in ("inf", "0", "-5", "\u0663\u0660", "1_0", "thirty"):
        with pytest.raises(ValueError, match="update-deadline must be a number of seconds"):
            parse_spec(f"http://a:1 update-deadline={bad}")


# -- the spec ------------------------------------------------------------------------------------


def test_the_spec_takes_the_weights_method_and_its_deadline():
    spec = parse_spec("http://a:1 weights=auto sync-timeout=30")
    assert (spec.weights, spec.sync_timeout) == ("auto", 30.0)
    assert parse_spec("http://a:1").weights == "disk"
    with pytest.raises(ValueError, match="weights must be one of disk, tensor, distributed"):
        parse_spec("http://a:1 weights=nccl")
    with pytest.raises(ValueError, match="weights must be one of"):
        SGLangPolicy("http://a:1", weights="ray")  # type: ignore[arg-type]


def test_rlcr_sends_each_new_version_over_the_group_and_writes_none(sglang_train_config, tmp_path):
    """The learner's loop end to end (tally, three steps) with ``weights=distributed``: each
    version reaches the stand-in over the group; no served directory is written."""
    from collective.rl.train import train

    tokenizer = make_tokenizer()
    start = HFModel(make_model(tokenizer), tokenizer).save(tmp_path / "start")
    server = FakeSGLang(start, deterministic=True).start()
    try:
        cfg = sglang_train_config(start, [server.url])
        served = msgspec.structs.replace(cfg.hf, server=f"sglang:{server.url} weights=distributed")
        cfg = msgspec.structs.replace(cfg, model=served)
        rows = train(cfg, tmp_path / "run", progress=False)
        assert [r.version for r in rows] == [1, 2, 3]
        assert server.weight_version == "3"
        assert len(server.posts("/init_weights_update_group")) == 1
        assert server.posts("/update_weights_from_disk") == []
        assert not list((tmp_path / "run" / "checkpoints" / "served").glob("v*"))
        latest = read_safetensors(tmp_path / "run" / "checkpoints" / "latest")
        assert set(latest) == set(server.weights)
        assert all(torch.equal(latest[n], server.weights[n]) for n in latest)
    finally:
        server.stop()


def test_the_sync_bench_times_every_method_and_each_left_the_weights_held(tmp_path):
    """``bench/weight_sync.py --quick`` (a program: run as one, as a user would): each method
    syncs by itself (no fallback to the disk), and the bench stops with the method's name if
    the stand-in does not then hold the version's tensors bit for bit; here only what it writes
    is checked, never how fast."""
    script = str(ROOT / "bench" / "weight_sync.py")
    done = subprocess.run(
        [sys.executable, script, "--quick", "--repeats", "2", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=scaled(300),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "weight_sync.json").read_text())
    assert result["shape"] == "tiny-152k" and result["bytes"] > 1_000_000
    methods = ("disk", "tensor", "distributed")
    assert {m: len(v) for m, v in result["runs"].items()} == {m: 2 for m in methods}
    assert all(s > 0 for runs in result["runs"].values() for s in runs)
    assert (tmp_path / "weight_sync.png").stat().st_size > 5_000
