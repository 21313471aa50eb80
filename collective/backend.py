"""The model the RLCR loop trains and serves: the tiny torch policy.

The learner trains one ``TinyModel``; rollouts are served by frozen copies of its weights, one
per live policy version, so the learner never changes weights a batch is sampling from, and an
episode pinned to version v is sampled by exactly the weights of version v.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from policy.tiny import TinyModel, TinyPolicy, TinyTransformer, save_checkpoint

if TYPE_CHECKING:
    from pathlib import Path

    from collective.train import TrainConfig

Weights = dict[str, torch.Tensor]


class TinyBackend:
    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.net_config = cfg.model  # replaced by the checkpoint's when training starts from one

    def fresh(self) -> TinyModel:
        return TinyModel.fresh(self.net_config)

    def load(self, path: str | Path) -> TinyModel:
        model = TinyModel.load(path)
        self.net_config = model.config
        return model

    def weights(self, model: TinyModel) -> Weights:
        return {k: v.detach().clone() for k, v in model.net.state_dict().items()}

    def load_weights(self, model: TinyModel, weights: Weights) -> None:
        model.net.load_state_dict(weights)

    def serving(self, weights: Weights, version: int) -> TinyPolicy:
        net = TinyTransformer(self.net_config)
        net.load_state_dict(weights)
        net.requires_grad_(False)
        return TinyPolicy(TinyModel(net, version=version, source=f"training, v{version}"))

    def save(self, model: TinyModel, path: Path) -> None:
        save_checkpoint(model, path)

    def logprob_kwargs(self) -> dict[str, Any]:
        """What the learner must pass to recompute logprobs exactly as they were sampled."""
        return {"max_tokens": self.cfg.max_output_tokens}
