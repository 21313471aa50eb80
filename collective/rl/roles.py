"""Per-role policies (``role_policies = true``): each role of an organisation trains its own.

A CEO and its specialists, or an orchestrator and its sub-agents (``orchestrator:trained``),
do different jobs from different prompts and action spaces; one shared policy must learn both
at once. Here each role gets its own tiny model, optimiser and version history, while the
engine, the rollouts and the run directory still see one model and one learner:

- ``RoleModels`` (here): the roles' models, and the run's version (all roles advance together,
  one version a step, so an episode pinned to version v is played by every role's v);
- ``RoleBackend`` (in ``collective/rl/backend.py``, beside the other backends): the tiny backend
  over them. Weights are one flat dict
  (``ROLE/name``), so serving, pinning, checkpoints and resume work unchanged; a served version is a
  ``policy.roles.RolePolicy`` that answers each request with its role's weights;
  ``checkpoints/roles/ROLE/latest.pt`` is each role's checkpoint (``--policy roles:DIR``);
- ``RoleLearner``: one ``Learner`` a role, each stepping on its own role's turns.

Each role's turns carry the advantage the run's scheme gives them (``collective``: their
rollout's collective advantage; ``individual``: their agent's leave-one-out credit), and each
role's loss is normalised over its own tokens, so a role that speaks little is not drowned by
one that speaks a lot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from collective.engine.organisation import make_organisation
from collective.rl.config import TrainConfig
from collective.rl.learner import Learner, Sample, Scorer

__all__ = ["RoleLearner", "RoleModels", "combined", "trained_roles"]


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


class RoleLearner:
    """One ``Learner`` a role; ``step`` hands each its own role's samples."""

    def __init__(self, model: RoleModels, cfg: TrainConfig, scorer: Scorer | None = None) -> None:
        self.model = model
        self.learners = {r: Learner(m, cfg, scorer) for r, m in model.models.items()}

    def step(self, samples: Sequence[Sample]) -> dict[str, Any]:
        by_role: dict[str, list[Sample]] = {r: [] for r in self.learners}
        for s in samples:
            if s.role not in by_role:
                raise ValueError(
                    f"role_policies: a turn of role {s.role!r}, which has no policy (roles: "
                    f"{', '.join(self.learners)})"
                )
            by_role[s.role].append(s)
        per_role = {}
        version = self.model.version
        for r, learner in self.learners.items():
            if by_role[r]:
                per_role[r] = learner.step(by_role[r])
            else:  # nothing to learn from: the weights stay, the version moves with the rest
                per_role[r] = {"trained_tokens": 0.0, "learner_seconds": 0.0}
        self.model.version = version + 1  # every role's, stepped or not (the setter says why)
        # (each role's figures without the wall-clock ones, which a rerun does not reproduce)
        clocked = ("learner_seconds", "learner_tokens_per_s")
        roles = {
            r: {k: float(v) for k, v in s.items() if k not in clocked} for r, s in per_role.items()
        }  # (optimiser_step as 1.0 or 0.0: a role's figures are numbers)
        return {**combined(per_role), "roles": roles}

    def state(self) -> dict[str, Any]:
        return {"roles": {r: learner.state() for r, learner in self.learners.items()}}

    def load_state(self, state: dict[str, Any]) -> None:
        for r, learner in self.learners.items():
            learner.load_state(state["roles"][r])


def combined(per_role: dict[str, dict[str, float]]) -> dict[str, float]:
    """The step's learner figures over every role: token-weighted means, summed tokens and
    seconds, and the norm of all the roles' gradients together."""
    tokens = sum(s["trained_tokens"] for s in per_role.values())
    seconds = sum(s["learner_seconds"] for s in per_role.values())

    def mean(key: str) -> float:
        if not tokens:
            return 0.0
        return sum(s.get(key, 0.0) * s["trained_tokens"] for s in per_role.values()) / tokens

    return {
        "loss": mean("loss"),
        "clip_fraction": mean("clip_fraction"),
        "ratio_mean": mean("ratio_mean"),
        "entropy": mean("entropy"),
        "kl": mean("kl"),
        "grad_norm": sum(s.get("grad_norm", 0.0) ** 2 for s in per_role.values()) ** 0.5,
        "learner_tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "learner_seconds": seconds,
        "trained_tokens": tokens,
        "optimiser_step": any(s.get("optimiser_step", False) for s in per_role.values()),
    }
