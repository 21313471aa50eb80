"""Hugging Face models built here, from nothing: no downloads.

- :func:`make_tokenizer` / :func:`make_model`: a byte-level BPE trained in a fraction of a second
  on action-like text (it encodes any string and decodes it back exactly), with a ChatML chat
  template, and a two-layer Llama with tiny dimensions and random weights over it. Tests of the
  SGLang client and of the HF learner's mechanics use them in place of a real model.
- :func:`tiny_lm`: the real thing a user builds with ``collective make-model tiny-lm`` (built
  once per test session and shared, read-only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

CORPUS = [
    'add 1 add 2 add 3 mark red mark green mark blue note "add more" sleep 3 wait 30',
    'msg 2 "count is near the target" post general "done" read general put "a note"',
    "search more agent 0: count 4 of 30 Tools: Answer with exactly one action on one line",
    "hire fire none 0 1 2 3 4 5 6 7 8 9 10 20 30 100 600 the a of to",
]


def make_tokenizer(directory: Path | None = None) -> Any:
    """A PreTrainedTokenizerFast with <pad>, <eos> and a chat template, saved to ``directory``
    when given."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from policy.hf.make import CHAT_TEMPLATE

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<pad>", "<eos>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")
    hf.chat_template = CHAT_TEMPLATE
    if directory is not None:
        hf.save_pretrained(str(directory))
    return hf


def make_model(tokenizer: Any, seed: int = 0, vocab_size: int | None = None) -> Any:
    """A randomly initialised two-layer Llama over ``tokenizer``'s vocabulary (or a padded one
    of ``vocab_size`` rows, as Qwen pads its own)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``collective make-model tiny-lm DIR`` (seed 0), once per session; do not write into it."""
    from collective.rl.make_model import make_tiny_lm

    return make_tiny_lm(tmp_path_factory.mktemp("models") / "tiny-lm", seed=0)
