"""The tiny model as the engine and the learner see it: ``TinyModel`` and ``TinyPolicy``.

``TinyModel`` owns the network, its version and a lock. It samples batches of requests (the
policy side) and recomputes log-probabilities with gradients (the learner side, the
``policy.base.TrainableModel`` protocol). ``TinyPolicy`` is the async ``Policy`` the conductor
calls; it runs the model in a worker thread (``trio.to_thread.run_sync``) because a batch takes
real CPU time: torch releases the GIL inside its kernels, so the trio loop stays free to run
actors, other episodes and a learner thread beside it, instead of freezing for the whole batch.

The learner's side, in full::

    model = TinyModel.fresh(TinyConfig(seed=1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    logps, entropies = model.token_logprobs(prompts, outputs, spaces, temperature, max_tokens=64)
    loss = ...; loss.backward()
    with model.update():       # no batch samples while weights change; version + 1 after
        opt.step()
    frozen = model.frozen()    # a snapshot for the organisation's frozen sub-agents
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import torch
import trio

from collective.base.actions import ActionSpace
from policy.base import PolicyError, PolicyRequest, PolicyResponse
from policy.grammar import batch_tables
from policy.threads import sampling_threads
from policy.tiny import decode
from policy.tiny.invariant import SamplingNet
from policy.tiny.model import TinyConfig, TinyTransformer
from policy.tiny.weights import load_weights, save_weights, snapshot
from policy.tokenizer import decode as detokenize

#: The output budget a request has unless it says otherwise (the learner's default, too).
DEFAULT_MAX_TOKENS: int = next(
    f.default for f in msgspec.structs.fields(PolicyRequest) if f.name == "max_tokens"
)
MIN_CHUNK_ROWS = 128  # below this, a chunk's fixed cost per step outweighs running in parallel


class TinyModel:
    """The network plus what serving and training need around it.

    A batch is sampled in chunks of requests with similar prompt lengths. ``max_rows`` bounds a
    chunk, so memory stays bounded whatever the batch size; ``workers`` threads (shared by every
    model in the process: a training run serves several versions) sample chunks side by side,
    each with ONE torch intra-op thread. On a small CPU that is the parallelism that pays: a
    decode step is dozens of small kernels, and splitting each across cores costs a barrier per
    kernel, which becomes a stall of a whole time slice when another process (or the learner)
    holds a core (tenfold on a busy machine: ``bench/results/policy/README.md``). Chunks on
    separate threads never wait for each other. One intra-op thread is also part of what keeps
    sampling bit-exact whatever the batch: a prompt's prefill is the same kernel calls in any
    batch only if their thread count is too, and no elementwise kernel cuts a tensor at a place
    that depends on its size (``policy.tiny.invariant``).
    (``torch.set_num_threads`` also sets the default for threads created later; a learner that
    wants more intra-op threads sets them in its own thread.)
    """

    def __init__(
        self,
        net: TinyTransformer,
        *,
        version: int = 0,
        max_rows: int = 256,
        workers: int | None = None,
        source: str = "",
    ) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.net = net
        self.version = version
        self.max_rows = max_rows
        self.workers = workers if workers is not None else (os.cpu_count() or 1)
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        self.source = source  # where the weights came from, for names and reports
        self.lock = threading.RLock()  # held while sampling and while weights change

    def _chunks(self, order: list[int]) -> list[list[int]]:
        """Contiguous runs of ``order`` (sorted by prompt length): at most ``max_rows`` each,
        and enough of them to keep every worker busy once a batch is worth splitting."""
        n = len(order)
        count = -(-n // self.max_rows)
        if self.workers > 1:
            count = max(count, min(2 * self.workers, n // MIN_CHUNK_ROWS))
        size = -(-n // max(count, 1))
        return [order[i : i + size] for i in range(0, n, size)]

    @classmethod
    def fresh(cls, config: TinyConfig | None = None, **kw: Any) -> TinyModel:
        config = config or TinyConfig()
        return cls(TinyTransformer(config), source=f"fresh weights, seed {config.seed}", **kw)

    @classmethod
    def load(cls, path: str | Path, **kw: Any) -> TinyModel:
        """A checkpoint's weights (checked: see ``policy.tiny.weights``) as a policy."""
        net, version = load_weights(path)
        return cls(net, version=version, source=f"{path}, v{version}", **kw)

    @property
    def config(self) -> TinyConfig:
        return self.net.cfg

    # -- the learner's side ------------------------------------------------------------------

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.net.parameters()

    @contextmanager
    def update(self) -> Iterator[None]:
        """Change the weights inside this block (an optimiser step, a load): no batch is
        sampled meanwhile, and the version goes up by one when it ends, so every later response
        carries the new version."""
        with self.lock:
            yield
            self.version += 1

    def frozen(self) -> TinyModel:
        """An independent copy of the current weights and version that training never moves."""
        with self.lock:
            net = copy.deepcopy(self.net)
        net.requires_grad_(False)
        return TinyModel(
            net,
            version=self.version,
            max_rows=self.max_rows,
            workers=self.workers,
            source=f"frozen {self.source}",
        )

    def token_logprobs(
        self,
        prompts: Sequence[str],
        outputs: Sequence[Sequence[int]],
        spaces: Sequence[ActionSpace],
        temperature: float = 1.0,
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per sample: each output token's log-probability (differentiable) and the entropy at
        each output position, under the same mask it was sampled with.

        The mask includes the length budget, so pass the ``max_tokens`` the outputs were sampled
        with (the episode's ``config.max_output_tokens``); it also fixes the prompt truncation.
        """
        if not len(prompts) == len(outputs) == len(spaces):
            raise ValueError(
                f"token_logprobs: {len(prompts)} prompts, {len(outputs)} outputs and "
                f"{len(spaces)} spaces; they must be equal"
            )
        if temperature <= 0:
            raise ValueError(f"token_logprobs: temperature must be > 0, got {temperature}")
        if not 1 <= max_tokens < self.config.context:
            raise ValueError(
                f"token_logprobs: max_tokens {max_tokens} must be in 1..{self.config.context - 1}"
            )
        if not prompts:
            return [], []
        room = self.config.context - max_tokens
        fitted = [decode.fit_prompt(p, room) for p in prompts]
        tables = batch_tables(spaces)
        return decode.score(
            self.net, fitted, outputs, [max_tokens] * len(fitted), temperature, tables
        )

    def token_counts(
        self,
        prompts: Sequence[str],
        outputs: Sequence[Sequence[int]],
        spaces: Sequence[ActionSpace] = (),
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> list[int]:
        """Per sample, the tokens ``token_logprobs`` feeds the network: the prompt's bytes as it
        cuts them (BOS included) and the output (``spaces`` do not change the count)."""
        room = self.config.context - max_tokens
        return [
            len(decode.fit_prompt(p, room)) + len(o) for p, o in zip(prompts, outputs, strict=True)
        ]

    def save(self, directory: Path) -> Path:
        return self.save_to(Path(directory) / f"tiny-v{self.version:06d}.pt")

    def save_to(self, path: Path) -> Path:
        """Write the weights and version to ``path``, atomically."""
        with self.lock:
            version, state = self.version, snapshot(self.net)
        return save_weights(self.config, version, state, path)

    # -- the policy's side -------------------------------------------------------------------

    def _room(self, max_tokens: int, where: str) -> int:
        context = self.config.context
        if not 1 <= max_tokens < context:
            raise PolicyError(
                f"{where}: max_tokens {max_tokens} must be in 1..{context - 1} "
                f"(the tiny model's context is {context} tokens, prompt included)"
            )
        return context - max_tokens

    def sample(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        """Answer a batch (synchronously; ``TinyPolicy`` calls this in a worker thread)."""
        if not requests:
            return []
        fitted: list[list[int]] = []
        for r in requests:
            where = f"tiny policy: agent {r.agent} turn {r.turn}"
            if not r.temperature > 0:
                raise PolicyError(f"{where}: temperature must be > 0, got {r.temperature}")
            if r.top_p != 1.0:
                raise PolicyError(f"{where}: the tiny model samples with top_p = 1 only")
            fitted.append(decode.fit_prompt(r.prompt, self._room(r.max_tokens, where)))
        tables = batch_tables([r.space for r in requests])
        for r, w in zip(requests, tables.which, strict=True):
            if tables.grammars[w].shortest > r.max_tokens:
                raise PolicyError(
                    f"tiny policy: agent {r.agent} turn {r.turn}: max_tokens {r.max_tokens} "
                    f"cannot fit the shortest action of its space "
                    f"({tables.grammars[w].shortest} tokens with EOS)"
                )
        # Similar prompt lengths share a chunk (less padding); results go back in request order.
        order = sorted(range(len(requests)), key=lambda i: len(fitted[i]))
        answers: list[decode.Sampled | None] = [None] * len(requests)

        def run(idx: list[int]) -> list[decode.Sampled]:
            return decode.sample(
                net,
                [fitted[i] for i in idx],
                [requests[i].max_tokens for i in idx],
                [requests[i].temperature for i in idx],
                [requests[i].seed for i in idx],
                tables,
                tables.start[idx],
            )

        pool = sampling_threads("tiny-sample", self.workers)
        with self.lock:
            version = self.version
            # The weights as they are now, prepared for sampling (on a sampling thread: one
            # intra-op thread is also the fast way for tensors this small).
            net = pool.submit(SamplingNet, self.net).result()
            for r in requests:
                if r.version not in (-1, version):
                    raise PolicyError(
                        f"tiny policy: agent {r.agent} turn {r.turn} is pinned to version "
                        f"{r.version}, but the model holds version {version} only"
                    )
            chunks = self._chunks(order)
            for idx, got in zip(chunks, pool.map(run, chunks), strict=True):
                for i, sampled in zip(idx, got, strict=True):
                    answers[i] = sampled
        out = []
        for s, p in zip(answers, fitted, strict=True):
            assert s is not None
            out.append(
                PolicyResponse(
                    text=detokenize(s.tokens),
                    token_ids=s.tokens,
                    logprobs=s.logprobs,
                    prompt_tokens=len(p),
                    version=version,
                )
            )
        return out


class TinyPolicy:
    """The ``Policy`` over a ``TinyModel``; ``version`` is always the model's current one."""

    tokenizer_name = "bytes"  # its token ids (see collective.replay.tokenizer_of)

    def __init__(self, model: TinyModel, name: str | None = None) -> None:
        self.model = model
        self.name = name or f"tiny ({model.source})"

    @property
    def version(self) -> int:
        return self.model.version

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        return await trio.to_thread.run_sync(self.model.sample, list(requests))

    async def aclose(self) -> None:
        return None
