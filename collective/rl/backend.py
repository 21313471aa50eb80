"""The model the RLCR loop trains, and how rollouts are served from it.

Two backends, one contract (what ``collective.rl.train`` calls):

- ``TinyBackend`` (CPU, the default): the learner trains one ``TinyModel``; rollouts are served
  by frozen copies of its weights, one per live policy version, so the learner never changes
  weights a batch is sampling from, and an episode pinned to version v is sampled by exactly the
  weights of version v (``pinned = True``: runs are reproducible).
- ``HFBackend``: the learner trains a Hugging Face causal LM (``policy.hf.model.HFModel``) on the
  configured device and dtype. Rollouts are sampled either in this process by frozen copies, one
  per live version, like the tiny backend (``hf_server = ""``, ``pinned = True``), or by an
  SGLang server: after each step the weights are written in the layout SGLang's
  ``/update_weights_from_disk`` reads and the server is told to load them, generation paused
  around the load. A server holds one version at a time, so its episodes are not pinned
  (``pinned = False``): each token carries the version that sampled it, and the staleness bound
  and the clipped importance ratio (exact: the learner recomputes the server's masked
  distribution) take care of the rest.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from collective.base.outputs import write_file
from policy.base import Policy, TrainableModel

if TYPE_CHECKING:
    from collective.rl.config import TrainConfig

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
        from collective.rl.rollouts import VersionedPolicy

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
            write_file(directory / f"{snapshot}.pt", path.read_bytes(), "checkpoint")
        return path

    async def aclose(self) -> None:
        return None


class HFBackend:
    """A Hugging Face causal LM (``policy.hf.model.HFModel``), sampled in this process or by
    SGLang.

    ``hf_server = ""``: rollouts are sampled in-process (``policy.hf.policy.HFPolicy``, the
    ``hf:DIR`` policy) from frozen copies of the weights, one per live version, exactly as the
    tiny backend does (``pinned = True``: a run is reproducible from its config).
    ``hf_server = "sglang:..."``: an SGLang server samples and holds one version at a time
    (``pinned = False``); after each step the weights go to disk and the server loads them.

    Everything a run could trip over is checked here, before any rollout or training step: the
    config's learner fields, the device and dtype, the model directory (``fresh``).
    """

    def __init__(self, cfg: TrainConfig, run_dir: Path) -> None:
        from policy.hf.model import placement

        checks = [
            (bool(cfg.hf_model), "backend = 'hf' needs hf_model (a local model directory)"),
            (
                not cfg.hf_server or cfg.hf_server.startswith("sglang:"),
                f"hf_server must be '' (in-process) or 'sglang:...', got {cfg.hf_server!r}",
            ),
        ]  # (the numbers' domains are the config's own: collective.rl.config.DOMAINS)
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"train config: {msg}")
        if cfg.hf_server:  # its syntax now, not once the progress bar has started
            from policy.sglang.spec import parse_spec

            try:
                parse_spec(self._server_spec(cfg).removeprefix("sglang:"))
            except ValueError as e:
                raise ValueError(f"train config: hf_server: {e}") from None
        try:
            self.device, _ = placement(cfg.device, cfg.dtype)
        except ValueError as e:
            raise ValueError(f"train config: {e}") from None
        self.cfg = cfg
        self.pinned = not cfg.hf_server
        self.weights_dir = run_dir / "checkpoints" / "served"
        self.serving: Any = None

    def _load(self, path: str | Path) -> Any:
        from policy.hf.model import HFModel

        cfg = self.cfg
        return HFModel.load(
            path,
            device=self.device.type,
            dtype=cfg.dtype,
            lora_rank=cfg.lora_rank,
            lora_alpha=cfg.lora_alpha,
            gradient_checkpointing=cfg.gradient_checkpointing,
            batch_size=cfg.hf_batch,
            logit_chunk=cfg.logit_chunk,
        )

    def fresh(self) -> TrainableModel:
        """The model of ``hf_model``; built first (``collective make-model``, seed 0) when
        ``hf_build`` names a recipe and the directory is absent."""
        path = Path(self.cfg.hf_model)
        if self.cfg.hf_build and not path.exists():
            build_model(self.cfg.hf_build, path)
        return self._load(path)

    def load(self, path: str | Path) -> TrainableModel:
        return self._load(path)

    def weights(self, model: Any) -> Weights:
        return model.trainable_state()

    def load_weights(self, model: Any, weights: Weights) -> None:
        model.load_trainable_state(weights)

    def logprob_kwargs(self) -> dict[str, Any]:
        return {"entropy_grad": self.cfg.entropy_coef > 0}

    def _policy(self, model: Any, weights: Weights, version: int) -> Policy:
        from policy.hf.policy import HFPolicy

        return HFPolicy(model.copy(weights, version), name=f"hf (training, v{version})")

    def frozen(self, model: Any) -> Policy:
        if self.cfg.hf_server:
            raise ValueError(
                "train config: the orchestrator organisation needs a frozen policy beside the "
                "trained one, and an SGLang server serves one model; use hf_server = '' (the "
                "in-process hf policy) or backend = 'tiny'"
            )
        from policy.hf.policy import HFPolicy

        return HFPolicy(model.copy(), name="hf (frozen initial weights)")

    async def serve(self, model: Any, kept: dict[int, Weights]) -> Policy:
        if not self.cfg.hf_server:  # in-process: one frozen copy per version still in use
            from collective.rl.rollouts import VersionedPolicy

            self.serving = VersionedPolicy("hf (training)")
            for v, weights in sorted(kept.items()):
                self.serving.publish(v, self._policy(model, weights, v), keep=self.cfg.lag)
            return self.serving
        from policy.factory import make_policy

        self.serving = make_policy(self._server_spec(self.cfg), seed=self.cfg.seed)
        if model.version > 0:  # a resumed run: the server must serve what the learner has
            await self.publish(model, model.version, {})
        return self.serving

    @staticmethod
    def _server_spec(cfg: TrainConfig) -> str:
        spec = cfg.hf_server
        if spec == "sglang:launch" or spec.startswith("sglang:launch "):  # serve hf_model
            spec = f"sglang:launch:{cfg.hf_model}{spec.removeprefix('sglang:launch')}"
        return spec

    async def publish(self, model: Any, version: int, weights: Weights) -> None:
        if not self.cfg.hf_server:
            self.serving.publish(version, self._policy(model, weights, version), keep=self.cfg.lag)
            return
        target = self.weights_dir / f"v{version:06d}"
        model.save(target)
        await self.serving.update_weights(target, version)
        for old in self.weights_dir.glob("v*"):
            if old != target:
                shutil.rmtree(old, ignore_errors=True)

    def checkpoint(self, model: Any, directory: Path, snapshot: str | None) -> Path:
        """``latest/`` (a model directory: ``--policy hf:DIR`` and SGLang load it) and, when
        asked, a snapshot beside it."""
        path = directory / "latest"
        model.save(path)
        if snapshot:
            shutil.copytree(path, directory / snapshot, dirs_exist_ok=True)
        return path

    async def aclose(self) -> None:
        if self.serving is not None:
            await self.serving.aclose()


def build_model(kind: str, path: Path) -> Path:
    """Build a model directory with ``collective make-model KIND`` (seed 0) where none is, safely
    beside other runs doing the same: built aside, then renamed into place."""
    from collective.rl.make_model import MAKERS

    aside = path.with_name(f".{path.name}.building-{os.getpid()}")
    shutil.rmtree(aside, ignore_errors=True)
    MAKERS[kind](aside, seed=0)
    try:
        aside.rename(path)
    except OSError:  # another run built it meanwhile: theirs is the same bytes
        shutil.rmtree(aside, ignore_errors=True)
    return path
