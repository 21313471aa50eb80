"""Supervised imitation of recorded episodes: a starting policy with a prior (``collective sft``).

The field's SFT-then-RL, and rejection-sampling fine-tuning when the episodes are a run's own
best: maximise the log-probability of every recorded turn's output tokens given its prompt,
under the same action-space mask the policy samples with (``TrainableModel.token_logprobs``),
so the imitated distribution is the one RL then starts from and the learner's importance ratio
stays exact. It knows nothing of where the episodes came from: scripts, an LLM behind SGLang,
or ``train``'s own episodes filtered by score.

The model is the one a train config describes (``backend``, ``[model]`` or ``hf_model`` with
LoRA), so the checkpoint is what ``train`` starts from: ``init = "OUT/latest.pt"`` (tiny) or
``hf_model = "OUT/latest"`` (hf). ``OUT/sft.json`` records its provenance: every episode file's
digest, the filter, the split, the epochs and their losses. A run stopped between epochs
resumes exactly (``--resume``): the optimiser and the shuffling stream are kept with the
weights, and an epoch's order is a function of (seed, epoch).

Held out: whole episodes (a fraction drawn by the seed), never turns of an episode that is
also trained on, so the held-out loss measures imitation of unseen episodes.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch

from collective.base.outputs import check_dir, write_file
from collective.records import Episode, load_episode
from collective.rl.backend import make_backend
from collective.rl.checks import check_init
from collective.rl.config import TrainConfig, mix
from collective.rl.learner import Sample, Scorer


class SFTConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything an imitation run is a function of, besides its episodes and the model."""

    epochs: int = 4
    learning_rate: float = 1e-3
    batch: int = 64  # turns per optimiser step
    holdout: float = 0.1  # share of the episodes held out (whole episodes)
    seed: int = 0
    min_score: float = -math.inf  # keep episodes scoring at least this
    best: float = 1.0  # then keep this top share of them by score (rejection sampling)
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        checks = [
            (1 <= self.epochs < 2**31, "epochs must be >= 1"),
            (0 < self.learning_rate < math.inf, "learning_rate must be finite and > 0"),
            (1 <= self.batch < 2**31, "batch must be >= 1"),
            (0 <= self.holdout < 1, "holdout must be in [0, 1)"),
            (0 <= self.seed < 2**63, "seed must be in 0..2**63-1"),
            (not math.isnan(self.min_score), "min_score must be a number"),
            (0 < self.best <= 1, "best must be in (0, 1]"),
            (0 < self.max_grad_norm < math.inf, "max_grad_norm must be finite and > 0"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"sft: {msg}")


class Epoch(msgspec.Struct):
    """One line of ``OUT/epochs.jsonl``."""

    epoch: int
    train_loss: float  # mean negative log-likelihood per output token, over the epoch's batches
    heldout_loss: float | None  # the same on the held-out episodes, after the epoch
    train_tokens: int
    heldout_tokens: int


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def select(
    paths: Sequence[Path], cfg: SFTConfig, train_cfg: TrainConfig
) -> tuple[list[Episode], dict[str, Any]]:
    """The episodes to imitate, checked: every one of a world the config trains on, the filter
    leaving at least one. Returns them (in the order given, filtered) and the provenance of the
    selection. ValueError with one line otherwise; nothing is written before."""
    if not paths:
        raise ValueError("sft: no episode files given")
    worlds = {w.world for w in mix(train_cfg)}
    loaded: list[tuple[Path, Episode]] = []
    for p in paths:
        ep = load_episode(p)
        if ep.config.world not in worlds:
            raise ValueError(
                f"sft: {p} is an episode of world {ep.config.world!r}; the config trains on "
                f"{', '.join(sorted(worlds))} (set world in the config, or give its episodes)"
            )
        if train_cfg.model.kind == "tiny" and ep.config.tokenizer != "bytes":
            raise ValueError(
                f"sft: {p}'s token ids are in tokenizer {ep.config.tokenizer or 'unknown'!r}; "
                "the tiny model reads bytes (imitate episodes of a byte-level policy)"
            )
        loaded.append((p, ep))
    kept = [(p, e) for p, e in loaded if e.score >= cfg.min_score]
    if kept and cfg.best < 1:
        order = sorted(range(len(kept)), key=lambda i: (-kept[i][1].score, i))
        top = set(order[: max(1, math.ceil(cfg.best * len(kept)))])
        kept = [x for i, x in enumerate(kept) if i in top]
    if not kept:
        best = max(e.score for _, e in loaded)
        raise ValueError(
            f"sft: the filter keeps none of the {len(loaded)} episodes (min_score "
            f"{cfg.min_score:g}; the best scores {best:g})"
        )
    if not any(_turns(e) for _, e in kept):
        raise ValueError("sft: the episodes kept have no answered turn to imitate")
    provenance = {
        "episodes": [{"file": str(p), "sha256": file_digest(p), "score": e.score} for p, e in kept],
        "given": len(loaded),
        "filter": {"min_score": cfg.min_score, "best": cfg.best},
    }
    return [e for _, e in kept], provenance


def _turns(ep: Episode) -> list[Any]:
    return [t for t in ep.turns if t.token_ids and t.prompt]


def samples_of(episodes: Sequence[Episode], model: Any) -> list[Sample]:
    """Every answered turn as a sample (its prompt, its output tokens in the model's tokenizer,
    its action space). A byte-level record read by a model with its own tokenizer (an hf
    model) is re-tokenized from the turn's text, with the model's end-of-sequence id."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None:
        from policy.hf.model import stop_ids

        eos = stop_ids(model.causal, tokenizer)[0]
    out: list[Sample] = []
    for ep in episodes:
        for t in _turns(ep):
            tokens = list(t.token_ids)
            if tokenizer is not None and ep.config.tokenizer == "bytes":
                tokens = [*tokenizer.encode(t.text, add_special_tokens=False), eos]
            out.append(Sample(t.prompt, tokens, ep.spaces[t.space], [], 1.0, 1.0, t.version))
    return out


def split(n: int, holdout: float, seed: int) -> tuple[list[int], list[int]]:
    """(trained, held out) episode indices: a seeded share held out, at least one episode
    trained on; none held out from a single episode."""
    order = np.random.default_rng([seed, 0x5F7]).permutation(n)
    k = min(round(holdout * n), n - 1)
    return sorted(order[k:].tolist()), sorted(order[:k].tolist())


def nll(model: Any, batch: Sequence[Sample], scorer: Scorer) -> tuple[torch.Tensor, int]:
    """The summed negative log-likelihood of a batch's output tokens, and their count."""
    logp, _ = scorer.token_logprobs(
        model,
        [s.prompt for s in batch],
        [s.tokens for s in batch],
        [s.space for s in batch],
        1.0,
    )
    flat = torch.cat(logp)
    if not torch.isfinite(flat).all():
        raise ValueError(
            "sft: a recorded output has probability 0 under its own action space (the model's "
            "mask): the episodes were not sampled under the constraints this model applies"
        )
    return -flat.sum(), int(flat.numel())


def sft(
    paths: Sequence[Path],
    train_cfg: TrainConfig,
    cfg: SFTConfig,
    out: Path,
    *,
    resume: bool = False,
    progress: bool = True,
) -> list[Epoch]:
    """Imitate the episodes at ``paths`` with the model ``train_cfg`` describes (its ``init``
    or fresh weights), writing ``out``. Returns every epoch's figures (a resumed run's too)."""
    from tqdm import tqdm

    out = Path(out)
    recorded = _check_out(out, cfg, resume)
    episodes, provenance = select([Path(p) for p in paths], cfg, train_cfg)
    if recorded is not None and [e["sha256"] for e in provenance["episodes"]] != [
        e["sha256"] for e in recorded["episodes"]
    ]:
        raise ValueError(f"sft --resume {out}: the episodes differ from the run's (sft.json)")
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(1)
    backend = make_backend(train_cfg, out)
    model = backend.load(train_cfg.init) if train_cfg.init else backend.fresh()
    check_init(train_cfg, model)  # a checkpoint of another shape than the config says: refused
    trained_idx, held_idx = split(len(episodes), cfg.holdout, cfg.seed)
    train_set = samples_of([episodes[i] for i in trained_idx], model)
    held_set = samples_of([episodes[i] for i in held_idx], model)
    if not train_set:
        raise ValueError("sft: the episodes trained on have no answered turn")
    optimiser = torch.optim.AdamW(list(model.parameters()), lr=cfg.learning_rate, weight_decay=0)
    epochs: list[Epoch] = []
    if resume:
        epochs = _restore(out, backend, model, optimiser)
    else:
        out.mkdir(parents=True, exist_ok=True)
        meta = {
            "sft": msgspec.to_builtins(cfg),
            "train_config": msgspec.to_builtins(train_cfg),
            **provenance,
            "trained_episodes": len(trained_idx),
            "heldout_episodes": len(held_idx),
            "trained_turns": len(train_set),
            "heldout_turns": len(held_set),
        }
        write_file(out / "sft.json", json.dumps(meta, indent=1).encode(), "sft record")
    batches_per_epoch = math.ceil(len(train_set) / cfg.batch)
    bar = tqdm(
        total=cfg.epochs * batches_per_epoch,
        initial=len(epochs) * batches_per_epoch,
        disable=not progress,
        unit="batch",
        desc="sft",
        dynamic_ncols=True,
        file=sys.stderr,
    )
    try:
        for epoch in range(len(epochs), cfg.epochs):
            epochs.append(_epoch(epoch, model, backend, optimiser, train_set, held_set, cfg, bar))
            model.version = epoch + 1
            _save(backend, model, optimiser, epochs, out)
    finally:
        bar.close()
    return epochs


def _check_out(out: Path, cfg: SFTConfig, resume: bool) -> dict[str, Any] | None:
    """``out`` is where this imitation may write: empty (or absent) for a new run; for
    ``resume``, a run of the same settings (only ``epochs`` may grow), whose record
    (``sft.json``) is returned. ValueError with one line otherwise."""
    if not resume:
        check_dir(out, "sft --out")
        if out.exists() and any(out.iterdir()):
            raise ValueError(f"sft: {out} is not empty (resume it with --resume, or pick --out)")
        return None
    if not (out / "sft-state.pt").is_file():
        raise ValueError(f"sft --resume {out}: no imitation run to resume (no sft-state.pt)")
    recorded: dict[str, Any] = json.loads((out / "sft.json").read_text())
    now = msgspec.to_builtins(cfg)
    if {**recorded["sft"], "epochs": cfg.epochs} != now:  # (only the epochs may grow)
        changed = sorted(k for k in now if recorded["sft"].get(k) != now[k] and k != "epochs")
        raise ValueError(
            f"sft --resume {out}: {', '.join(changed)} differ from the run's (sft.json); "
            "a resumed imitation may only be given more epochs"
        )
    return recorded


def _restore(out: Path, backend: Any, model: Any, optimiser: Any) -> list[Epoch]:
    """A stopped run's weights and optimiser into ``model`` and ``optimiser`` (``_save``'s
    state); returns its epochs so far."""
    state = torch.load(out / "sft-state.pt", weights_only=False)
    backend.load_weights(model, state["weights"])
    optimiser.load_state_dict(state["optimiser"])
    return [msgspec.convert(e, Epoch) for e in state["epochs"]]


def _epoch(
    epoch: int,
    model: Any,
    scorer: Scorer,
    optimiser: Any,
    train_set: Sequence[Sample],
    held_set: Sequence[Sample],
    cfg: SFTConfig,
    bar: Any,
) -> Epoch:
    """One pass over the trained turns in the epoch's order (a function of seed and epoch),
    ``batch`` turns an optimiser step, then the held-out loss."""
    order = np.random.default_rng([cfg.seed, epoch]).permutation(len(train_set))
    loss_sum, tokens = 0.0, 0
    for start in range(0, len(order), cfg.batch):
        batch = [train_set[i] for i in order[start : start + cfg.batch]]
        total, n = nll(model, batch, scorer)
        optimiser.zero_grad(set_to_none=True)
        (total / n).backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), cfg.max_grad_norm)
        optimiser.step()
        loss_sum, tokens = loss_sum + float(total.detach()), tokens + n
        bar.set_postfix(epoch=epoch, nll=f"{float(total.detach()) / n:.3f}")
        bar.update(1)
    held = heldout_loss(model, held_set, scorer, cfg.batch)
    return Epoch(
        epoch=epoch,
        train_loss=loss_sum / tokens,
        heldout_loss=held[0],
        train_tokens=tokens,
        heldout_tokens=held[1],
    )


def heldout_loss(
    model: Any, held: Sequence[Sample], scorer: Scorer, batch: int
) -> tuple[float | None, int]:
    if not held:
        return None, 0
    total, tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(held), batch):
            s, n = nll(model, held[start : start + batch], scorer)
            total, tokens = total + float(s), tokens + n
    return total / tokens, tokens


def _save(backend: Any, model: Any, optimiser: Any, epochs: list[Epoch], out: Path) -> None:
    """The weights (what ``train`` starts from), the epochs so far, then the resume state:
    written last, so a resume never finds a state newer than the weights it names."""
    import io

    backend.checkpoint(model, out, f"epoch-{len(epochs):03d}")
    lines = b"".join(msgspec.json.encode(e) + b"\n" for e in epochs)
    write_file(out / "epochs.jsonl", lines, "sft epochs")
    buf = io.BytesIO()
    torch.save(
        {
            "weights": backend.weights(model),
            "optimiser": optimiser.state_dict(),
            "epochs": [msgspec.to_builtins(e) for e in epochs],
        },
        buf,
    )
    write_file(out / "sft-state.pt", buf.getvalue(), "sft state")
