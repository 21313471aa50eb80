"""``collective make-model tiny-lm DIR``: a real Hugging Face model directory, built offline.

The directory must be what a user's own model directory is: loadable by ``AutoModelForCausalLM``
and ``AutoTokenizer`` (and so by SGLang), a Qwen2 causal LM with a chat template, and the same
bytes for the same seed.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collective import ActionSpace
from collective.rl.make_model import make_tiny_lm
from tests.support.hf_tiny import tiny_lm  # noqa: F401  (a fixture)

PROMPT = [{"role": "user", "content": "agent 0: count 3 of 20"}]


def digest(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def test_it_is_a_qwen2_causal_lm_with_a_chat_template(tiny_lm):  # noqa: F811
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_lm), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_lm), local_files_only=True)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert json.loads((tiny_lm / "config.json").read_text())["architectures"] == [
        "Qwen2ForCausalLM"
    ]
    n = sum(p.numel() for p in model.parameters())
    assert 1_000_000 < n < 10_000_000, n
    # the vocabulary the grammar masks over: the tokenizer's, padded to the model's rows
    assert len(tokenizer) <= model.config.vocab_size < len(tokenizer) + 64
    text = tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nagent 0: count 3 of 20<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(ids[:1]) == ["<|im_start|>"]
    assert (
        tokenizer.eos_token
        == "<|im_end|>"
        == tokenizer.convert_ids_to_tokens(model.generation_config.eos_token_id)
    )
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), model.config.vocab_size)
    # the words of the worlds are tokens: a prompt line is a handful, not one per byte
    assert len(tokenizer.encode("agent 0: count 3 of 20")) <= 12


_TOKENIZERS: dict[Path, object] = {}


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=60))
def test_the_tokenizer_round_trips_any_text(tiny_lm, text):  # noqa: F811
    from policy.hf.prompt import load_tokenizer

    if tiny_lm not in _TOKENIZERS:
        _TOKENIZERS[tiny_lm] = load_tokenizer(tiny_lm)
    tokenizer = _TOKENIZERS[tiny_lm]
    # NFC first: Qwen2's normaliser, kept on purpose (module policy.hf.make)
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == (
        unicodedata.normalize("NFC", text)
    )


def test_same_seed_same_bytes_other_seed_other_weights(tiny_lm, tmp_path):  # noqa: F811
    again = make_tiny_lm(tmp_path / "again", seed=0)
    assert digest(again) == digest(tiny_lm)
    other = digest(make_tiny_lm(tmp_path / "other", seed=1))
    assert other["model.safetensors"] != digest(tiny_lm)["model.safetensors"]


def test_the_command_line_builds_one_and_refuses_to_overwrite(tmp_path, capsys):
    from collective.cli import main

    assert main(["make-model", "tiny-lm", str(tmp_path / "m")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == str(tmp_path / "m") and 1_000_000 < out["parameters"] < 10_000_000
    assert main(["make-model", "tiny-lm", str(tmp_path / "m")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"collective make-model: error: {tmp_path / 'm'} exists and is not empty "
        "(pick a new directory)"
    ]
    with pytest.raises(SystemExit):
        main(["make-model", "gpt5", str(tmp_path / "x")])
    assert "invalid choice: 'gpt5'" in capsys.readouterr().err


def test_tiny_lm_reads_its_whole_prompt_as_one_user_turn(tiny_lm):  # noqa: F811
    """Not as a chat model's system and user turns: its tokenizer was trained on the one-turn
    rendering, and the runs recorded with it must read the same ids."""
    from policy.hf.prompt import is_chat, load_tokenizer, prompt_text, render
    from worlds.tally import Tally

    space = ActionSpace(Tally(2).tool_specs())
    tokenizer = load_tokenizer(tiny_lm)
    assert not is_chat(tokenizer)
    assert prompt_text(tokenizer, "count 3 of 20", space) == (
        f"<|im_start|>user\n{render('count 3 of 20', space)}<|im_end|>\n<|im_start|>assistant\n"
    )
