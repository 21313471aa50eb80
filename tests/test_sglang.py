"""The SGLang client against a stand-in server.

SGLang needs a CUDA GPU, which this machine does not have, so these tests run the real client
(real HTTP over loopback, real trio, the model's real tokenizer) against ``sglang_fake``, a small
in-process HTTP server that speaks the request and response shapes of SGLang's native API as
SGLang documents them. It stands in for a real SGLang server; it is not one (it samples from the
regex instead of a model, and its logprobs are stand-in numbers).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path

import msgspec
import pytest
import trio
from hf_tiny import make_model, make_tokenizer
from sglang_fake import FakeSGLang, stand_in_logprob

from collective.actions import ActionSpace, ArgSpec, ToolSpec, parse_action
from collective.cli import main as cli_main
from collective.records import load_episode
from collective.replay import verify
from collective.seeding import derive
from policy.base import PolicyError, PolicyRequest
from policy.constraint import action_ebnf, action_regex
from policy.factory import make_policy
from policy.hf import HFModel
from policy.hf_prompt import prompt_ids
from policy.sglang import SGLangPolicy, SGLangServer, free_port
from worlds.tally import Tally

FAKE_SCRIPT = Path(__file__).with_name("sglang_fake.py")
WAIT = ToolSpec("wait", (ArgSpec("seconds", "int", lo=0, hi=600),), "wait")
SPACE = ActionSpace((*Tally(3).tool_specs(), WAIT))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("model")
    make_tokenizer(directory)
    return directory


@pytest.fixture
def fake(model_dir: Path):
    server = FakeSGLang(model_dir).start()
    yield server
    server.stop()


def client(url: str, **kw) -> SGLangPolicy:
    kw = {"timeout": 5.0, "attempts": 3, "backoff": 0.01, **kw}
    return SGLangPolicy(url, **kw)


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


def test_a_batch_is_one_request_and_answers_tokens_logprobs_and_version(fake, model_dir):
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


def test_weight_sync_pauses_updates_continues_and_bumps_the_version(fake, tmp_path):
    policy = client(fake.url)
    (tmp_path / "config.json").write_text("{}")  # what the stand-in checks for
    assert [r.version for r in trio.run(policy.generate, requests(2))] == [0, 0]
    n_before = len(fake.log)

    trio.run(policy.update_weights, tmp_path, 3)

    assert [p for p, _ in fake.log[n_before:]] == [
        "/pause_generation",
        "/update_weights_from_disk",
        "/continue_generation",
    ]
    assert fake.posts("/update_weights_from_disk")[0] == {
        "model_path": str(tmp_path),
        "weight_version": "3",
    }
    assert not fake.paused
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


def test_a_failed_update_resumes_generation_and_keeps_the_version(fake, tmp_path):
    policy = client(fake.url)
    with pytest.raises(PolicyError, match=r"update_weights_from_disk.*HTTP 400.*Failed to get"):
        trio.run(policy.update_weights, tmp_path / "missing", 1)
    assert [p for p, _ in fake.log][-1] == "/continue_generation"
    assert not fake.paused
    assert policy.version == 0
    with pytest.raises(ValueError, match="version must be >= 0"):
        trio.run(policy.update_weights, tmp_path, -1)


def test_a_request_pinned_to_another_version_is_refused(fake):
    policy = client(fake.url)
    reqs = [
        msgspec.structs.replace(r, version=v) for r, v in zip(requests(3), [-1, 0, 2], strict=True)
    ]
    with pytest.raises(PolicyError, match=r"holds policy version 0.*agent 2 turn 0.*\[2\]"):
        trio.run(policy.generate, reqs)
    assert fake.posts("/generate") == []  # refused before anything was sampled
    assert len(trio.run(policy.generate, reqs[:2])) == 2  # latest (-1) and 0 are version 0


def test_weights_changed_behind_the_clients_back_are_an_error(fake, tmp_path):
    policy = client(fake.url)
    (tmp_path / "config.json").write_text("{}")
    trio.run(policy.update_weights, tmp_path, 1)
    fake.weight_version = "7"  # another client loaded other weights
    with pytest.raises(PolicyError, match=r"weight version '7'.*loaded '1'"):
        trio.run(policy.generate, requests(1))


@pytest.mark.parametrize("fault", ["503", "500", "drop"])
def test_transient_failures_are_retried_then_succeed(fake, fault):
    fake.faults = [fault, fault]
    out = trio.run(client(fake.url, attempts=3).generate, requests(2))
    assert len(fake.posts("/generate")) == 3
    assert all(parse_action(r.text, SPACE) for r in out)


def test_an_error_status_fails_after_bounded_retries(fake):
    fake.faults = ["500"] * 10
    with pytest.raises(PolicyError) as e:
        trio.run(client(fake.url, attempts=3).generate, requests(2))
    assert len(fake.posts("/generate")) == 3
    assert fake.url in str(e.value) and "failed 3 times" in str(e.value)
    assert "agent 0 turn 0" in str(e.value) and "HTTP 500" in str(e.value)


def test_a_refusal_is_not_retried(fake):
    fake.faults = ["400"]
    with pytest.raises(PolicyError, match=r"refused with HTTP 400.*stand-in bad request"):
        trio.run(client(fake.url).generate, requests(1))
    assert len(fake.posts("/generate")) == 1


def test_server_down_is_a_clear_error():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(PolicyError) as e:
        trio.run(client(url, attempts=3, tokenizer=make_tokenizer()).generate, requests(2, turn=5))
    assert url in str(e.value) and "agent 0 turn 5" in str(e.value)
    assert "ConnectError" in str(e.value)
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


def test_an_aborted_prompt_is_sent_again_alone(fake):
    fake.faults = ["abort-first"]
    out = trio.run(client(fake.url).generate, requests(3))
    first, second = fake.posts("/generate")
    assert len(first["input_ids"]) == 3 and second["input_ids"] == first["input_ids"][:1]
    assert all(parse_action(r.text, SPACE) for r in out)


def test_a_prompt_aborted_every_time_is_an_error_and_a_refused_one_is_not_retried(fake):
    fake.faults = ["abort-first"] * 3
    with pytest.raises(PolicyError, match=r"aborted 3 times .*agent 0 turn 0.*Abort before"):
        trio.run(client(fake.url, attempts=3).generate, requests(2))
    fake.faults = ["refuse-first"]
    with pytest.raises(PolicyError, match=r"agent 0 turn 0: the server refused it: 'Invalid"):
        trio.run(client(fake.url).generate, requests(2))


def test_a_near_greedy_temperature_is_refused_before_anything_is_sent(fake):
    reqs = [msgspec.structs.replace(r, temperature=1e-6) for r in requests(1)]
    with pytest.raises(PolicyError, match="temperature 1e-06; below 1e-05 SGLang samples greedily"):
        trio.run(client(fake.url).generate, reqs)
    assert fake.posts("/generate") == []


def test_bad_arguments_are_refused_early():
    with pytest.raises(ValueError, match="http://"):
        SGLangPolicy("127.0.0.1:30000")
    with pytest.raises(ValueError, match="'regex' or 'ebnf'"):
        SGLangPolicy("http://127.0.0.1:1", constraint="json")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sglang:http://HOST:PORT or sglang:launch:MODEL"):
        make_policy("sglang:somewhere")


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


def test_launch_starts_waits_for_health_and_stops(model_dir):
    server = SGLangServer.launch(model_dir, command=[sys.executable, str(FAKE_SCRIPT)], timeout=60)
    try:
        assert server.url.startswith("http://127.0.0.1:")
        policy = SGLangPolicy(server.url, tokenizer=model_dir, server=server, backoff=0.01)
        out = trio.run(policy.generate, requests(2))
        assert all(parse_action(r.text, SPACE) for r in out)
    finally:
        trio.run(policy.aclose)
    assert server.proc.poll() is not None  # the process is gone
    assert not server.log.exists()


def test_a_server_that_dies_at_start_is_reported_with_its_log(model_dir):
    crash = [sys.executable, "-c", "import sys; print('no GPU found'); sys.exit(3)"]
    with pytest.raises(PolicyError, match=r"exited with code 3(.|\n)*no GPU found") as e:
        SGLangServer.launch(model_dir, command=crash, timeout=30)
    log = Path(str(e.value).split("its log (")[1].split(")")[0])
    assert "no GPU found" in log.read_text()  # kept for whoever reads the error
    log.unlink()


def test_a_server_that_never_gets_healthy_times_out_and_is_stopped(model_dir):
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    t0 = time.monotonic()
    with pytest.raises(PolicyError, match=r"not healthy after 1s") as e:
        SGLangServer.launch(model_dir, command=sleeper, timeout=1)
    Path(str(e.value).split("its log (")[1].split(")")[0]).unlink()
    assert time.monotonic() - t0 < 20


def test_launch_without_sglang_installed_says_so(model_dir):
    if importlib.util.find_spec("sglang") is not None or shutil.which("sglang"):
        pytest.skip("sglang is installed here")
    with pytest.raises(PolicyError, match="not installed"):
        make_policy(f"sglang:launch:{model_dir}")


def test_rlcr_on_the_hf_backend_sends_every_new_version_to_the_server(fake, tmp_path):
    """The RLCR loop with a Hugging Face model served by SGLang, end to end, as far as this
    machine allows: the stand-in server samples (its logprobs are stand-ins, so this checks the
    plumbing, not learning): each learner step writes the weights where the server loads them,
    pauses, loads, continues, and tokens sampled afterwards carry the new version."""
    from collective.train import TrainConfig, read_metrics, train

    tokenizer = make_tokenizer()
    start = HFModel(make_model(tokenizer), tokenizer).save(tmp_path / "start")
    cfg = TrainConfig(
        backend="hf",
        hf_model=str(start),
        hf_server=f"sglang:{fake.url}",
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
    rows = train(cfg, tmp_path / "run", progress=False)
    assert [r.version for r in rows] == [1, 2, 3]
    updates = fake.posts("/update_weights_from_disk")
    assert [u["weight_version"] for u in updates] == ["1", "2", "3"]
    assert all(
        Path(u["model_path"]).parent == tmp_path / "run" / "checkpoints" / "served" for u in updates
    )
    calls = [path for path, _ in fake.log if path not in ("/generate", "/get_model_info")]
    assert calls[:3] == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"]
    versions = {
        t.version
        for p in (tmp_path / "run" / "episodes").glob("*.msgpack")
        for t in load_episode(p).turns
    }
    assert versions <= {0, 1, 2, 3} and 0 in versions and len(versions) > 1
    assert (tmp_path / "run" / "checkpoints" / "latest" / "config.json").is_file()
    assert len(read_metrics(tmp_path / "run")) == 3
