"""The model the RLCR loop trains, and how rollouts are served from it.

Two backends, one contract (what ``collective.train`` calls):

- ``TinyBackend`` (CPU, the default): the learner trains one ``TinyModel``; rollouts are served
  by frozen copies of its weights, one per live policy version, so the learner never changes
  weights a batch is sampling from, and an episode pinned to version v is sampled by exactly the
  weights of version v (``pinned = True``: runs are reproducible).
- ``HFBackend`` (GPU): the learner trains a Hugging Face causal LM (``policy.hf.HFModel``); an
  SGLang server samples. After each step the weights are written in the layout SGLang's
  ``/update_weights_from_disk`` reads and the server is told to load them, generation paused
  around the load. A server holds one version at a time, so episodes are not pinned
  (``pinned = False``): each token carries the version that sampled it, and the staleness bound
  and the clipped importance ratio take care of the rest.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from policy.base import Policy, TrainableModel

if TYPE_CHECKING:
    from collective.train import TrainConfig

Weights = dict[str, torch.Tensor]


def make_backend(cfg: TrainConfig, run_dir: Path) -> TinyBackend | HFBackend:
    if cfg.backend == "tiny":
        return TinyBackend(cfg)
    return HFBackend(cfg, run_dir)


class TinyBackend:
    pinned = True

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.net_config = cfg.model  # replaced by the checkpoint's when training starts from one
        self.serving: Any = None

    def fresh(self) -> TrainableModel:
        from policy.tiny import TinyModel

        return TinyModel.fresh(self.net_config)

    def load(self, path: str | Path) -> TrainableModel:
        from policy.tiny import TinyModel

        model = TinyModel.load(path)
        self.net_config = model.config
        return model

    def weights(self, model: Any) -> Weights:
        return {k: v.detach().clone() for k, v in model.net.state_dict().items()}

    def load_weights(self, model: Any, weights: Weights) -> None:
        model.net.load_state_dict(weights)

    def logprob_kwargs(self) -> dict[str, Any]:
        """What the learner must pass to recompute logprobs exactly as they were sampled."""
        return {"max_tokens": self.cfg.max_output_tokens}

    def _policy(self, weights: Weights, version: int) -> Policy:
        from policy.tiny import TinyModel, TinyPolicy, TinyTransformer

        net = TinyTransformer(self.net_config)
        net.load_state_dict(weights)
        net.requires_grad_(False)
        return TinyPolicy(TinyModel(net, version=version, source=f"training, v{version}"))

    def frozen(self, model: Any) -> Policy:
        """The policy of the orchestrator's sub-agents: these weights, never trained."""
        from policy.tiny import TinyPolicy

        return TinyPolicy(model.frozen())

    async def serve(self, model: Any, kept: dict[int, Weights]) -> Policy:
        """One frozen copy per version still in use (the current and ``lag`` older)."""
        from collective.train import VersionedPolicy

        self.serving = VersionedPolicy()
        for v, weights in sorted(kept.items()):
            self.serving.publish(v, self._policy(weights, v), keep=self.cfg.lag)
        return self.serving

    async def publish(self, model: Any, version: int, weights: Weights) -> None:
        self.serving.publish(version, self._policy(weights, version), keep=self.cfg.lag)

    def checkpoint(self, model: Any, directory: Path, snapshot: str | None) -> Path:
        """``latest.pt`` (usable with ``--policy tiny:PATH``) and, when asked, a snapshot."""
        from policy.tiny import save_checkpoint

        path = save_checkpoint(model, directory / "latest.pt")
        if snapshot:
            shutil.copyfile(path, directory / f"{snapshot}.pt")
        return path

    async def aclose(self) -> None:
        return None


class HFBackend:
    pinned = False

    def __init__(self, cfg: TrainConfig, run_dir: Path) -> None:
        if not cfg.hf_model or not cfg.hf_server:
            raise ValueError(
                "train config: backend = 'hf' needs hf_model (a local model "
                "directory) and hf_server ('sglang:URL' or 'sglang:launch')"
            )
        self.cfg = cfg
        self.weights_dir = run_dir / "checkpoints" / "served"
        self.serving: Any = None

    def fresh(self) -> TrainableModel:
        from policy.hf import HFModel

        return HFModel.load(self.cfg.hf_model)

    def load(self, path: str | Path) -> TrainableModel:
        from policy.hf import HFModel

        return HFModel.load(path)

    def weights(self, model: Any) -> Weights:
        return {k: v.detach().clone() for k, v in model.model.state_dict().items()}

    def load_weights(self, model: Any, weights: Weights) -> None:
        model.model.load_state_dict(weights)

    def logprob_kwargs(self) -> dict[str, Any]:
        return {}

    def frozen(self, model: Any) -> Policy:
        raise ValueError(
            "train config: the orchestrator organisation needs a frozen policy beside the trained "
            "one, and backend = 'hf' serves one model from one SGLang server; use backend = 'tiny'"
        )

    async def serve(self, model: Any, kept: dict[int, Weights]) -> Policy:
        from policy.factory import make_policy

        spec = self.cfg.hf_server
        if spec == "sglang:launch":
            spec = f"sglang:launch:{self.cfg.hf_model}"
        self.serving = make_policy(spec, seed=self.cfg.seed)
        if model.version > 0:  # a resumed run: the server must serve what the learner has
            await self.publish(model, model.version, {})
        return self.serving

    async def publish(self, model: Any, version: int, weights: Weights) -> None:
        target = self.weights_dir / f"v{version:06d}"
        model.save(target)
        await self.serving.update_weights(target, version)
        for old in self.weights_dir.glob("v*"):
            if old != target:
                shutil.rmtree(old, ignore_errors=True)

    def checkpoint(self, model: Any, directory: Path, snapshot: str | None) -> Path:
        path = directory / "latest"
        model.save(path)
        if snapshot:
            shutil.copytree(path, directory / snapshot, dirs_exist_ok=True)
        return path

    async def aclose(self) -> None:
        if self.serving is not None:
            await self.serving.aclose()
