"""The policy interface: one async call that answers a whole batch of requests.

Every backend (random, scripted, recorded, the tiny torch model, SGLang) implements
:class:`Policy`. A response carries exactly what the learner needs: the sampled token ids, their
log-probabilities under the distribution actually sampled from, and the version of the weights
that sampled them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import msgspec

from collective.base.actions import ActionSpace

if TYPE_CHECKING:
    import torch  # only for annotations: importing the engine must not load torch


class PolicyRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One agent asking what to do next."""

    agent: int
    turn: int
    prompt: str
    space: ActionSpace  # the constraint: the output must be one valid action of this space
    seed: int  # derived from (episode sample seed, agent, turn): the request's own stream
    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0  # nucleus: the most likely tokens whose mass reaches it (1.0: all)
    asked: float = 0.0  # simulated time of the request (forks switch policy by it)
    version: int = -1  # the policy version the episode is pinned to (-1: the backend's latest)
    role: str = ""  # the asking agent's role (a ``RolePolicy`` answers each role with its own)


class PolicyResponse(msgspec.Struct, kw_only=True):
    text: str
    token_ids: list[int]
    logprobs: list[float]  # one per output token, under the (masked) sampling distribution
    prompt_tokens: int
    version: int = 0

    @property
    def output_tokens(self) -> int:
        return len(self.token_ids)


@runtime_checkable
class Policy(Protocol):
    """A batched policy. ``generate`` must answer every request, in order, and a request's
    answer must not depend on which other requests share its batch."""

    name: str  # recorded in the episode, e.g. "random" or "tiny:runs/a/ckpt-40.pt"

    @property
    def version(self) -> int:
        """The weights' version it samples with now (-1 before any: ``VersionedPolicy``). Read
        only: a plain attribute or a property satisfies it; what the learner learns from is each
        response's own ``version``."""
        ...

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]: ...

    async def aclose(self) -> None: ...


class PolicyError(RuntimeError):
    """A backend could not answer; the message names the backend and the request."""


class PolicyUnavailable(PolicyError):
    """A backend that cannot be reached at all (no server where the spec points, every server
    lost): the command's input is wrong, whatever it was asked. A replay that meets it says so
    (bad input, exit 2) rather than call the record diverged."""


@runtime_checkable
class TrainableModel(Protocol):
    """What the learner needs from a model it trains (the tiny torch model, or a Hugging Face
    causal LM): recompute the log-probabilities of recorded outputs, with gradients, under
    exactly the distribution they were sampled from (the same constraint mask, the same
    temperature), so the learner's importance ratio against the behaviour logprobs is exact,
    and save new weights where the serving backend can load them."""

    version: int

    def parameters(self) -> Iterator[torch.nn.Parameter]: ...

    def token_logprobs(
        self,
        prompts: Sequence[str],
        outputs: Sequence[Sequence[int]],
        spaces: Sequence[ActionSpace],
        temperature: float = 1.0,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per sample: the log-probability of each output token (differentiable) and the
        entropy of the sampling distribution at each output position."""
        ...

    def save(self, directory: Path) -> Path:
        """Write the current weights (tagged with ``version``) for the serving backend; return
        the path written."""
        ...
