"""One policy per role: an organisation's roles (a CEO and its specialists, an orchestrator and
its sub-agents) answered each by its own policy.

The engine asks one policy (``trained``) and every request says its agent's role
(``PolicyRequest.role``), so a ``RolePolicy`` is only a router: it splits a batch by role and
hands each part to that role's policy, keeping the order. Each role's answers depend only on
its own requests, so batch invariance holds if it holds for each role's policy.

``roles:DIR`` loads one tiny checkpoint per role from ``DIR/ROLE/latest.pt`` (what a
``role_policies`` training run writes under ``RUN/checkpoints/roles``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from policy.base import Policy, PolicyError, PolicyRequest, PolicyResponse


class RolePolicy:
    """Answers each request with its role's policy (``policies[request.role]``)."""

    def __init__(self, policies: Mapping[str, Policy], name: str = "") -> None:
        if not policies:
            raise ValueError("a role policy needs at least one role")
        self.policies = dict(policies)
        self.name = (
            name
            or "roles(" + ", ".join(f"{r}={p.name}" for r, p in sorted(self.policies.items())) + ")"
        )
        names = {getattr(p, "tokenizer_name", None) for p in self.policies.values()}
        if len(names) == 1 and isinstance(tokenizer := names.pop(), str):
            self.tokenizer_name = tokenizer  # (replay checks the ids only if all roles agree)

    @property
    def version(self) -> int:
        return max(p.version for p in self.policies.values())

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        by_role: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            by_role.setdefault(r.role, []).append(i)
        out: list[PolicyResponse | None] = [None] * len(requests)
        for role, idx in sorted(by_role.items()):
            policy = self.policies.get(role)
            if policy is None:
                raise PolicyError(
                    f"{self.name}: agent {requests[idx[0]].agent} asks as role {role!r}, which "
                    f"has no policy (roles: {', '.join(sorted(self.policies))})"
                )
            answers = await policy.generate([requests[i] for i in idx])
            for i, a in zip(idx, answers, strict=True):
                out[i] = a
        return out  # type: ignore[return-value]

    async def aclose(self) -> None:
        for p in self.policies.values():
            await p.aclose()


def load_role_policy(directory: str | Path) -> RolePolicy:
    """``roles:DIR``: a tiny policy per role from each ``DIR/ROLE/latest.pt``."""
    from policy.tiny import TinyModel, TinyPolicy

    root = Path(directory)
    found = sorted(p for p in root.glob("*/latest.pt")) if root.is_dir() else []
    if not found:
        raise ValueError(
            f"roles:{directory}: no ROLE/latest.pt in it (a role_policies run writes them to "
            "RUN/checkpoints/roles)"
        )
    return RolePolicy(
        {p.parent.name: TinyPolicy(TinyModel.load(p), name=f"tiny:{p}") for p in found},
        name=f"roles:{directory}",
    )
