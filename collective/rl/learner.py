"""The learner: the clipped policy-gradient loss and one optimiser step per training step.

``Learner.step`` takes a step's samples (one per trained turn: its output tokens, the behaviour
logprobs that sampled them, its rollout's advantage and weight) and does what CleanRL's
``ppo.py`` does in its update: recompute the tokens' logprobs under the current weights, form
the PPO-clipped importance-weighted loss, backpropagate in chunks (bounding memory), clip the
gradient norm, step AdamW. A chunk is bounded by turns (``chunk``) and, with ``chunk_tokens``,
by the prompt and output tokens its forward pass reads (:func:`token_chunks`): the backward's
activations grow with tokens, so that bound is what keeps a step's memory whatever its size.
It knows nothing of episodes, versions on the wire or run directories: whoever calls it (a
thread of the training process, or a Ray actor on a GPU node) owns those.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec
import torch

from collective.base.actions import ActionSpace
from collective.rl.config import TrainConfig
from policy.base import TrainableModel


def clipped_pg_loss(
    new_logp: torch.Tensor,  # [N] log-probabilities of the sampled tokens under the learner
    old_logp: torch.Tensor,  # [N] behaviour log-probabilities (what sampled them)
    advantage: torch.Tensor,  # [N] per token: its rollout's (flat) advantage
    weight: torch.Tensor,  # [N] 1, or less for down-weighted stale episodes
    seq: torch.Tensor,  # [N] which sequence (turn) each token belongs to
    n_tokens: float,  # normalisers over the WHOLE step (the loss may be computed in chunks)
    n_seqs: float,
    aggregation: str,
    normaliser: float,
    clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The PPO-clipped policy-gradient loss; returns (loss, per-token clipped mask)."""
    ratio = torch.exp(new_logp - old_logp)
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, 1 - clip, 1 + clip) * advantage
    per_token = -torch.minimum(unclipped, clipped) * weight
    if aggregation == "token_mean":
        loss = per_token.sum() / n_tokens
    elif aggregation == "sequence_mean":
        lengths = torch.bincount(seq).clamp(min=1).to(per_token.dtype)
        sums = torch.zeros_like(lengths).index_add(0, seq, per_token)
        loss = (sums / lengths).sum() / n_seqs
    else:
        loss = per_token.sum() / normaliser
    was_clipped = (clipped < unclipped).detach()
    return loss, was_clipped


def kl_estimate(new_logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per sampled token, an estimate of KL(pi || pi_ref) from the tokens pi sampled (Schulman,
    "Approximating KL divergence"): k1 = log pi - log pi_ref, unbiased but of either sign, so its
    gradient pushes each token's own ratio; k3 = r - log r - 1 with r = pi_ref / pi, unbiased,
    never negative, lower variance. Its gradient flows through ``new_logp`` only."""
    log_r = ref_logp - new_logp
    if estimator == "k1":
        return -log_r
    return torch.exp(log_r) - log_r - 1


class Sample(msgspec.Struct):
    """One turn's output tokens, ready for the loss."""

    prompt: str
    tokens: list[int]
    space: ActionSpace
    logprobs: list[float]  # behaviour
    advantage: float
    weight: float
    version: int
    role: str = ""  # the turn's agent's role (role_policies: which role's learner takes it)


class Scorer(Protocol):
    """How the learner recomputes a model's logprobs: one signature whatever the model. A
    backend's learner side (``collective.rl.backend.LearnerSide``) is one: it binds what its
    models need besides to score exactly as they sampled."""

    def token_logprobs(
        self,
        model: Any,
        prompts: Sequence[str],
        outputs: Sequence[Sequence[int]],
        spaces: Sequence[ActionSpace],
        temperature: float,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]: ...

    def token_counts(
        self,
        model: Any,
        prompts: Sequence[str],
        outputs: Sequence[Sequence[int]],
        spaces: Sequence[ActionSpace],
    ) -> list[int]:
        """The tokens ``token_logprobs`` would feed ``model`` for each sample (its prompt as the
        model reads it, truncation and template included, and its output)."""
        ...


class ModelDefaults:
    """The :class:`Scorer` of a model that needs nothing besides: its own ``token_logprobs``
    with its defaults (a learner made without a backend, as the tests make them)."""

    def token_logprobs(
        self,
        model: Any,
        prompts: Sequence[str],
        outputs: Sequence[Sequence[int]],
        spaces: Sequence[ActionSpace],
        temperature: float,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return model.token_logprobs(prompts, outputs, spaces, temperature)

    def token_counts(
        self,
        model: Any,
        prompts: Sequence[str],
        outputs: Sequence[Sequence[int]],
        spaces: Sequence[ActionSpace],
    ) -> list[int]:
        return model.token_counts(prompts, outputs, spaces)


def token_chunks(sizes: Sequence[int], budget: int, turns: int) -> list[range]:
    """The samples (by index, in order) each forward/backward pass takes: greedily, at most
    ``turns`` samples and ``budget`` tokens a chunk (``budget`` 0: no token bound). A sample is
    never split (its prompt is one forward pass, and ``sequence_mean`` sums it whole), so one
    larger than ``budget`` goes alone. The order is kept: the loss's sums are the unchunked
    step's up to float summation order."""
    chunks: list[range] = []
    start, held = 0, 0
    for i, n in enumerate(sizes):
        full = i - start >= turns or (budget > 0 and held + n > budget)
        if i > start and full:
            chunks.append(range(start, i))
            start, held = i, 0
        held += n
    if start < len(sizes):
        chunks.append(range(start, len(sizes)))
    return chunks


class Learner:
    """Owns the trainable model and its optimiser; ``step`` runs in a worker thread. ``scorer``
    recomputes the logprobs of the model (and of its reference): the run's backend."""

    def __init__(
        self, model: TrainableModel, cfg: TrainConfig, scorer: Scorer | None = None
    ) -> None:
        self.model = model
        self.cfg = cfg
        self.scorer: Scorer = scorer or ModelDefaults()
        # AdamW (with weight_decay 0, Adam's update exactly); gradients clipped in `step`.
        self.optimiser = torch.optim.AdamW(
            list(model.parameters()), lr=cfg.learning_rate, weight_decay=cfg.weight_decay
        )
        self.reference: Any = None  # the initial policy, for the KL term
        if cfg.kl_coef > 0:
            # hf: the base model with LoRA adapters off, or a frozen copy; tiny: a snapshot
            # (a TinyModel holds a lock: no deepcopy)
            make = getattr(model, "reference", None) or getattr(model, "frozen", None)
            self.reference = make() if make is not None else copy.deepcopy(model)

    def step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One optimiser step on a step's samples. A batch whose advantages are all zero (no
        group carried signal) takes none: no forward, no gradient, no Adam moment moved. Adam
        normalises the gradient, and its momentum moves the weights on a zero gradient, so
        stepping on no signal would still change the policy."""
        cfg = self.cfg
        t0 = time.perf_counter()
        if not any(s.advantage for s in samples):
            self.model.version += 1  # (the version counts steps; the weights are unchanged)
            return {
                "loss": 0.0,
                "clip_fraction": 0.0,
                "ratio_mean": 0.0,
                "entropy": 0.0,
                "kl": 0.0,
                "grad_norm": 0.0,
                "learner_tokens_per_s": 0.0,
                "learner_seconds": time.perf_counter() - t0,
                "trained_tokens": 0.0,
                "optimiser_step": False,
            }
        self.optimiser.zero_grad(set_to_none=True)
        n_tokens = float(sum(len(s.tokens) for s in samples))
        n_seqs = float(len(samples))
        totals = dict(loss=0.0, clipped=0.0, ratio=0.0, entropy=0.0, kl=0.0)
        for part in self._chunks(samples):
            chunk = samples[part.start : part.stop]
            new, entropy = self.scorer.token_logprobs(
                self.model,
                [s.prompt for s in chunk],
                [s.tokens for s in chunk],
                [s.space for s in chunk],
                cfg.temperature,
            )
            new_logp = torch.cat(new)
            ent = torch.cat(entropy)
            # Every tensor of the loss where the model's logprobs are (a GPU, for an LLM).
            dtype, device = new_logp.dtype, new_logp.device
            old = torch.tensor([x for s in chunk for x in s.logprobs], dtype=dtype, device=device)
            adv = torch.tensor(
                [s.advantage for s in chunk for _ in s.tokens], dtype=dtype, device=device
            )
            w = torch.tensor(
                [s.weight for s in chunk for _ in s.tokens], dtype=dtype, device=device
            )
            seq = torch.tensor(
                [i for i, s in enumerate(chunk) for _ in s.tokens], device=new_logp.device
            )
            loss, was_clipped = clipped_pg_loss(
                new_logp,
                old,
                adv,
                w,
                seq,
                n_tokens,
                n_seqs,
                cfg.aggregation,
                cfg.normaliser,
                cfg.clip,
            )
            if cfg.entropy_coef:
                loss = loss - cfg.entropy_coef * ent.sum() / n_tokens
            if self.reference is not None:
                with torch.no_grad():
                    ref, _ = self.scorer.token_logprobs(
                        self.reference,
                        [s.prompt for s in chunk],
                        [s.tokens for s in chunk],
                        [s.space for s in chunk],
                        cfg.temperature,
                    )
                kl = kl_estimate(new_logp, torch.cat(ref), cfg.kl_estimator)
                loss = loss + cfg.kl_coef * kl.sum() / n_tokens
                totals["kl"] += float(kl.detach().sum())
            loss.backward()
            totals["loss"] += float(loss.detach())
            totals["clipped"] += float(was_clipped.sum())
            totals["ratio"] += float(torch.exp(new_logp - old).detach().sum())
            totals["entropy"] += float(ent.detach().sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(list(self.model.parameters()), cfg.max_grad_norm)
        self.optimiser.step()
        self.model.version += 1
        seconds = time.perf_counter() - t0
        n = max(n_tokens, 1.0)
        return {
            "loss": totals["loss"],
            "clip_fraction": totals["clipped"] / n,
            "ratio_mean": totals["ratio"] / n,
            "entropy": totals["entropy"] / n,
            "kl": totals["kl"] / n,
            "grad_norm": float(grad_norm),
            "learner_tokens_per_s": n_tokens / seconds if seconds > 0 else 0.0,
            "learner_seconds": seconds,
            "trained_tokens": n_tokens,
            "optimiser_step": True,
        }

    def _chunks(self, samples: Sequence[Sample]) -> list[range]:
        """The step's forward/backward passes (:func:`token_chunks`); the samples are counted
        only under a token budget."""
        sizes = (
            self.scorer.token_counts(
                self.model,
                [s.prompt for s in samples],
                [s.tokens for s in samples],
                [s.space for s in samples],
            )
            if self.cfg.chunk_tokens
            else [0] * len(samples)
        )
        return token_chunks(sizes, self.cfg.chunk_tokens, self.cfg.chunk)

    def state(self) -> dict[str, Any]:
        return {"optimiser": self.optimiser.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.optimiser.load_state_dict(state["optimiser"])
