"""A Hugging Face causal LM as an in-process policy: ``--policy hf:DIR``.

The embedded policy for a laptop or a single GPU without a server. A batch (everyone thinking at
one instant) is one call of :meth:`HFPolicy.generate`; inside it, each request is decoded on its
own, in a pool of sampling threads:

- the prompt is the request's rendered through the model's chat template (:func:`prompt_ids`,
  the ids the SGLang client sends and the learner rebuilds);
- every step applies the action grammar's xgrammar mask and the temperature through
  :func:`policy.hf.grammar.masked_logits`, the very function the learner scores with, and the
  sampled token's logprob under that distribution is reported;
- token ``t`` is drawn with draw ``t + 1`` of ``collective.base.seeding.Stream(request.seed)``, by
  inverting the masked distribution's CDF (float64 running sum), so a seed names its tokens;
- decoding stops at a stop token (the grammar allows only those once the action is complete) or
  after ``max_tokens`` tokens, whichever comes first.

Shared prompt heads. Every prompt of an action space begins with the same tokens (the chat
header and the tool list: most of a prompt). Their keys and values are computed once per model
and action space, by a forward pass of those tokens alone, and each request prefills only the
rest of its prompt on top of them (SGLang's radix cache does the same on a server).

Batch-invariant by construction. A request's forward passes are its own: the shared head's
(shape ``[1, head]``, computed from the head's tokens only, so whichever request computes it
first gets the same keys and values), a prefill of shape ``[1, rest of its prompt]`` and decode
steps of shape ``[1, 1]`` over its own KV cache, each shape a function of the request alone. No
other request's tokens, length or count enter any kernel it runs, so its tokens and logprobs are
the same floats alone, in any batch, in any order, and in a replay whose batches differ from the
original run's; nothing rests on a kernel happening to treat rows independently. (What the
bits do depend on is what any computation depends on: the machine, the library versions and the
number of intra-op threads, which sampling fixes at one per thread; on CUDA, one stream per
process.) The cost is throughput on a GPU, where batching would fill the device:
``bench/gpu.py`` measures it; the SGLang path is the one for throughput.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
import trio

from collective.base.actions import ActionSpace
from collective.base.seeding import Stream
from policy.base import PolicyError, PolicyRequest, PolicyResponse
from policy.hf.grammar import GrammarError, masked_logits
from policy.hf.model import MIN_SHARED, HFModel, cache_pairs, common_prefix, new_cache
from policy.hf.prompt import prompt_ids

MAX_PREFIXES = 64  # shared prompt heads kept per model (one per action space, in practice)
_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    """The process's sampling threads of this size, each with one torch intra-op thread (made
    once, shared by every policy: a training run serves several versions)."""
    with _POOLS_LOCK:
        if workers not in _POOLS:
            _POOLS[workers] = ThreadPoolExecutor(
                workers, "hf-sample", initializer=torch.set_num_threads, initargs=(1,)
            )
        return _POOLS[workers]


def draw(logp: torch.Tensor, u: float) -> int:
    """The token at ``u`` in [0, 1) of the distribution ``exp(logp)`` (inverse CDF). A token of
    probability zero is never drawn: ``searchsorted(right=True)`` lands on the first token whose
    running sum exceeds ``u * total``, which has mass."""
    cdf = torch.cumsum(logp.exp().double(), dim=0)
    at = torch.searchsorted(
        cdf, torch.tensor([u], dtype=torch.float64, device=cdf.device) * cdf[-1], right=True
    )
    return int(at.clamp(max=len(cdf) - 1))


class HFPolicy:
    """A :class:`policy.base.Policy` over an :class:`HFModel` in this process; ``version`` is
    the model's. ``workers`` sampling threads (default: one per CPU core on a CPU, one on a GPU)."""

    def __init__(
        self, model: HFModel, *, name: str | None = None, workers: int | None = None
    ) -> None:
        self.model = model
        self.name = name or "hf"
        if workers is None:
            workers = 1 if model.device.type == "cuda" else (os.cpu_count() or 1)
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        config = model.causal.config
        self.context = int(getattr(config, "max_position_embeddings", 0) or 0)
        self._lock = threading.Lock()
        self._probes: dict[ActionSpace, list[int]] = {}
        self._prefixes: dict[tuple[int, ...], list] = {}

    @property
    def version(self) -> int:
        return self.model.version

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        return await trio.to_thread.run_sync(self.sample, list(requests))

    async def aclose(self) -> None:
        return None

    def sample(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        """Answer a batch, in order (synchronously; :meth:`generate` runs it in a thread)."""
        prompts = []
        for r in requests:
            where = f"hf policy: agent {r.agent} turn {r.turn}"
            if not r.temperature > 0:
                raise PolicyError(f"{where}: temperature must be > 0, got {r.temperature}")
            if r.max_tokens < 1:
                raise PolicyError(f"{where}: max_tokens must be >= 1, got {r.max_tokens}")
            if r.version not in (-1, self.version):
                raise PolicyError(
                    f"{where} is pinned to version {r.version}, but the model holds version "
                    f"{self.version} only"
                )
            ids = prompt_ids(self.model.tokenizer, r.prompt, r.space)
            if self.context and len(ids) + r.max_tokens > self.context:
                raise PolicyError(
                    f"{where}: {len(ids)} prompt tokens and max_tokens {r.max_tokens} exceed the "
                    f"model's {self.context} positions"
                )
            try:
                self.model.grammar.compiled(r.space)  # a bad grammar fails here, in one line
            except GrammarError as e:
                raise PolicyError(f"{where}: {e}") from None
            prompts.append(ids)
        pool = _pool(self.workers)
        return list(pool.map(self._one, requests, prompts))

    def _shared(self, prompt: list[int], space: ActionSpace) -> tuple[int, list]:
        """The keys and values of this prompt's leading tokens that every prompt of its action
        space shares (the chat header and the tool list), computed once per model and kept;
        how many tokens they cover. A function of the prompt and its space alone."""
        with self._lock:
            probe = self._probes.get(space)
        if probe is None:
            probe = prompt_ids(self.model.tokenizer, "", space)
            with self._lock:
                self._probes[space] = probe
        n = min(common_prefix([prompt, probe]), len(prompt) - 1)
        if n < MIN_SHARED:
            return 0, []
        key = tuple(prompt[:n])
        with self._lock:
            pairs = self._prefixes.get(key)
        if pairs is None:
            cache = new_cache(self.model.causal.config)
            with torch.inference_mode():
                head = torch.tensor([prompt[:n]], device=self.model.device)
                self.model.causal(
                    input_ids=head,
                    use_cache=True,
                    logits_to_keep=1,
                    **{self.model.cache_arg: cache},
                )
            pairs = cache_pairs(cache)
            with self._lock:
                if len(self._prefixes) >= MAX_PREFIXES:
                    self._prefixes.pop(next(iter(self._prefixes)))
                self._prefixes[key] = pairs
        return n, pairs

    def _one(self, r: PolicyRequest, prompt: list[int]) -> PolicyResponse:
        model, grammar = self.model, self.model.grammar
        device = model.device
        matcher = grammar.matcher(r.space)
        bitmask = torch.empty((1, grammar.words), dtype=torch.int32)
        stream = Stream(r.seed)
        shared, pairs = self._shared(prompt, r.space)
        cache = new_cache(model.causal.config, pairs)
        tokens: list[int] = []
        logprobs: list[float] = []
        with torch.inference_mode():
            step = torch.tensor([prompt[shared:]], device=device)
            for _ in range(r.max_tokens):
                out = model.causal(
                    input_ids=step, use_cache=True, logits_to_keep=1, **{model.cache_arg: cache}
                )
                matcher.fill_next_token_bitmask(bitmask)
                z = masked_logits(out.logits[0, -1:], r.temperature, bitmask)[0]
                logp = torch.log_softmax(z, dim=-1)
                token = draw(logp, stream.random())
                tokens.append(token)
                logprobs.append(float(logp[token]))
                if not matcher.accept_token(token):  # cannot happen: the mask allowed it
                    raise PolicyError(f"hf policy: the grammar refused its own token {token}")
                if matcher.is_terminated():
                    break
                step = torch.tensor([[token]], device=device)
        return PolicyResponse(
            text=model.tokenizer.decode(tokens, skip_special_tokens=True),
            token_ids=tokens,
            logprobs=logprobs,
            prompt_tokens=len(prompt),
            version=model.version,
        )


def load_hf_policy(directory: str, *, device: str = "auto", dtype: str | None = None) -> HFPolicy:
    """``--policy hf:DIR``: the directory's model on the GPU if there is one (bfloat16 where the
    GPU can do it), else on the CPU in float32."""
    from policy.hf.model import placement

    where, _ = placement(device, "float32")
    if dtype is None:
        bf16 = where.type == "cuda" and torch.cuda.is_bf16_supported()
        dtype = "bfloat16" if bf16 else "float32"
    model = HFModel.load(directory, device=where.type, dtype=dtype)
    return HFPolicy(model, name=f"hf:{directory}")
