"""How an agent's request becomes the token ids a Hugging Face causal LM reads.

The SGLang client samples from these ids and the learner (:mod:`policy.hf.model`) recomputes
log-probabilities from them. The two must agree token for token, or the importance ratio of every
token is wrong, so both call :func:`prompt_ids` and nothing else builds a prompt.

What the model reads depends on its tokenizer:

- a chat model (a tokenizer with a chat template) is prompted as one, through its own template:
  the instructions and the tools (from :meth:`ActionSpace.describe`, the world's rules as the
  agent can use them) are the system turn, the agent's own prompt (its observation, what
  arrived, its last result) the user turn, and the action is the assistant's answer, after the
  template's assistant header (``add_generation_prompt``), where the action grammar applies;
- ``tiny-lm`` (:data:`ONE_TURN_TEMPLATE`, the template ``collective make-model tiny-lm`` writes)
  reads the whole rendering, tools, prompt and cue, as one user turn: its tokenizer was trained
  on exactly that text, and its recorded runs must read the same ids;
- a tokenizer without a template reads the rendering as plain text, after its BOS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collective.base.actions import ActionSpace

HEADER = "Answer with exactly one action on one line: a tool name, then its arguments.\nTools:\n"
CUE = "\nAction:\n"

#: ``tiny-lm``'s chat template (Qwen's ChatML markers), written by ``policy.hf.make``.
ONE_TURN_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def render(prompt: str, space: ActionSpace) -> str:
    return f"{HEADER}{space.describe()}\n\n{prompt}{CUE}"


def messages(prompt: str, space: ActionSpace) -> list[dict[str, str]]:
    """A chat model's turns: the instructions and tools as the system's, the prompt as the
    user's."""
    return [
        {"role": "system", "content": f"{HEADER}{space.describe()}"},
        {"role": "user", "content": prompt},
    ]


def is_chat(tokenizer: Any) -> bool:
    """Whether the model is prompted as a chat model: a template, and not ``tiny-lm``'s."""
    template = getattr(tokenizer, "chat_template", None)
    return bool(template) and template != ONE_TURN_TEMPLATE


def prompt_text(tokenizer: Any, prompt: str, space: ActionSpace) -> str:
    """The text the model reads (module docstring), the template's special tokens included."""
    if is_chat(tokenizer):
        turns = messages(prompt, space)
    elif getattr(tokenizer, "chat_template", None):
        turns = [{"role": "user", "content": render(prompt, space)}]
    else:
        return render(prompt, space)
    # Rendered to a string, then encoded: the return type of tokenize=True differs between
    # transformers 4 and 5, and the template already holds the special tokens.
    text: str = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    return text


def prompt_ids(tokenizer: Any, prompt: str, space: ActionSpace) -> list[int]:
    """The ids of the prompt the model reads, with the tokenizer's own special tokens (BOS, or
    the chat template's markers) exactly as the model expects them."""
    text = prompt_text(tokenizer, prompt, space)
    plain = not getattr(tokenizer, "chat_template", None)
    return list(tokenizer.encode(text, add_special_tokens=plain))


def load_tokenizer(path: str | Path) -> Any:
    """A tokenizer from a local directory (never a download)."""
    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise FileNotFoundError(f"tokenizer directory {str(path)!r} does not exist")
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
