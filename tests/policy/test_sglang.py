"""The SGLang client against stand-in servers.

SGLang needs a CUDA GPU, which this machine does not have, so these tests run the real client
(real HTTP over loopback, real trio, the model's real tokenizer, real server processes where a
process matters) against ``sglang_fake``, a small HTTP server that answers as SGLang's native API
does, refusals included (its docstring cites the real source for each). It stands in for a real
SGLang server; it is not one (it samples from the regex instead of a model, and its logprobs are
stand-in numbers).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import msgspec
import pytest
import structlog
import trio

from collective import ActionSpace, ArgSpec, ToolSpec, load_episode, parse_action
from collective.base import log as logsetup
from collective.base.seeding import derive
from collective.cli import main as cli_main
from collective.replay import verify
from policy.base import PolicyError, PolicyRequest
from policy.constraint import action_ebnf, action_regex
from policy.factory import make_policy
from policy.hf.model import HFModel
from policy.hf.prompt import prompt_ids
from policy.sglang import (
    SGLangPolicy,
    SGLangServer,
    by_head,
    free_port,
    parse_spec,
    policy_from_spec,
    split,
)
from tests.support import SUPPORT
from tests.support.busy import scaled
from tests.support.hf_tiny import make_model, make_tokenizer
from tests.support.sglang_fake import FakeSGLang, RadixCache, stand_in_logprob
from worlds.tally import Tally

FAKE = [sys.executable, str(SUPPORT / "sglang_fake.py")]
WAIT = ToolSpec("wait", (ArgSpec("seconds", "int", lo=0, hi=600),), "wait")
SPACE = ActionSpace((*Tally(3).tool_specs(), WAIT))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("model")
    make_tokenizer(directory)
    return directory


@pytest.fixture
def fake(model_dir: Path):
    server = FakeSGLang(model_dir, deterministic=True).start()
    yield server
    server.stop()


@pytest.fixture
def fleet(model_dir: Path):
    servers = [FakeSGLang(model_dir, deterministic=True).start() for _ in range(3)]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "config.json").write_text("{}")  # what the stand-in checks for
    return tmp_path / "v1"


def client(urls: str | list[str], **kw) -> SGLangPolicy:
    kw = {"timeout": 5.0, "attempts": 3, "backoff": 0.01, "wait": 5.0, **kw}
    return SGLangPolicy(urls, **kw)


def requests(n: int = 3, turn: int = 0) -> list[PolicyRequest]:
    return [
        PolicyRequest(
            agent=a,
            turn=turn,
            prompt=f"agent {a}: count 0 of 30",
            space=SPACE,
            seed=derive(11, a, turn),
            max_tokens=40,
        )
        for a in range(n)
    ]


def tokens(responses) -> list[list[int]]:
    return [r.token_ids for r in responses]


# -- one server ---------------------------------------------------------------------------------


def test_a_batch_is_one_request_and_answers_tokens_logprobs_and_version(fake):
    policy = client(fake.url)
    reqs = requests(3)
    out = trio.run(policy.generate, reqs)

    calls = fake.posts("/generate")
    assert len(calls) == 1  # the whole batch in one HTTP call
    body = calls[0]
    tokenizer = make_tokenizer()
    assert body["input_ids"] == [prompt_ids(tokenizer, r.prompt, r.space) for r in reqs]
    assert body["return_logprob"] is True
    for r, params in zip(reqs, body["sampling_params"], strict=True):
        assert params["regex"] == action_regex(SPACE)  # the constraint travels as a regex
        assert "ebnf" not in params
        assert params["sampling_seed"] == r.seed & ((1 << 63) - 1)
        assert params["max_new_tokens"] == 40 and params["temperature"] == 1.0
        assert (params["top_p"], params["top_k"], params["min_p"]) == (1.0, -1, 0.0)

    assert len(out) == 3
    for r, resp in zip(reqs, out, strict=True):
        parse_action(resp.text, SPACE)  # a valid action of the space
        assert resp.token_ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(resp.token_ids, skip_special_tokens=True) == resp.text
        assert resp.logprobs == [stand_in_logprob(t) for t in resp.token_ids]
        assert resp.prompt_tokens == len(prompt_ids(tokenizer, r.prompt, r.space))
        assert resp.version == 0
    assert trio.run(policy.generate, []) == []


def test_seeded_requests_answer_the_same_whatever_shares_their_batch(fake):
    policy = client(fake.url)
    alone = trio.run(policy.generate, requests(3)[1:2])
    together = trio.run(policy.generate, requests(3))
    assert alone[0].token_ids == together[1].token_ids


def test_ebnf_constraint_is_sent_instead_of_the_regex(fake):
    trio.run(client(fake.url, constraint="ebnf").generate, requests(2))
    for params in fake.posts("/generate")[0]["sampling_params"]:
        assert params["ebnf"] == action_ebnf(SPACE)
        assert "regex" not in params


def test_weight_sync_pauses_updates_checks_continues_and_bumps_the_version(fake, weights):
    policy = client(fake.url)
    assert [r.version for r in trio.run(policy.generate, requests(2))] == [0, 0]
    n_before = len(fake.log)

    trio.run(policy.update_weights, weights, 3)

    assert fake.log[n_before:] == [
        ("/pause_generation", {"mode": "abort"}),
        (
            "/update_weights_from_disk",
            {"model_path": str(weights), "abort_all_requests": False, "weight_version": "3"},
        ),
        ("/continue_generation", {}),
    ]
    assert not fake.paused and fake.weight_version == "3"
    assert policy.version == 3
    assert [r.version for r in trio.run(policy.generate, requests(2))] == [3, 3]


def test_weights_saved_by_the_hf_learner_load_into_the_server(fake, model_dir, tmp_path):
    tokenizer = make_tokenizer()
    model = HFModel(make_model(tokenizer), tokenizer, version=1)
    policy = client(fake.url)
    path = model.save(tmp_path / "v1")
    trio.run(policy.update_weights, path, model.version)
    assert fake.posts("/update_weights_from_disk")[-1]["model_path"] == str(path)
    assert policy.version == model.version == 1
    assert {r.version for r in trio.run(policy.generate, requests(3))} == {1}


def test_a_refused_update_names_the_server_resumes_generation_and_keeps_the_version(fake, tmp_path):
    policy = client(fake.url)
    with pytest.raises(PolicyError, match=r"Failed to get weights iterator") as e:
        trio.run(policy.update_weights, tmp_path / "missing", 1)
    assert str(e.value).startswith(f"SGLang server {fake.url} refused to load weights")
    assert "\n" not in str(e.value)
    assert [p for p, _ in fake.log][-1] == "/continue_generation"
    assert not fake.paused
    assert policy.version == 0
    assert len(trio.run(policy.generate, requests(2))) == 2  # the old weights still serve
    with pytest.raises(ValueError, match="version must be >= 0"):
        trio.run(policy.update_weights, tmp_path, -1)


def test_an_update_waits_for_the_batch_in_flight_instead_of_aborting_it(model_dir, weights):
    fake = FakeSGLang(model_dir, deterministic=True, decode_delay=0.3).start()
    policy = client(fake.url)
    got = []

    async def both() -> None:
        async def batch() -> None:
            got.extend(await policy.generate(requests(2)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(batch)
            while not fake.posts("/generate"):
                await trio.sleep(0.01)
            nursery.start_soon(policy.update_weights, weights, 1)

    try:
        trio.run(both)
    finally:
        fake.stop()
    # A pause in abort mode would have aborted the batch and its prompts been sampled again by
    # the new weights while reporting the old version; the update waited for it instead.
    assert [p for p, _ in fake.log] == [
        "/generate",
        "/pause_generation",
        "/update_weights_from_disk",
        "/continue_generation",
    ]
    assert [r.version for r in got] == [0, 0] and policy.version == 1


def test_a_request_pinned_to_another_version_is_refused(fake):
    policy = client(fake.url)
    reqs = [
        msgspec.structs.replace(r, version=v) for r, v in zip(requests(3), [-1, 0, 2], strict=True)
    ]
    with pytest.raises(PolicyError, match=r"holds policy version 0.*agent 2 turn 0.*\[2\]"):
        trio.run(policy.generate, reqs)
    assert fake.posts("/generate") == []  # refused before anything was sampled
    assert len(trio.run(policy.generate, reqs[:2])) == 2  # latest (-1) and 0 are version 0


def test_weights_changed_behind_the_clients_back_are_an_error(fake, weights):
    policy = client(fake.url)
    trio.run(policy.update_weights, weights, 1)
    fake.weight_version = "7"  # another client loaded other weights
    with pytest.raises(PolicyError, match=r"weight version '7'.*loaded '1'"):
        trio.run(policy.generate, requests(1))


def test_a_follower_waits_for_every_server_to_hold_its_version(fleet, fake, weights):
    """A rollout worker's client (a follower) pinned to version 1 while the learner's client is
    still loading it: nothing is sampled until every server reports version 1, and the answers
    carry it. The learner's client is the only one that loads weights."""
    urls = [s.url for s in fleet]
    learner, follower = client(urls), client(urls)
    follower.follow(1, "1")
    got = []

    async def both() -> None:
        async def batch() -> None:
            got.extend(await follower.generate(requests(6)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(batch)
            await trio.sleep(0.5)  # it asks /model_info; nothing is sampled meanwhile
            assert not any(s.posts("/generate") for s in fleet)
            nursery.start_soon(learner.update_weights, weights, 1)

    trio.run(both)
    assert [r.version for r in got] == [1] * 6
    assert tokens(got) == tokens(trio.run(client(fake.url).generate, requests(6)))
    for server in fleet:
        calls = [p for p, _ in server.log if p in ("/update_weights_from_disk", "/generate")]
        assert calls == ["/update_weights_from_disk", "/generate"]
    with pytest.raises(PolicyError, match="a follower does not load weights"):
        trio.run(follower.update_weights, weights, 2)


def test_a_follower_sends_again_what_older_weights_answered(fake):
    """A server that answers with other weights than the followed version (here: restarted with
    its starting weights) is waited for, and the requests are sent again once it has them."""
    fake.weight_version = "1"
    follower = client(fake.url)
    follower.follow(1, "1")
    trio.run(follower.generate, requests(1))
    fake.weight_version = "default"
    got = []

    async def later() -> None:
        async def batch() -> None:
            got.extend(await follower.generate(requests(2)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(batch)
            while len(fake.posts("/generate")) < 2:
                await trio.sleep(0.01)
            await trio.sleep(0.2)
            fake.weight_version = "1"

    trio.run(later)
    assert [r.version for r in got] == [1, 1]
    assert len(fake.posts("/generate")) == 3, "the answer of the old weights was sent again"


def test_a_follower_refuses_a_fleet_past_its_version(fake):
    fake.weight_version = "2"
    follower = client(fake.url)
    follower.follow(1, "1")
    with pytest.raises(PolicyError, match=r"reports weight version '2', later than .* '1'"):
        trio.run(follower.generate, requests(1))
    assert fake.posts("/generate") == []


@pytest.mark.parametrize("fault", ["503", "500", "drop", "unavailable-first"])
def test_transient_failures_are_retried_then_succeed(fake, fault):
    fake.faults = [fault, fault]
    policy = client(fake.url, attempts=3)
    out = trio.run(policy.generate, requests(2))
    assert len(fake.posts("/generate")) == 3
    assert all(parse_action(r.text, SPACE) for r in out)
    assert policy.lost_servers == []


def test_an_error_status_fails_after_bounded_retries(fake):
    fake.faults = ["500"] * 10
    policy = client(fake.url, attempts=3)
    with pytest.raises(PolicyError) as e:
        trio.run(policy.generate, requests(2))
    assert len(fake.posts("/generate")) == 3
    assert fake.url in str(e.value) and "failed 3 times" in str(e.value)
    assert "agent 0 turn 0" in str(e.value) and "HTTP 500" in str(e.value)
    assert policy.lost_servers == []  # it answered: failing is not being gone


def test_a_refusal_is_not_retried(fake):
    fake.faults = ["400"]
    with pytest.raises(PolicyError, match=r"refused with HTTP 400.*stand-in bad request"):
        trio.run(client(fake.url).generate, requests(1))
    assert len(fake.posts("/generate")) == 1


def test_server_down_is_a_clear_error():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(PolicyError) as e:
        trio.run(client(url, tokenizer=make_tokenizer()).generate, requests(2, turn=5))
    assert f"SGLang server {url} cannot be reached (ConnectError" in str(e.value)
    assert time.monotonic() - t0 < 5  # bounded: three quick tries


def test_malformed_json_is_an_error_naming_server_and_request(fake):
    fake.faults = ["malformed"]
    with pytest.raises(PolicyError, match=r"not JSON") as e:
        trio.run(client(fake.url).generate, requests(2, turn=4))
    assert fake.url in str(e.value) and "agent 1 turn 4" in str(e.value)


@pytest.mark.parametrize(
    ("fault", "why"),
    [
        ("bad-shape", "no meta_info"),
        ("positive-logprob", r"output_token_logprobs\[0\] is \[0.5"),
        ("ids-mismatch", "output_ids .* differ from the logprob ids"),
        ("unfinished", "finish_reason None"),
        ("truncated-prompt", r"the server read \d+ prompt tokens of the \d+ sent"),
    ],
)
def test_an_answer_not_of_the_documented_shape_is_an_error(fake, fault, why):
    fake.faults = [fault]
    with pytest.raises(PolicyError, match=f"malformed /generate answer for agent 0 turn 0: {why}"):
        trio.run(client(fake.url).generate, requests(2))
    assert len(fake.posts("/generate")) == 1  # a wrong answer is not retried into a right one


def test_a_batch_answered_short_is_an_error(fake):
    fake.faults = ["short-batch"]
    with pytest.raises(PolicyError, match=r"answered 1 items for 2 request\(s\)"):
        trio.run(client(fake.url).generate, requests(2))


def test_a_timeout_is_retried_then_reported(fake):
    fake.faults, fake.hang = ["hang", "hang"], 1.0
    with pytest.raises(PolicyError, match=r"failed 2 times \(last: timed out after 0.2s"):
        trio.run(client(fake.url, timeout=0.2, attempts=2).generate, requests(1))
    assert len(fake.posts("/generate")) == 2


def test_a_batch_past_its_deadline_is_one_error_naming_the_server(fake):
    fake.faults, fake.hang = ["hang"], 6.0  # it reads the request and sits on it
    policy = client(fake.url, timeout=5.0, deadline=0.5)
    t0 = time.monotonic()
    with pytest.raises(PolicyError) as e:
        trio.run(policy.generate, requests(2, turn=3))
    assert time.monotonic() - t0 < 3  # the deadline, not the 5 s try
    message = str(e.value)
    assert message.startswith(f"SGLang server(s) {fake.url} gave no answer for 2 request(s)")
    assert "agent 1 turn 3" in message and "batch deadline of 0.5s" in message
    assert "\n" not in message and len(fake.posts("/generate")) == 1


def test_a_silent_fleet_server_is_lost_within_the_deadline_and_its_share_moved(fleet, fake):
    """A server that reads a request and never answers uses up its tries and is lost before the
    batch's deadline: the others answer its share, as the defaults (4 x 120 s < 600 s) intend."""
    reqs = requests(6)
    alone = trio.run(client(fake.url).generate, reqs)
    fleet[1].faults, fleet[1].hang = ["hang", "hang"], 3.0
    policy = client([s.url for s in fleet], timeout=0.3, attempts=2, deadline=10.0)
    with structlog.testing.capture_logs() as logs:
        shared = trio.run(policy.generate, reqs)
    assert tokens(shared) == tokens(alone)
    assert policy.lost_servers == [fleet[1].url] and policy.requests_moved == 2
    (warning,) = [e for e in logs if e["log_level"] == "warning"]
    assert "timed out after 0.3s" in warning["why"] and warning["servers_left"] == 2


def test_losing_the_only_server_is_the_error_with_no_warning_before_it(fake):
    policy = client(fake.url)
    trio.run(policy.generate, requests(1))  # it was ready
    fake.stop()
    with (
        structlog.testing.capture_logs() as logs,
        pytest.raises(PolicyError, match=r"no server is left for 2 request.*ConnectError"),
    ):
        trio.run(policy.generate, requests(2))
    assert [e for e in logs if e["log_level"] == "warning"] == []
    assert policy.lost_servers == [fake.url] and policy.requests_moved == 0


def _collective(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("collective")
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, timeout=scaled(timeout), check=False
    )


def test_collective_run_against_a_socket_that_never_answers_ends_in_seconds():
    """A real socket that accepts connections (the kernel's backlog) and never says a word:
    `collective run` ends in one line naming the server, exit 2, after its tries of `timeout`
    (it took 4 x 300 s before)."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        t0 = time.monotonic()
        done = _collective(
            *("run", "tally", "--agents", "2"),
            *("--policy", f"sglang:{url} timeout=0.3 deadline=1"),
        )
        took = time.monotonic() - t0
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert f"SGLang server {url} cannot be reached (timed out after 0.3s" in done.stderr
    assert took < 60  # 4 tries of 0.3 s, and the command's start on a loaded machine


def test_collective_run_against_a_server_sitting_on_a_batch_ends_at_the_deadline(model_dir):
    """A real server process that answers /health and its settings, then sits on /generate:
    `collective run` ends at the spec's deadline (not its 60 s tries) in one line naming it."""
    server = SGLangServer.launch(
        model_dir,
        args=["--enable-deterministic-inference", "--fake-decode-delay", "120"],
        command=FAKE,
    )
    try:
        t0 = time.monotonic()
        done = _collective(
            *("run", "tally", "--agents", "2"),
            *("--policy", f"sglang:{server.url} timeout=60 deadline=1"),
        )
        took = time.monotonic() - t0
    finally:
        server.stop()
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert f"SGLang server(s) {server.url} gave no answer for" in done.stderr
    assert "batch deadline of 1s" in done.stderr and "servers_left" not in done.stderr
    assert took < 60  # 1 s, and the command's start on a loaded machine


def test_an_aborted_prompt_is_sent_again_alone(fake):
    fake.faults = ["abort-first"]
    out = trio.run(client(fake.url).generate, requests(3))
    first, second = fake.posts("/generate")
    assert len(first["input_ids"]) == 3 and second["input_ids"] == first["input_ids"][:1]
    assert all(parse_action(r.text, SPACE) for r in out)


def test_a_prompt_aborted_every_time_is_an_error_and_a_refused_one_fails_the_request(fake):
    fake.faults = ["abort-first"] * 3
    with pytest.raises(PolicyError, match=r"aborted 3 times .*agent 0 turn 0.*Abort before"):
        trio.run(client(fake.url, attempts=3).generate, requests(2))
    fake.faults = ["refuse-first"]
    with pytest.raises(PolicyError, match=r"refused with HTTP 400: .*Invalid grammar"):
        trio.run(client(fake.url).generate, requests(2))


def test_a_near_greedy_temperature_is_refused_before_anything_is_sent(fake):
    reqs = [msgspec.structs.replace(r, temperature=1e-6) for r in requests(1)]
    with pytest.raises(PolicyError, match="temperature 1e-06; below 1e-05 SGLang samples greedily"):
        trio.run(client(fake.url).generate, reqs)
    assert fake.posts("/generate") == []


# -- seeds, keys, start-up, older servers -------------------------------------------------------


def test_seeds_are_refused_to_a_server_that_would_ignore_them(model_dir, fake):
    plain = FakeSGLang(model_dir).start()  # started without --enable-deterministic-inference
    try:
        with pytest.raises(PolicyError) as e:
            trio.run(client(plain.url).generate, requests(2))
        assert f"SGLang server {plain.url} does not run with --enable-deterministic-inference" in (
            str(e.value)
        )
        assert "enable_deterministic_inference=False" in str(e.value)
        assert plain.posts("/generate") == []

        # What it would have done: eight copies of one seeded prompt get different answers
        # (the deterministic server answers all eight alike).
        def answers(server: FakeSGLang) -> set[tuple[int, ...]]:
            params = {"regex": action_regex(SPACE), "sampling_seed": 5}
            body = {"input_ids": [[1, 2]] * 8, "sampling_params": params}
            items = httpx.post(server.url + "/generate", json=body).json()
            return {tuple(item["output_ids"]) for item in items}

        assert len(answers(plain)) > 1 and len(answers(fake)) == 1
        # seeds=off sends none, and says so.
        with structlog.testing.capture_logs() as logs:
            policy = policy_from_spec(f"{plain.url} seeds=off")
            assert len(trio.run(policy.generate, requests(2))) == 2
        assert "sampling_seed" not in plain.posts("/generate")[-1]["sampling_params"][0]
        assert any("seeds are off" in entry["event"] for entry in logs)
    finally:
        plain.stop()


def test_a_server_older_than_sampling_seed_is_refused(model_dir):
    old = FakeSGLang(model_dir, deterministic=True, version="0.5.2").start()
    try:
        with pytest.raises(PolicyError, match=r"runs sglang 0\.5\.2; .* need sglang >= 0\.5\.3"):
            trio.run(client(old.url).generate, requests(1))
    finally:
        old.stop()


def test_an_api_key_is_sent_as_a_bearer_token(model_dir, monkeypatch):
    keyed = FakeSGLang(model_dir, deterministic=True, api_key="s3cret").start()
    try:
        with pytest.raises(PolicyError, match=r"HTTP 401 \(wrong or missing API key\?\)"):
            trio.run(client(keyed.url).generate, requests(1))
        monkeypatch.setenv("FLEET_KEY", "s3cret")
        policy = policy_from_spec(f"{keyed.url} api-key-env=FLEET_KEY")
        assert len(trio.run(policy.generate, requests(2))) == 2
        assert "s3cret" not in policy.name  # the spec names the variable, not the key
        monkeypatch.delenv("FLEET_KEY")
        with pytest.raises(ValueError, match="api-key-env=FLEET_KEY, but that environment"):
            policy_from_spec(f"{keyed.url} api-key-env=FLEET_KEY")
    finally:
        keyed.stop()


def test_a_starting_server_is_waited_for_up_to_a_limit(model_dir):
    starting = FakeSGLang(model_dir, deterministic=True, startup=0.6).start()
    slow = FakeSGLang(model_dir, deterministic=True, startup=60).start()
    try:
        assert len(trio.run(client(starting.url).generate, requests(1))) == 1
        with pytest.raises(PolicyError) as e:
            trio.run(client(slow.url, wait=0.5).generate, requests(1))
        assert str(e.value).startswith(
            f"SGLang server {slow.url} was not ready after 0.5s (last: HTTP 503, still starting)"
        )
        assert slow.posts("/generate") == []
    finally:
        starting.stop()
        slow.stop()


def test_older_servers_are_read_through_the_names_they_had(model_dir, weights):
    legacy = FakeSGLang(model_dir, deterministic=True, legacy=True).start()
    try:
        assert httpx.get(legacy.url + "/model_info").status_code == 404
        policy = client(legacy.url)  # no tokenizer given: read from /get_model_info
        assert len(trio.run(policy.generate, requests(2))) == 2
        trio.run(policy.update_weights, weights, 2)  # checked through /get_model_info
        assert legacy.weight_version == "2" and policy.version == 2
    finally:
        legacy.stop()


def test_the_stand_in_refuses_what_sglang_refuses(model_dir):
    """The stand-in's own strictness, which the tests above rely on (its docstring cites where
    the real server does each of these)."""
    fake = FakeSGLang(model_dir, deterministic=True, decode_delay=0.3).start()
    regex = action_regex(SPACE)

    def generate(params: dict) -> httpx.Response:
        body = {"input_ids": [[5, 6]], "sampling_params": params, "return_logprob": True}
        return httpx.post(fake.url + "/generate", json=body, timeout=10)

    try:
        r = generate({"regex": regex, "seed": 1})  # SGLang's key is sampling_seed
        assert (r.status_code, r.text) == (500, "Internal Server Error")
        r = generate({"regex": regex, "ebnf": 'root ::= "a"'})
        assert r.status_code == 400 and "Only one of regex" in r.json()["error"]["message"]
        assert generate({"regex": regex, "top_p": 0.0}).status_code == 400
        fake.faults = ["refuse-first"]  # an abort with status 400 fails the whole request
        assert generate({"regex": regex}).status_code == 400
        bad_mode = httpx.post(fake.url + "/pause_generation", json={"mode": "sideways"})
        assert bad_mode.status_code == 400 and not fake.paused
        # A pause in abort mode aborts what is in flight; the item comes back in an HTTP 200.
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(generate, {"regex": regex, "sampling_seed": 3})
            while not fake.posts("/generate")[4:]:
                time.sleep(0.01)
            assert httpx.post(fake.url + "/pause_generation", json={}).status_code == 200
            answer = in_flight.result()
        assert answer.status_code == 200
        assert answer.json()[0]["meta_info"]["finish_reason"]["type"] == "abort"
        httpx.post(fake.url + "/continue_generation", json={})
        assert generate({"regex": regex, "sampling_seed": 3}).json()[0]["output_ids"]
    finally:
        fake.stop()


# -- the fleet ----------------------------------------------------------------------------------


def test_split_is_contiguous_near_equal_and_keeps_the_order():
    assert split(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split([1, 2], 3) == [[1], [2], []]
    for n in range(12):
        for parts in range(1, 5):
            shares = split(list(range(n)), parts)
            assert [i for share in shares for i in share] == list(range(n))
            assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_a_batch_is_split_over_the_fleet_and_answers_as_one_server_would(fleet, fake):
    reqs = requests(7)
    alone = trio.run(client(fake.url).generate, reqs)
    policy = client([s.url for s in fleet])
    shared = trio.run(policy.generate, reqs)
    assert tokens(shared) == tokens(alone)
    assert [r.text for r in shared] == [r.text for r in alone]
    tokenizer = make_tokenizer()
    ids = [prompt_ids(tokenizer, r.prompt, r.space) for r in reqs]
    sent = [s.posts("/generate")[0]["input_ids"] for s in fleet]
    # near-equal contiguous shares of the batch in its prompts' order: shared heads together
    assert [len(share) for share in sent] == [3, 2, 2]
    assert [p for share in sent for p in share] == sorted(ids)


def _cache_share(ids: list[list[int]], order: list[int], servers: int) -> float:
    """The share of prompt tokens the servers' radix caches serve when ``order`` is split
    into contiguous shares, one per server."""
    caches = [RadixCache() for _ in range(servers)]
    for cache, share in zip(caches, split(order, servers), strict=True):
        for i in share:
            cache.insert(ids[i])
    return sum(c.hits for c in caches) / sum(c.tokens for c in caches)


def test_requests_that_share_a_head_go_to_one_server(fleet):
    """Three action spaces (three tool lists: three prompt heads) arriving interleaved: split in
    arrival order every server prefills every head; split in the prompts' order each head is
    prefilled once, and the fleet's caches serve what the client counts."""
    tools = (*Tally(3).tool_specs(), WAIT)
    spaces = [ActionSpace(tools[k:] + tools[:k]) for k in range(3)]  # same tools, other orders
    reqs = [
        PolicyRequest(
            agent=a,
            turn=0,
            prompt=f"agent {a}",
            space=spaces[a % 3],
            seed=derive(5, a),
            max_tokens=8,
        )
        for a in range(9)
    ]
    tokenizer = make_tokenizer()
    ids = [prompt_ids(tokenizer, r.prompt, r.space) for r in reqs]
    assert _cache_share(ids, by_head(range(9), ids), 3) > 2 * _cache_share(ids, list(range(9)), 3)
    policy = client([s.url for s in fleet])
    trio.run(policy.generate, reqs)
    for server in fleet:  # one head (one space) per server
        (sent,) = [b["input_ids"] for b in server.posts("/generate")]
        assert len({reqs[ids.index(p)].space for p in sent}) == 1
    assert policy.cached_tokens == sum(s.radix.hits for s in fleet) > 0


def test_a_workshop_batch_keeps_its_cache_hits_when_split_by_head():
    """On a real workshop batch (random agents, 6 episodes of 8, the largest batch asked) the
    split by head costs the caches nothing against arrival order (a measurement, not a law:
    sorting is not guaranteed to win; the shares it measured are in
    bench/results/sglang_client/README.md): the prompts share the header and tool list and
    little more, and the conductor asks episode by episode."""
    from collective import Conductor, EpisodeConfig
    from policy.uniform import RandomPolicy

    class Batches(RandomPolicy):
        def __init__(self) -> None:
            super().__init__()
            self.batches: list[list[PolicyRequest]] = []

        async def generate(self, requests):
            self.batches.append(list(requests))
            return await super().generate(requests)

    cfgs = [
        EpisodeConfig(world="workshop", agents=8, world_seed=s, sample_seed=s, time_limit=60.0)
        for s in range(6)
    ]
    policy = Batches()
    trio.run(lambda: Conductor(policy).play(cfgs, concurrency=6))
    batch = max(policy.batches, key=len)
    tokenizer = make_tokenizer()
    ids = [prompt_ids(tokenizer, r.prompt, r.space) for r in batch]
    arrival = _cache_share(ids, list(range(len(ids))), 3)
    by_prompt = _cache_share(ids, by_head(range(len(ids)), ids), 3)
    assert len(batch) >= 24 and by_prompt > arrival - 0.01 and arrival > 0.5


def test_the_shares_of_a_batch_are_sent_at_once(fleet):
    """The second server holds its share (paused, as during someone else's weight update); the
    third gets its share meanwhile, which a client sending shares one after another would not."""
    _, held, third = fleet
    held.post("/pause_generation", {"mode": "in_place"})
    policy = client([s.url for s in fleet])
    got = []

    async def scenario() -> None:
        async def batch() -> None:
            got.extend(await policy.generate(requests(6)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(batch)
            with trio.fail_after(10):
                while not (held.posts("/generate") and third.posts("/generate")):
                    await trio.sleep(0.01)
            assert not got  # the held share keeps the batch open
            held.post("/continue_generation", {})

    trio.run(scenario)
    assert len(got) == 6


def test_a_lost_server_has_its_requests_answered_by_the_others(fleet, fake):
    reqs = requests(7)
    alone = trio.run(client(fake.url).generate, reqs)
    policy = client([s.url for s in fleet])
    trio.run(policy.generate, requests(1))  # all three were ready
    fleet[1].stop()  # gone: connections refused
    with structlog.testing.capture_logs() as logs:
        shared = trio.run(policy.generate, reqs)
    assert tokens(shared) == tokens(alone)
    assert policy.lost_servers == [fleet[1].url] and policy.requests_moved == 2
    assert policy.live_servers == [fleet[0].url, fleet[2].url]
    (warning,) = [e for e in logs if e["log_level"] == "warning"]
    assert warning["server"] == fleet[1].url and warning["requests_moved"] == 2
    assert "ConnectError" in warning["why"]
    before = [len(s.posts("/generate")) for s in fleet]
    trio.run(policy.generate, reqs)  # the lost one is not tried again
    after = [len(s.posts("/generate")) for s in fleet]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 0, 1]
    for s in (fleet[0], fleet[2]):
        s.stop()
    with pytest.raises(PolicyError, match=r"no server is left for 7 request\(s\).*ConnectError"):
        trio.run(policy.generate, reqs)


def test_the_loss_is_written_to_stderr_even_if_logging_was_set_up_on_another(fleet, capsys):
    held, real = io.StringIO(), sys.stderr
    sys.stderr = held  # as a test runner holds it while the command line sets up logging
    logsetup.configure(0)
    sys.stderr = real
    held.close()
    policy = client([s.url for s in fleet])
    trio.run(policy.generate, requests(1))  # all three were ready
    fleet[0].stop()
    trio.run(policy.generate, requests(3))
    err = capsys.readouterr().err
    assert "SGLang server lost; its requests go to the others" in err
    assert f"server={fleet[0].url}" in err and "requests_moved=1" in err


def test_an_update_reaches_every_server_and_a_refusal_names_its_server(fleet, weights, tmp_path):
    policy = client([s.url for s in fleet])
    trio.run(policy.update_weights, weights, 1)
    assert [s.weight_version for s in fleet] == ["1", "1", "1"]
    assert all(not s.paused for s in fleet)
    assert {r.version for r in trio.run(policy.generate, requests(6))} == {1}

    # The third server cannot read the new directory: the others load it, so the fleet is mixed.
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "config.json").write_text("{}")
    real_update = fleet[2].update_weights
    fleet[2].update_weights = lambda body: real_update({**body, "model_path": "/nowhere"})
    with pytest.raises(PolicyError) as e:
        trio.run(policy.update_weights, v2, 2)
    assert str(e.value).startswith(f"SGLang server {fleet[2].url} refused to load weights")
    assert "\n" not in str(e.value)
    assert all(not s.paused for s in fleet) and policy.version == 1
    with pytest.raises(PolicyError, match="may hold different weights: nothing is generated"):
        trio.run(policy.generate, requests(2))
    fleet[2].update_weights = real_update
    trio.run(policy.update_weights, v2, 2)  # an update that reaches every server mends it
    assert {r.version for r in trio.run(policy.generate, requests(6))} == {2}


def test_a_server_that_does_not_record_the_version_fails_the_check(fleet, weights):
    fleet[0].records_version = False  # as a server that ignores weight_version
    policy = client([s.url for s in fleet])
    with pytest.raises(PolicyError, match=r"reports weight_version 'default' after loading"):
        trio.run(policy.update_weights, weights, 1)
    assert all(not s.paused for s in fleet)


def test_servers_holding_different_weights_are_an_error(fleet):
    fleet[2].weight_version = "other"
    with pytest.raises(PolicyError, match="the servers hold different weights"):
        trio.run(client([s.url for s in fleet]).generate, requests(6))


def test_three_server_processes_split_update_and_survive_a_kill(model_dir, fake, weights):
    """The fleet against three real processes: one batch split over them, an update on all, and
    one killed while its share is being decoded: the others answer its requests, and every answer
    is the one an unkilled server gives."""
    flags = ["--enable-deterministic-inference"]
    servers = []
    try:
        for delay in (0, 2, 0):
            extra = ["--fake-decode-delay", str(delay)] if delay else []
            servers.append(SGLangServer.launch(model_dir, args=flags + extra, command=FAKE))
        victim = servers[1]
        policy = client([s.url for s in servers], tokenizer=model_dir, servers=servers)
        reqs = requests(9)
        reference = trio.run(client(fake.url).generate, reqs)

        trio.run(policy.update_weights, weights, 1)
        versions = [httpx.get(s.url + "/model_info").json()["weight_version"] for s in servers]
        assert versions == ["1", "1", "1"]

        got = []

        async def kill_mid_batch() -> None:
            async def batch() -> None:
                got.extend(await policy.generate(reqs))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(batch)
                with trio.fail_after(20):
                    while "generate 3 prompts" not in victim.log_tail():
                        await trio.sleep(0.02)
                os.killpg(victim.proc.pid, signal.SIGKILL)

        trio.run(kill_mid_batch)
        assert victim.proc.wait(scaled(5)) == -signal.SIGKILL
        assert tokens(got) == tokens(reference)
        assert [r.logprobs for r in got] == [r.logprobs for r in reference]
        assert {r.version for r in got} == {1}
        assert policy.lost_servers == [victim.url] and policy.requests_moved == 3
    finally:
        for server in servers:
            server.stop()


# -- the spec, the command line, launching ------------------------------------------------------


@pytest.mark.parametrize(
    ("arg", "fields"),
    [
        ("http://a:1", {"urls": ("http://a:1",)}),
        (
            "http://a:1,https://b:2 seeds=off wait=30 api-key-env=KEY constraint=ebnf tokenizer=t"
            " timeout=2.5 deadline=40",
            {
                "urls": ("http://a:1", "https://b:2"),
                "seeds": False,
                "wait": 30.0,
                "timeout": 2.5,
                "deadline": 40.0,
                "api_key_env": "KEY",
                "constraint": "ebnf",
                "tokenizer": "t",
            },
        ),
        (
            "launch:'models/my model' dp=2 mem-fraction-static=0.8 -- --attention-backend triton",
            {
                "model": "models/my model",
                "server_args": (
                    "--dp-size",
                    "2",
                    "--mem-fraction-static",
                    "0.8",
                    "--attention-backend",
                    "triton",
                ),
            },
        ),
    ],
)
def test_specs_parse(arg, fields):
    spec = parse_spec(arg)
    for key, value in fields.items():
        assert getattr(spec, key) == value


@pytest.mark.parametrize(
    ("arg", "why"),
    [
        ("", "expected sglang:URL"),
        ("somewhere", "'somewhere' is not an http:// or https:// URL"),
        ("launch:", "needs a model directory"),
        ("launch", "needs a model directory"),
        ("http://a:1 dp=2", "unknown option(s) dp; a URL spec takes seeds"),
        ("http://a:1 -- --dp-size 2", "arguments after -- are for a server this program launches"),
        ("http://a:1,http://a:1", "a server URL is given twice"),
        ("http://a:1 seeds=maybe", "seeds must be on or off"),
        ("http://a:1 wait=soon", "wait must be a number of seconds, not 'soon'"),
        ("http://a:1 wait=0", "wait must be a number of seconds > 0"),
        ("http://a:1 timeout=-1", "timeout must be a number of seconds > 0, not '-1'"),
        ("http://a:1 timeout=nan", "timeout must be a number of seconds > 0"),
        ("http://a:1 deadline=inf", "deadline must be a number of seconds > 0, not 'inf'"),
        ("http://a:1 deadline=soon", "deadline must be a number of seconds, not 'soon'"),
        ("http://a:1 api-key-env=my-key", "is not an environment variable name"),
        ("launch:m --enable-torch-compile", "is not OPTION=VALUE"),
        ("launch:m port=8", "--port is set by the launcher"),
        ("launch:m -- --api-key k", "--api-key is set by the launcher"),
        ("launch:m dp=1 dp=2", "option 'dp' is given twice"),
        ("launch:m 'unclosed", "cannot split it into words"),
    ],
)
def test_bad_specs_are_one_line_errors(arg, why):
    with pytest.raises(ValueError) as e:
        parse_spec(arg)
    assert str(e.value).startswith(f"policy sglang:{arg}: ") and why in str(e.value)
    assert "\n" not in str(e.value)


def test_the_spec_sets_the_client_time_bounds_and_defaults_suit_a_fleet():
    policy = make_policy("sglang:http://127.0.0.1:1 timeout=7 deadline=9 wait=11")
    assert (policy.timeout, policy.deadline, policy.wait) == (7.0, 9.0, 11.0)
    assert policy.follower_args()["deadline"] == 9.0  # a Ray worker's client has the same
    default = make_policy("sglang:http://127.0.0.1:1")
    # a silent server uses up its tries (with their backoff) before the batch's deadline ends
    tries = default.attempts * default.timeout + default.backoff * (2 ** (default.attempts - 1) - 1)
    assert tries < default.deadline <= 600


def test_bad_arguments_are_refused_early(tmp_path):
    with pytest.raises(ValueError, match="http://"):
        SGLangPolicy("127.0.0.1:30000")
    with pytest.raises(ValueError, match="'regex' or 'ebnf'"):
        SGLangPolicy("http://127.0.0.1:1", constraint="json")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is not an http:// or https:// URL"):
        make_policy("sglang:somewhere")
    with pytest.raises(ValueError, match=r"model directory '.*nothing' does not exist"):
        make_policy(f"sglang:launch:{tmp_path / 'nothing'}")
    with pytest.raises(ValueError, match=r"tokenizer directory '.*nothing' does not exist"):
        make_policy(f"sglang:http://127.0.0.1:1 tokenizer={tmp_path / 'nothing'}")


def test_collective_run_with_sglang_gives_a_replayable_episode(fake, tmp_path, capsys):
    out = tmp_path / "e.msgpack"
    code = cli_main(
        [
            *("run", "tally", "--agents", "3", "--time-limit", "120"),
            *("--policy", f"sglang:{fake.url}", "--out", str(out)),
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    ep = load_episode(out)
    assert ep.config.policy == f"sglang:{fake.url}"
    assert ep.turns and summary["turns"] == len(ep.turns)
    batches = fake.posts("/generate")
    assert len(batches) < len(ep.turns)  # agents thinking together shared a request
    assert all(t.version == 0 for t in ep.turns)
    assert verify(ep) is None  # replays event for event


def test_a_bad_spec_on_the_command_line_is_exit_2(capsys):
    code = cli_main(["run", "tally", "--policy", "sglang:http://a:1 dp=2"])
    assert code == 2
    assert "unknown option(s) dp" in capsys.readouterr().err


def test_launch_passes_server_arguments_waits_for_health_and_stops(model_dir):
    spec = f"launch:{model_dir} dp=2 mem-fraction-static=0.7 -- --fake-startup 1"
    policy = policy_from_spec(spec, command=FAKE)
    (server,) = policy.servers
    try:
        assert server.url.startswith("http://127.0.0.1:")
        info = httpx.get(server.url + "/server_info").json()
        assert (info["dp_size"], info["mem_fraction_static"]) == (2, 0.7)
        assert info["enable_deterministic_inference"] is True  # seeds are on
        out = trio.run(policy.generate, requests(2))
        assert all(parse_action(r.text, SPACE) for r in out)
    finally:
        trio.run(policy.aclose)
    assert server.proc.poll() is not None  # the process is gone
    assert not server.log.exists()


def test_a_server_that_refuses_an_argument_is_reported_with_its_log(model_dir):
    with pytest.raises(PolicyError, match=r"exited with code 2(.|\n)*--no-such-flag") as e:
        policy_from_spec(f"launch:{model_dir} -- --no-such-flag", command=FAKE)
    log = Path(str(e.value).split("its log (")[1].split(")")[0])
    assert "unrecognized arguments: --no-such-flag" in log.read_text()
    log.unlink()


def test_a_server_that_never_gets_healthy_times_out_and_is_stopped(model_dir, tmp_path):
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    t0 = time.monotonic()
    with pytest.raises(PolicyError, match=r"not healthy after 1s \(last: ConnectError\)") as e:
        SGLangServer.launch(model_dir, command=sleeper, timeout=1)
    Path(str(e.value).split("its log (")[1].split(")")[0]).unlink()
    assert time.monotonic() - t0 < 20
    # A server that listens but keeps answering 503 (loading): the error says so.
    starting = FakeSGLang(model_dir, startup=60).start()
    proc = subprocess.Popen(sleeper, start_new_session=True)
    server = SGLangServer(proc, starting.url, tmp_path / "log")
    try:
        with pytest.raises(PolicyError, match=r"after 0.5s \(last: HTTP 503, still starting\)"):
            server.wait_healthy(0.5)
    finally:
        server.stop()
        starting.stop()
    assert proc.poll() is not None


def test_launch_without_sglang_installed_says_so(model_dir):
    if importlib.util.find_spec("sglang") is not None or shutil.which("sglang"):
        pytest.skip("sglang is installed here")
    with pytest.raises(PolicyError, match="not installed"):
        make_policy(f"sglang:launch:{model_dir}")


def test_rlcr_on_the_hf_backend_sends_every_new_version_to_the_server(
    fake, sglang_train_config, tmp_path
):
    """The RLCR loop with a Hugging Face model served by SGLang, end to end, as far as this
    machine allows: the stand-in server samples (its logprobs are stand-ins, so this checks the
    plumbing, not learning): each learner step writes the weights where the server loads them,
    pauses, loads, continues, and tokens sampled afterwards carry the new version."""
    from collective.rl.train import read_metrics, train

    tokenizer = make_tokenizer()
    start = HFModel(make_model(tokenizer), tokenizer).save(tmp_path / "start")
    cfg = sglang_train_config(start, [fake.url])
    rows = train(cfg, tmp_path / "run", progress=False)
    assert [r.version for r in rows] == [1, 2, 3]
    updates = fake.posts("/update_weights_from_disk")
    assert [u["weight_version"] for u in updates] == ["1", "2", "3"]
    assert all(
        Path(u["model_path"]).parent == tmp_path / "run" / "checkpoints" / "served" for u in updates
    )
    calls = [path for path, _ in fake.log if path != "/generate"]
    assert calls[:3] == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"]
    versions = {
        t.version
        for p in (tmp_path / "run" / "episodes").glob("*.msgpack")
        for t in load_episode(p).turns
    }
    assert versions <= {0, 1, 2, 3} and 0 in versions and len(versions) > 1
    assert (tmp_path / "run" / "checkpoints" / "latest" / "config.json").is_file()
    assert len(read_metrics(tmp_path / "run")) == 3
