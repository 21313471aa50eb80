"""The model the RLCR loop trains, and how rollouts are served from it.

Two backends, one contract (:class:`Backend`: what ``collective.rl.train``, the local rollouts
and the Ray workers call):

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
- ``RoleBackend`` (``role_policies``): the tiny backend with a model per role of the
  organisation (``RoleModels``); ``collective/rl/roles.py`` says why and holds their learner.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from collective.base.outputs import write_file
from collective.engine.organisation import make_organisation
from policy.base import Policy, PolicyRequest, PolicyResponse, TrainableModel
from policy.roles import RolePolicy

if TYPE_CHECKING:
    from collective.rl.config import TrainConfig

Weights = dict[str, torch.Tensor]


class Backend(Protocol):
    """What training asks of a backend. ``model`` is always the one this backend made
    (``fresh`` or ``load``): in the training process the learner's, in a Ray worker the
    starting model, whose architecture (and adapters) the served copies share."""

    pinned: bool  # True: an episode pinned to version v is sampled by exactly v's weights

    def fresh(self) -> TrainableModel: ...

    def load(self, path: str | Path) -> TrainableModel: ...

    def weights(self, model: TrainableModel) -> Weights:
        """A copy of the weights rollouts are served from (pinned backends)."""
        ...

    def load_weights(self, model: TrainableModel, weights: Weights) -> None: ...

    def logprob_kwargs(self) -> dict[str, Any]:
        """What the learner must pass to recompute logprobs exactly as they were sampled."""
        ...

    def policy_for(self, model: TrainableModel, weights: Weights, version: int) -> Policy:
        """A frozen policy sampling with ``weights`` (version ``version``): the one way to get a
        policy for given weights, locally (``serve``, ``publish``) and in a Ray worker."""
        ...

    def frozen(self, model: TrainableModel) -> Policy:
        """The policy of the orchestrator's sub-agents: these weights, never trained."""
        ...

    async def serve(self, model: TrainableModel, kept: dict[int, Weights]) -> Policy:
        """The policy rollouts in this process sample from, serving the versions ``kept``."""
        ...

    async def publish(self, model: TrainableModel, version: int, weights: Weights) -> None:
        """Serve ``version`` (``weights``: its weights, pinned backends) beside the others."""
        ...

    def checkpoint(self, model: TrainableModel, directory: Path, snapshot: str | None) -> Path: ...

    async def aclose(self) -> None: ...


def make_backend(cfg: TrainConfig, run_dir: Path) -> Backend:
    if cfg.role_policies:  # a tiny model a role (collective/rl/roles.py)
        return RoleBackend(cfg)
    if cfg.model.kind == "tiny":
        return TinyBackend(cfg)
    return HFBackend(cfg, run_dir)


class VersionedPolicy:
    """Serves several policy versions at once: each request goes to the version its episode is
    pinned to. One quiescence batch becomes one sub-batch per live version (at most lag + 1).
    Built from ``Backend.policy_for``'s policies, one per version, by the backends' ``serve``
    and by the Ray workers."""

    def __init__(self, name: str = "tiny (training)") -> None:
        self.policies: dict[int, Policy] = {}
        self.name = name
        self.version = -1

    def publish(self, version: int, policy: Policy, keep: int) -> None:
        self.policies[version] = policy
        self.version = max(self.version, version)
        for v in [v for v in self.policies if v < self.version - keep]:
            del self.policies[v]

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        by_version: dict[int, list[int]] = {}
        for i, r in enumerate(requests):
            by_version.setdefault(self.version if r.version < 0 else r.version, []).append(i)
        out: list[PolicyResponse | None] = [None] * len(requests)
        for v, idx in sorted(by_version.items()):
            if v not in self.policies:
                raise RuntimeError(
                    f"no weights for policy version {v} (have {sorted(self.policies)})"
                )
            answers = await self.policies[v].generate([requests[i] for i in idx])
            for i, a in zip(idx, answers, strict=True):
                out[i] = a
        return out  # type: ignore[return-value]

    async def aclose(self) -> None:
        return None


class TinyBackend:
    pinned = True

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.net_config = cfg.tiny  # replaced by the checkpoint's when training starts from one
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

    def policy_for(self, model: Any, weights: Weights, version: int) -> Policy:
        """(The architecture is ``net_config``: the model's, once made or loaded.)"""
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
        self.serving = VersionedPolicy()
        for v, weights in sorted(kept.items()):
            self.serving.publish(v, self.policy_for(model, weights, v), keep=self.cfg.lag)
        return self.serving

    async def publish(self, model: Any, version: int, weights: Weights) -> None:
        self.serving.publish(version, self.policy_for(model, weights, version), keep=self.cfg.lag)

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
            (bool(cfg.hf.path), "model.kind = 'hf' needs model.path (a local model directory)"),
            (
                not cfg.hf.server or cfg.hf.server.startswith("sglang:"),
                f"model.server must be '' (in-process) or 'sglang:...', got {cfg.hf.server!r}",
            ),
            (
                not cfg.hf.server or cfg.top_p == 1.0,
                f"top_p = {cfg.top_p} is sampled in-process only (hf_server = ''): the SGLang "
                "client samples with top_p = 1",
            ),
        ]  # (the numbers' domains are the config's own: collective.rl.config.DOMAINS)
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"train config: {msg}")
        if cfg.hf.server:  # its syntax now, not once the progress bar has started
            from policy.sglang.spec import parse_spec

            try:
                parse_spec(self._server_spec(cfg).removeprefix("sglang:"))
            except ValueError as e:
                raise ValueError(f"train config: hf_server: {e}") from None
        try:
            self.device, _ = placement(cfg.hf.device, cfg.hf.dtype)
        except ValueError as e:
            raise ValueError(f"train config: {e}") from None
        self.cfg = cfg
        self.pinned = not cfg.hf.server
        self.weights_dir = run_dir / "checkpoints" / "served"
        self.serving: Any = None

    def _load(self, path: str | Path) -> Any:
        from policy.hf.model import HFModel

        cfg = self.cfg
        return HFModel.load(
            path,
            device=self.device.type,
            dtype=cfg.hf.dtype,
            lora_rank=cfg.hf.lora_rank,
            lora_alpha=cfg.hf.lora_alpha,
            gradient_checkpointing=cfg.hf.gradient_checkpointing,
            batch_size=cfg.hf.batch,
            logit_chunk=cfg.hf.logit_chunk,
        )

    def fresh(self) -> TrainableModel:
        """The model of ``hf_model``; built first (``collective make-model``, seed 0) when
        ``hf_build`` names a recipe and the directory is absent."""
        path = Path(self.cfg.hf.path)
        if self.cfg.hf.build and not path.exists():
            build_model(self.cfg.hf.build, path)
        return self._load(path)

    def load(self, path: str | Path) -> TrainableModel:
        return self._load(path)

    def weights(self, model: Any) -> Weights:
        return model.trainable_state()

    def load_weights(self, model: Any, weights: Weights) -> None:
        model.load_trainable_state(weights)

    def logprob_kwargs(self) -> dict[str, Any]:
        return {"entropy_grad": self.cfg.entropy_coef > 0, "top_p": self.cfg.top_p}

    def policy_for(self, model: Any, weights: Weights, version: int) -> Policy:
        """A copy of ``model`` (its architecture and adapters) holding ``weights``."""
        from policy.hf.policy import HFPolicy

        return HFPolicy(model.copy(weights, version), name=f"hf (training, v{version})")

    def frozen(self, model: Any) -> Policy:
        if self.cfg.hf.server:
            raise ValueError(
                "train config: the orchestrator organisation needs a frozen policy beside the "
                "trained one, and an SGLang server serves one model; use hf_server = '' (the "
                "in-process hf policy) or backend = 'tiny'"
            )
        from policy.hf.policy import HFPolicy

        return HFPolicy(model.copy(), name="hf (frozen initial weights)")

    async def serve(self, model: Any, kept: dict[int, Weights]) -> Policy:
        if not self.cfg.hf.server:  # in-process: one frozen copy per version still in use
            self.serving = VersionedPolicy("hf (training)")
            for v, weights in sorted(kept.items()):
                self.serving.publish(v, self.policy_for(model, weights, v), keep=self.cfg.lag)
            return self.serving
        from policy.factory import make_policy

        self.serving = make_policy(self._server_spec(self.cfg), seed=self.cfg.seed)
        if model.version > 0:  # a resumed run: the server must serve what the learner has
            await self.publish(model, model.version, {})
        return self.serving

    @staticmethod
    def _server_spec(cfg: TrainConfig) -> str:
        spec = cfg.hf.server
        if spec == "sglang:launch" or spec.startswith("sglang:launch "):  # serve hf_model
            spec = f"sglang:launch:{cfg.hf.path}{spec.removeprefix('sglang:launch')}"
        return spec

    async def publish(self, model: Any, version: int, weights: Weights) -> None:
        if not self.cfg.hf.server:
            policy = self.policy_for(model, weights, version)
            self.serving.publish(version, policy, keep=self.cfg.lag)
            return
        target = self.weights_dir / f"v{version:06d}"
        if getattr(self.serving, "weights", "disk") != "disk":  # written only if sent by disk
            from policy.sglang.weights import checkpoint_tensors

            await self.serving.update_weights(
                lambda: model.save(target), version, tensors=lambda: checkpoint_tensors(model)
            )
        else:
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
    try:
        MAKERS[kind](aside, seed=0)
    except BaseException:  # nothing half-built is left (smollm2-135m's is half a gigabyte)
        shutil.rmtree(aside, ignore_errors=True)
        raise
    try:
        aside.rename(path)
    except OSError:  # another run built it meanwhile: theirs is the same bytes
        shutil.rmtree(aside, ignore_errors=True)
    return path


# -- a tiny model a role (role_policies; collective/rl/roles.py says why) ----------------------


def trained_roles(org: str) -> tuple[str, ...]:
    """The roles of ``org`` that the trained policy answers: the ones that get a policy each."""
    o = make_organisation(org)
    return tuple(r for r in o.roles() if o.policy_of(r) == "trained")


class RoleModels:
    """Each role's tiny model, by role, and the run's policy version."""

    def __init__(self, models: dict[str, Any], version: int = 0) -> None:
        self.models = models
        self.version = version

    @property
    def version(self) -> int:
        return self._version

    @version.setter
    def version(self, v: int) -> None:
        # Every role's model says the run's version too (its checkpoint records it), so a
        # resumed run writes the checkpoints the uninterrupted one does.
        self._version = v
        for m in self.models.values():
            m.version = v

    @property
    def config(self) -> Any:
        """The network's shape (every role's is the same)."""
        return next(iter(self.models.values())).config


class RoleBackend(TinyBackend):
    """The tiny backend with a model per role (serving and publishing are the tiny backend's,
    over these weights)."""

    def __init__(self, cfg: TrainConfig) -> None:
        super().__init__(cfg)
        self.roles = trained_roles(cfg.org)

    def fresh(self) -> Any:
        # Every role starts from the same weights (the run's seed), as adapters on one base
        # would: at step 0 the run is the shared-policy run, and roles part by learning.
        return RoleModels({r: TinyBackend.fresh(self) for r in self.roles})

    def load(self, path: str | Path) -> Any:
        """``init``: the one tiny checkpoint every role starts from."""
        return RoleModels({r: TinyBackend.load(self, path) for r in self.roles})

    def weights(self, model: Any) -> Weights:
        one = TinyBackend.weights
        return {f"{r}/{k}": v for r, m in model.models.items() for k, v in one(self, m).items()}

    def load_weights(self, model: Any, weights: Weights) -> None:
        for r, m in model.models.items():
            TinyBackend.load_weights(self, m, _role_part(weights, r))

    def policy_for(self, model: Any, weights: Weights, version: int) -> Policy:
        return RolePolicy(
            {
                r: TinyBackend.policy_for(self, m, _role_part(weights, r), version)
                for r, m in model.models.items()
            },
            name=f"tiny per role (training, v{version})",
        )

    def frozen(self, model: Any) -> Policy:
        raise ValueError("role_policies: every role is trained; no role runs a frozen policy")

    def checkpoint(self, model: Any, directory: Path, snapshot: str | None) -> Path:
        """``roles/ROLE/latest.pt`` (and a snapshot when asked) for every role: the directory
        ``--policy roles:DIR`` reads."""
        from policy.tiny import save_checkpoint

        root = directory / "roles"
        for r, m in model.models.items():
            path = save_checkpoint(m, root / r / "latest.pt")
            if snapshot:
                write_file(root / r / f"{snapshot}.pt", path.read_bytes(), "checkpoint")
        return root


def _role_part(weights: Weights, role: str) -> Weights:
    head = f"{role}/"
    return {k[len(head) :]: v for k, v in weights.items() if k.startswith(head)}
