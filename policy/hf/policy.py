"""A Hugging Face causal LM as an in-process policy: ``--policy hf:DIR``.

The embedded policy for a laptop or a single GPU without a server. A batch (everyone thinking at
one instant) is one call of :meth:`HFPolicy.generate`, decoded as a batch: each prompt is
prefilled on its own, then every step is one forward over all the live requests
(:mod:`policy.hf.decoder`), in contiguous shards, one per sampling thread:

- the prompt is the request's rendered through the model's chat template (:func:`prompt_ids`,
  the ids the SGLang client sends and the learner rebuilds);
- every step fills the batch's xgrammar masks together, before the step's forward (whose head
  computes only the tokens some row may take: ``FixedDecoder``'s ``HEAD_SHARE``), and applies
  each request's mask, temperature and ``top_p`` through
  :func:`policy.hf.grammar.masked_logits`, the very function the learner scores with, and the
  sampled token's logprob under that distribution is reported;
- token ``t`` is drawn with draw ``t + 1`` of ``collective.base.seeding.Stream(request.seed)``, by
  inverting the masked distribution's CDF (float64 running sum), so a seed names its tokens;
- a request stops at a stop token (the grammar allows only those once the action is complete)
  or after ``max_tokens`` tokens, whichever comes first, and leaves the batch.

Shared prompt heads. Every prompt of an action space begins with the same tokens (the chat
header and the tool list: most of a prompt). Their keys and values are computed once per model
and action space, by a forward pass of those tokens alone, and each request prefills only the
rest of its prompt on top of them (SGLang's radix cache does the same on a server).

Batch-invariant by construction. A request's prefill is its own (the shared head's forward, of
shape ``[1, head]`` and computed from the head's tokens only, then ``[1, rest of its prompt]``),
and every decode step sums exactly, so its tokens and logprobs are the same floats alone, in any
batch, at any position, in any order, and in a replay whose batches differ from the original
run's (:mod:`policy.hf.decoder` says how; ``tests/policy/test_hf_batched.py`` checks it under
every kernel choice this CPU can be made to take). What the bits do depend on is what any
computation depends on: the machine, the library versions, and the intra-op threads, which
sampling fixes at one per thread. A model outside the Llama family decodes each request on its
own (``AloneDecoder``), invariant because nothing is shared. ``bench/hf_batched.py`` measures
the throughput against ``transformers``' ``generate``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import torch
import trio

from collective.base.actions import ActionSpace
from collective.base.seeding import Stream
from policy.base import PolicyError, PolicyRequest, PolicyResponse
from policy.hf.cache import cache_pairs, new_cache
from policy.hf.decoder import AloneDecoder, FixedDecoder, unsupported
from policy.hf.grammar import GrammarError, masked_logits, unpack
from policy.hf.model import MIN_SHARED, HFModel, common_prefix, release_freed
from policy.hf.prompt import prompt_ids
from policy.threads import sampling_threads

MAX_PREFIXES = 64  # shared prompt heads kept per model (one per action space, in practice)


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
        self._decoder: FixedDecoder | AloneDecoder | None = None

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
            if not 0 < r.top_p <= 1:
                raise PolicyError(f"{where}: top_p must be in (0, 1], got {r.top_p}")
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
        if not requests:
            return []
        pool = sampling_threads("hf-sample", self.workers)
        # The batch in contiguous shards, one a sampling thread: any split gives the same
        # answers (module docstring), so the split is only about using the cores.
        size = -(-len(requests) // self.workers)
        shards = [range(at, min(at + size, len(requests))) for at in range(0, len(requests), size)]
        answers = pool.map(
            lambda rows: self.decode([requests[i] for i in rows], [prompts[i] for i in rows]),
            shards,
        )
        return [a for shard in answers for a in shard]

    def decoder(self) -> FixedDecoder | AloneDecoder:
        """The decode steps for this policy's model: exact-sum batched ones for the Llama
        family, one request at a time for any other (made once: a policy's weights never
        change)."""
        with self._lock:
            if self._decoder is None:
                causal = self.model.causal
                if unsupported(causal) is None:
                    if self.model.lora:  # the base never trains: one set of its matrices
                        shared = self.model.decoding  # for every version's copy
                        self._decoder = shared.decoder(causal, self.model.cache_arg)
                    else:
                        self._decoder = FixedDecoder(causal, self.model.cache_arg)
                    release_freed()  # the build's float64 transients
                else:
                    self._decoder = AloneDecoder(causal, self.model.cache_arg)
            return self._decoder

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

    @torch.inference_mode()
    def decode(
        self,
        requests: Sequence[PolicyRequest],
        prompts: Sequence[list[int]],
    ) -> list[PolicyResponse]:
        """Decode a batch together: each step one forward over its live requests, their grammar
        masks filled together; a request leaves at its stop token or its ``max_tokens``. Runs
        in a sampling thread (one intra-op thread: the shared heads' float32 forwards too)."""
        import xgrammar as xgr

        model, grammar = self.model, self.model.grammar
        n = len(requests)
        matchers = [grammar.matcher(r.space) for r in requests]
        streams = [Stream(r.seed) for r in requests]
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        heads = [self._shared(p, r.space) for p, r in zip(prompts, requests, strict=True)]
        rows, logits = self.decoder().start(heads, prompts, [r.max_tokens for r in requests])
        masks = xgr.BatchGrammarMatcher(max_threads=1)
        bitmask = torch.empty((n, grammar.words), dtype=torch.int32)
        live = list(range(n))
        masks.batch_fill_next_token_bitmask([matchers[i] for i in live], bitmask)
        while live:
            going = []
            for j, i in enumerate(live):
                r = requests[i]
                # a [1, vocab] row of its own: the same bits whatever shares the batch
                z = masked_logits(logits[j : j + 1], r.temperature, bitmask[j : j + 1], r.top_p)[0]
                logp = torch.log_softmax(z, dim=-1)
                token = draw(logp, streams[i].random())
                tokens[i].append(token)
                logprobs[i].append(float(logp[token]))
                if not matchers[i].accept_token(token):  # cannot happen: the mask allowed it
                    raise PolicyError(f"hf policy: the grammar refused its own token {token}")
                if not matchers[i].is_terminated() and len(tokens[i]) < r.max_tokens:
                    going.append(j)
            if not going:
                break
            if len(going) < len(live):
                rows.keep(going)
                live = [live[j] for j in going]
            # the next token's masks before the step: its head computes what they allow
            masks.batch_fill_next_token_bitmask([matchers[i] for i in live], bitmask)
            allowed = unpack(bitmask[: len(live)], model.vocab_size)
            logits = rows.step([tokens[i][-1] for i in live], allowed)
        return [
            PolicyResponse(
                text=model.tokenizer.decode(tokens[i], skip_special_tokens=True),
                token_ids=tokens[i],
                logprobs=logprobs[i],
                prompt_tokens=len(prompts[i]),
                version=model.version,
            )
            for i in range(n)
        ]


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
