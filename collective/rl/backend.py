"""The model the RLCR loop trains, and how rollouts are served from it.

A backend has two sides, declared apart:

- :class:`LearnerSide`: the trainable model (``fresh``, ``load``), its weights as a dict
  (``weights``, ``load_weights``: what a served version and a resumed run are made from), its
  checkpoints, and ``token_logprobs``: the one signature the learner recomputes logprobs with,
  the backend binding what its models need to score exactly as they sampled (the tiny model's
  length budget, the hf model's nucleus and entropy gradient);
- :class:`ServingSide`: what rollouts sample from: a frozen policy for given weights
  (``policy_for``), the orchestrator's never-trained sub-agents (``frozen``), the policy of this
  process's rollouts (``serve``) and each new version put beside the others (``publish``).

:class:`Backend` is both, what :func:`make_backend` returns for a run's config:

- ``TinyBackend`` (CPU, the default): the learner trains one ``TinyModel``; rollouts are served
  by frozen copies of its weights, one per live policy version, so the learner never changes
  weights a batch is sampling from, and an episode pinned to version v is sampled by exactly the
  weights of version v (``pinned = True``: runs are reproducible).
- ``HFBackend``: the learner trains a Hugging Face causal LM (``policy.hf.model.HFModel``) on the
  configured device and dtype. Rollouts are sampled either in this process by frozen copies, one
  per live version, like the tiny backend (``hf_server = ""``, ``pinned = True``), or by an
  SGLang fleet (``policy.sglang``): after each step the fleet loads the new weights through its
  weight sink (by disk, in the layout SGLang's ``/update_weights_from_disk`` reads, or from
  memory), generation paused around the load. A server holds one version at a time, so its
  episodes are not pinned (``pinned = False``): each token carries the version that sampled it,
  and the staleness bound and the clipped importance ratio (exact: the learner recomputes the
  server's masked distribution) take care of the rest.
- ``RoleBackend`` (``role_policies``): the tiny backend over a model per role of the
  organisation (``collective.rl.roles.RoleModels``; that module says why and holds their learner).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from collective.base.actions import ActionSpace
from collective.base.outputs import write_file
from collective.rl.learner import ModelDefaults, Scorer
from collective.rl.roles import RoleModels, trained_roles
from policy.base import Policy, PolicyRequest, PolicyResponse, TrainableModel
from policy.roles import RolePolicy

if TYPE_CHECKING:
    from collective.rl.config import TrainConfig
    from policy.sglang.client import SGLangPolicy

Weights = dict[str, torch.Tensor]
Logprobs = tuple[list[torch.Tensor], list[torch.Tensor]]


class LearnerSide(Scorer, Protocol):
    """The trainable side of a backend. ``model`` is always one this backend made (``fresh`` or
    ``load``), or a frozen copy of one (the learner's reference, for the KL term). As the
    learner's :class:`~collective.rl.learner.Scorer` it scores a model's output tokens under the
    distribution the run sampled them from (``TrainableModel.token_logprobs`` with what this
    backend's models need besides)."""

    def fresh(self) -> TrainableModel: ...

    def load(self, path: str | Path) -> TrainableModel: ...

    def weights(self, model: TrainableModel) -> Weights:
        """A copy of the weights rollouts are served from (pinned backends) and a resumed run
        restores."""
        ...

    def load_weights(self, model: TrainableModel, weights: Weights) -> None: ...

    def checkpoint(self, model: TrainableModel, directory: Path, snapshot: str | None) -> Path: ...


class ServingSide(Protocol):
    """What rollouts sample from, for a model the learner side made: in the training process
    the learner's, in a Ray worker the starting model, whose architecture (and adapters) the
    served copies share."""

    pinned: bool  # True: an episode pinned to version v is sampled by exactly v's weights

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

    async def aclose(self) -> None: ...


class Backend(LearnerSide, ServingSide, Protocol):
    """Both sides, as one run uses them."""


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
    """The tiny byte model (``policy.tiny``), trained and sampled in this process."""

    pinned = True

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.net_config = cfg.tiny  # replaced by the checkpoint's when training starts from one
        self.serving: VersionedPolicy | None = None

    # -- the learner's side --------------------------------------------------------------------

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

    def token_logprobs(
        self,
        model: Any,
        prompts: Sequence[str],
        outputs: Sequence[Sequence[int]],
        spaces: Sequence[ActionSpace],
        temperature: float,
    ) -> Logprobs:
        """The tiny model's mask includes the length budget (and it fixes the prompt's
        truncation): the one every rollout sampled with, ``max_output_tokens``."""
        return model.token_logprobs(
            prompts, outputs, spaces, temperature, max_tokens=self.cfg.max_output_tokens
        )

    def token_counts(
        self,
        model: Any,
        prompts: Sequence[str],
        outputs: Sequence[Sequence[int]],
        spaces: Sequence[ActionSpace],
    ) -> list[int]:
        return model.token_counts(prompts, outputs, spaces, max_tokens=self.cfg.max_output_tokens)

    def checkpoint(self, model: Any, directory: Path, snapshot: str | None) -> Path:
        """``latest.pt`` (usable with ``--policy tiny:PATH``) and, when asked, a snapshot."""
        from policy.tiny import save_checkpoint

        path = save_checkpoint(model, directory / "latest.pt")
        if snapshot:
            write_file(directory / f"{snapshot}.pt", path.read_bytes(), "checkpoint")
        return path

    # -- the serving side ----------------------------------------------------------------------

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
        assert self.serving is not None, "publish before serve"
        self.serving.publish(version, self.policy_for(model, weights, version), keep=self.cfg.lag)

    async def aclose(self) -> None:
        return None


class HFBackend(ModelDefaults):
    """A Hugging Face causal LM (``policy.hf.model.HFModel``), sampled in this process or by
    SGLang.

    ``hf_server = ""``: rollouts are sampled in-process (``policy.hf.policy.HFPolicy``, the
    ``hf:DIR`` policy) from frozen copies of the weights, one per live version, exactly as the
    tiny backend does (``pinned = True``: a run is reproducible from its config).
    ``hf_server = "sglang:..."``: an SGLang server samples and holds one version at a time
    (``pinned = False``); after each step the weights go to disk and the server loads them.

    Everything a run could trip over is checked here, before any rollout or training step: the
    config's learner fields, the device and dtype, the model directory (``fresh``). Token counts
    are the model's own (``ModelDefaults``); logprobs add the config's entropy and nucleus.
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
        ]  # (the numbers' domains are the config's own: collective.rl.domains.DOMAINS)
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
        self.local: VersionedPolicy | None = None  # hf_server = "": the in-process copies
        self.fleet: SGLangPolicy | None = None  # hf_server = "sglang:...": the fleet's client

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

    def token_logprobs(
        self,
        model: Any,
        prompts: Sequence[str],
        outputs: Sequence[Sequence[int]],
        spaces: Sequence[ActionSpace],
        temperature: float,
    ) -> Logprobs:
        """Under the run's nucleus (``top_p``: sampled in-process only), the entropy with a
        gradient only when the loss has an entropy term (``HFModel.token_logprobs`` says why)."""
        cfg = self.cfg
        return model.token_logprobs(
            prompts,
            outputs,
            spaces,
            temperature,
            entropy_grad=cfg.entropy_coef > 0,
            top_p=cfg.top_p,
        )

    def checkpoint(self, model: Any, directory: Path, snapshot: str | None) -> Path:
        """``latest/`` (a model directory: ``--policy hf:DIR`` and SGLang load it) and, when
        asked, a snapshot beside it."""
        path = directory / "latest"
        model.save(path)
        if snapshot:
            shutil.copytree(path, directory / snapshot, dirs_exist_ok=True)
        return path

    # -- the serving side ----------------------------------------------------------------------

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
            self.local = VersionedPolicy("hf (training)")
            for v, weights in sorted(kept.items()):
                self.local.publish(v, self.policy_for(model, weights, v), keep=self.cfg.lag)
            return self.local
        from policy.sglang.client import policy_from_spec

        self.fleet = policy_from_spec(self._server_spec(self.cfg).removeprefix("sglang:"))
        if model.version > 0:  # a resumed run: the server must serve what the learner has
            await self.publish(model, model.version, {})
        return self.fleet

    @staticmethod
    def _server_spec(cfg: TrainConfig) -> str:
        spec = cfg.hf.server
        if spec == "sglang:launch" or spec.startswith("sglang:launch "):  # serve hf_model
            spec = f"sglang:launch:{cfg.hf.path}{spec.removeprefix('sglang:launch')}"
        return spec

    async def publish(self, model: Any, version: int, weights: Weights) -> None:
        if self.fleet is None:
            assert self.local is not None, "publish before serve"
            self.local.publish(version, self.policy_for(model, weights, version), keep=self.cfg.lag)
            return
        target = self.weights_dir / f"v{version:06d}"
        if self.fleet.by_memory:  # written only if the fleet falls back to the disk
            from policy.sglang.weights import checkpoint_tensors

            await self.fleet.update_weights(
                lambda: model.save(target), version, tensors=lambda: checkpoint_tensors(model)
            )
        else:
            model.save(target)
            await self.fleet.update_weights(target, version)
        for old in self.weights_dir.glob("v*"):
            if old != target:
                shutil.rmtree(old, ignore_errors=True)

    async def aclose(self) -> None:
        if self.fleet is not None:
            await self.fleet.aclose()


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


class RoleBackend(TinyBackend):
    """The tiny backend over a model per role (``collective.rl.roles.RoleModels``): weights are
    one flat dict (``ROLE/name``), so serving, publishing, pinning and resume are the tiny
    backend's; each role's logprobs are its own model's (``TinyBackend.token_logprobs``, which
    the learner calls with each role's model)."""

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
