"""A real Hugging Face model directory, built here: the ``tiny-lm`` of ``collective make-model``.

Nothing is downloaded. The directory holds what a user's own model directory holds, in the same
layout (``save_pretrained``): ``config.json`` and ``model.safetensors`` of a Qwen2-architecture
causal LM with random weights (a few million parameters), ``generation_config.json``, and a
byte-level BPE tokenizer with a ChatML chat template (Qwen's markers: ``<|im_start|>``,
``<|im_end|>``). ``AutoModelForCausalLM``, ``AutoTokenizer``, SGLang and ``--policy hf:DIR``
load it; ``collective train configs/llm-cpu.toml`` trains it with the same RLCR recipe as the
tiny byte model.

The tokenizer is trained with the ``tokenizers`` library on the texts it is given. The engine
gives it (``collective.rl.make_model``) text the built-in worlds produce: prompts as the hf path
renders them and the actions taken, so the words of prompts and actions, and whole lines of the
tool list, are single tokens. This module plays no episodes: ``policy/`` sits below the engine.

Deterministic: the same texts and seed write the same bytes (BPE training breaks ties by a fixed
order, the weights are drawn from ``torch.manual_seed(seed)``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import torch

from policy.hf.prompt import ONE_TURN_TEMPLATE

#: Qwen's chat format: a turn is ``<|im_start|>ROLE\nCONTENT<|im_end|>\n``. ``tiny-lm`` reads a
#: prompt as one user turn (``policy.hf.prompt``, which knows it by this template).
CHAT_TEMPLATE = ONE_TURN_TEMPLATE
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


class TinyLM(msgspec.Struct, frozen=True, kw_only=True):
    """The shape of ``tiny-lm``: about 1.8M parameters."""

    vocab_size: int = 2000  # the BPE's at most (the corpus gives ~700); rows: a multiple of 64
    hidden_size: int = 192
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    episodes_per_world: int = 6


def train_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """A byte-level BPE (any string encodes, and decodes back exactly) with the chat markers as
    special tokens, as a ``transformers`` fast tokenizer.

    Its normaliser and pre-tokenizer are Qwen2's own (NFC, then Qwen2's split pattern, taken
    from ``transformers``): transformers 5 loads any ``qwen2`` model's tokenizer through its
    Qwen2 class, which sets exactly these, and transformers 4 (what SGLang runs) reads
    ``tokenizer.json`` as written, so both tokenize alike only if they are the ones trained."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def _portable_tokenizer_config(directory: Path, context: int) -> None:
    """``tokenizer_config.json`` as transformers 4 and 5 both read it: the Qwen2 tokenizer class
    (transformers 5 writes its own ``TokenizersBackend``, unknown to 4), the chat template
    inline too, no ``extra_special_tokens`` list (4 wants a mapping there; ``<|im_start|>`` is
    special in ``tokenizer.json`` already)."""
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.pop("extra_special_tokens", None)
    config.update(tokenizer_class="Qwen2Tokenizer", chat_template=CHAT_TEMPLATE)
    config["model_max_length"] = context
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def check_empty(directory: Path) -> None:
    if directory.exists() and any(directory.iterdir()):
        raise ValueError(f"{directory} exists and is not empty (pick a new directory)")


def write_tiny_lm(
    directory: str | Path, texts: list[str], *, seed: int = 0, spec: TinyLM | None = None
) -> Path:
    """Write the ``tiny-lm`` model directory (see the module docstring), its tokenizer trained
    on ``texts``, and return it."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    spec = spec or TinyLM()
    directory = Path(directory)
    check_empty(directory)
    tokenizer = train_tokenizer(texts, spec.vocab_size)
    eos, pad = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = Qwen2Config(
        vocab_size=-(-len(tokenizer) // 64) * 64,  # padded rows, as Qwen pads its vocabulary
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
        attention_dropout=0.0,
    )
    config.architectures = ["Qwen2ForCausalLM"]
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    directory.mkdir(parents=True, exist_ok=True)
    from policy.hf.model import no_progress_bars

    no_progress_bars()
    model.save_pretrained(str(directory), safe_serialization=True)
    tokenizer.save_pretrained(str(directory))
    _portable_tokenizer_config(directory, spec.max_position_embeddings)
    (directory / "collective.json").write_text(json.dumps({"version": 0}) + "\n")
    return directory
