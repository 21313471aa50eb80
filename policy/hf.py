"""A Hugging Face causal LM as the learner's model: the kind of model SGLang serves on a GPU.

:class:`HFModel` implements :class:`policy.base.TrainableModel`. The learner samples nothing with
it; SGLang does (:mod:`policy.sglang`). The learner uses it to recompute, with gradients, the
log-probability of each token SGLang sampled, and to write new weights where SGLang's
``/update_weights_from_disk`` loads them: ``save_pretrained`` with safetensors, the config and the
tokenizer, in one directory (the layout of a Hugging Face model directory, which is what
``--model-path`` and ``model_path`` name).

No grammar mask on this path. SGLang applies the action grammar on the server, so the logprobs
it returns are those of the *masked* distribution (its vocabulary mask is applied to the logits
before sampling), while :meth:`HFModel.token_logprobs` scores the model's full softmax at the
sampling temperature. Under the unmasked distribution a sampled token is never more likely than
under the masked one, so a ratio against SGLang's logprobs would start below 1, and where it fell
below ``1 - clip`` the clipped loss would give a bad rollout's tokens no gradient at all. So this
model says ``exact_logprobs = False`` and the learner takes the ratio against its own logprobs
(value 1: the plain policy gradient; episodes older than ``max_staleness`` versions are dropped
or down-weighted all the same). Entropy and KL are those of the unmasked distribution. Masking
here as SGLang does (xgrammar over this tokenizer) would make the path exact; not done.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from collective.actions import ActionSpace
from policy.hf_prompt import load_tokenizer, prompt_ids

VERSION_FILE = "collective.json"  # {"version": N}: which policy version the weights are


class HFModel:
    """A ``transformers`` causal LM and its tokenizer, with the policy version of its weights.

    ``batch_size`` bounds how many samples go through the model in one forward pass.
    """

    exact_logprobs = False  # SGLang's grammar mask is not reproduced here (module docstring)

    def __init__(
        self, model: Any, tokenizer: Any, *, version: int = 0, batch_size: int = 16
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.version = version
        self.batch_size = batch_size

    @classmethod
    def load(cls, directory: str | Path, **kw: Any) -> HFModel:
        """Load a model directory (from :meth:`save`, or any local Hugging Face causal LM); its
        version is the one :meth:`save` recorded there, else 0. Never downloads."""
        from transformers import AutoModelForCausalLM

        directory = Path(directory)
        if not (directory / "config.json").is_file():
            raise FileNotFoundError(f"{directory} is not a model directory (no config.json)")
        model = AutoModelForCausalLM.from_pretrained(str(directory), local_files_only=True)
        version = 0
        if (directory / VERSION_FILE).is_file():
            version = int(json.loads((directory / VERSION_FILE).read_text())["version"])
        return cls(model, load_tokenizer(directory), version=version, **kw)

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.model.parameters()

    def token_logprobs(
        self,
        prompts: Sequence[str],
        outputs: Sequence[Sequence[int]],
        spaces: Sequence[ActionSpace],
        temperature: float = 1.0,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per sample, the log-probability of each output token (differentiable) and the entropy
        of the model's distribution at each output position, both at ``temperature``.

        The prompt is rebuilt exactly as the SGLang client built it (:func:`prompt_ids`). The
        spaces only shape the prompt: no grammar mask here (see the module docstring).
        """
        if not len(prompts) == len(outputs) == len(spaces):
            raise ValueError(
                f"token_logprobs: {len(prompts)} prompts, {len(outputs)} outputs and "
                f"{len(spaces)} spaces; they must match"
            )
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 to score sampled tokens, got {temperature}")
        vocab = self.model.config.vocab_size
        for i, out in enumerate(outputs):
            bad = [t for t in out if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"output {i} has token ids {bad[:5]} outside the vocabulary")
        logprobs: list[torch.Tensor] = []
        entropies: list[torch.Tensor] = []
        for start in range(0, len(prompts), self.batch_size):
            stop = start + self.batch_size
            lp, ent = self._score(
                [
                    prompt_ids(self.tokenizer, p, s)
                    for p, s in zip(prompts[start:stop], spaces[start:stop], strict=True)
                ],
                [list(o) for o in outputs[start:stop]],
                temperature,
            )
            logprobs += lp
            entropies += ent
        return logprobs, entropies

    def _score(
        self, prompts: list[list[int]], outputs: list[list[int]], temperature: float
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        device = next(self.model.parameters()).device
        seqs = [p + o for p, o in zip(prompts, outputs, strict=True)]
        width = max(len(s) for s in seqs)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        # Right padding: real tokens keep positions 0..n-1 and never attend to the padding.
        ids = torch.full((len(seqs), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, device=device)
            mask[i, : len(s)] = 1
        logits = self.model(input_ids=ids, attention_mask=mask).logits.float()
        lps, ents = [], []
        for i, (p, o) in enumerate(zip(prompts, outputs, strict=True)):
            # The logits at position t predict token t + 1: output token k is predicted at
            # position len(prompt) - 1 + k.
            at = logits[i, len(p) - 1 : len(p) - 1 + len(o)] / temperature
            logp = torch.log_softmax(at, dim=-1)
            target = torch.tensor(o, dtype=torch.long, device=device)
            lps.append(logp.gather(-1, target[:, None])[:, 0])
            ents.append(-(logp.exp() * logp).sum(-1))
        return lps, ents

    def save(self, directory: str | Path) -> Path:
        """Write the weights (safetensors), config, tokenizer and :attr:`version` to
        ``directory``, the layout SGLang's ``/update_weights_from_disk`` loads; return it. Pass
        the directory and :attr:`version` to :meth:`SGLangPolicy.update_weights`. (The learner
        bumps the version after each optimiser step, as it does for the tiny model.)"""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(directory), safe_serialization=True)
        self.tokenizer.save_pretrained(str(directory))
        (directory / VERSION_FILE).write_text(json.dumps({"version": self.version}) + "\n")
        return directory
