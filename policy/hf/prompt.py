"""How an agent's request becomes the token ids a Hugging Face causal LM reads.

The SGLang client samples from these ids and the learner (:mod:`policy.hf.model`) recomputes
log-probabilities from them. The two must agree token for token, or the importance ratio of every
token is wrong, so both call :func:`prompt_ids` and nothing else builds a prompt.

The tools come first (from :meth:`ActionSpace.describe`), then the agent's own prompt, then a
cue; a tokenizer with a chat template gets it as one user message, so instruct models see the
format they were tuned on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collective.base.actions import ActionSpace

HEADER = "Answer with exactly one action on one line: a tool name, then its arguments.\nTools:\n"
CUE = "\nAction:\n"


def render(prompt: str, space: ActionSpace) -> str:
    return f"{HEADER}{space.describe()}\n\n{prompt}{CUE}"


def prompt_ids(tokenizer: Any, prompt: str, space: ActionSpace) -> list[int]:
    """The ids of the rendered prompt, with the tokenizer's own special tokens (BOS, or the chat
    template's markers) exactly as the model expects them."""
    text = render(prompt, space)
    if getattr(tokenizer, "chat_template", None):
        # Render to a string, then encode: the return type of tokenize=True differs between
        # transformers 4 and 5, and the template already holds the special tokens.
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer.encode(text, add_special_tokens=True))


def load_tokenizer(path: str | Path) -> Any:
    """A tokenizer from a local directory (never a download)."""
    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise FileNotFoundError(f"tokenizer directory {str(path)!r} does not exist")
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
