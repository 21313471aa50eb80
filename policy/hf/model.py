"""A Hugging Face causal LM as the learner trains it: exact masked logprobs, chunked over tokens.

:class:`HFModel` implements :class:`policy.base.TrainableModel` for any local causal LM directory
(``save_pretrained`` layout: what ``AutoModelForCausalLM``, SGLang's ``--model-path`` and its
``/update_weights_from_disk`` read). It samples nothing itself: the in-process policy
(:mod:`policy.hf.policy`) or an SGLang server does.

Exact importance ratios. A sampler reports each token's logprob under the distribution it drew
from: the logits over the temperature, with the action grammar's mask applied (xgrammar, on
SGLang and in-process alike). :meth:`HFModel.token_logprobs` recomputes exactly that: it replays
an xgrammar matcher along each recorded output to get the mask before every token, and applies
it through the same function the in-process sampler uses (:func:`policy.hf.grammar.masked_logits`).
So before any update the ratio is 1 up to float rounding (a full-sequence forward rounds
differently from cached decoding: about 1e-6 in float32), and the learner can trust behaviour
logprobs of older versions. Entropy and KL are of the masked distribution too.

Memory. Naively, the logits of a batch are ``[batch, tokens, vocab]`` floats: with a 152k
vocabulary, 16 sequences of 1,024 tokens are 10 GB in float32, most of them for prompt positions
whose logits nobody needs. Here the transformer body gives hidden states; only the output
positions' rows are kept, and their logits are made ``logit_chunk`` positions at a time, masked,
reduced to the selected token's logprob and the entropy, and dropped; each chunk runs under
activation checkpointing, so its ``[chunk, vocab]`` logits are recomputed in the backward pass
instead of kept. Peak memory for the logits is a few ``logit_chunk x vocab`` float32 tensors,
whatever the batch (``tests/policy/test_hf_memory.py`` measures it).

LoRA (``lora_rank > 0``, through ``peft``): only the adapters train; :meth:`reference` (the KL
term's initial policy) is the same module with its adapters disabled, not a copy. :meth:`save`
writes the merged weights, so a checkpoint is a plain model directory that SGLang and
``--policy hf:DIR`` load.
"""

from __future__ import annotations

import copy
import json
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from collective.base.actions import ActionSpace
from policy.hf.cache import cache_pairs, new_cache
from policy.hf.decoder import SharedBase
from policy.hf.grammar import ActionGrammar, masked_logits
from policy.hf.prompt import load_tokenizer, prompt_ids

VERSION_FILE = "collective.json"  # {"version": N}: which policy version the weights are
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


# -- where a model runs -----------------------------------------------------------------------


def placement(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """The torch device and dtype for a config's ``device`` ("auto", "cpu", "cuda") and ``dtype``
    ("float32", "bfloat16"); a ValueError when this machine cannot do them.

    bfloat16 on a CPU is allowed: torch implements it on every x86 CPU (natively fast only with
    AVX512-BF16 or AMX; elsewhere converted, slower than float32). Exact importance ratios (1
    within 1e-4 on-policy) are claimed in float32 only: in bfloat16 the sampler's cached decoding
    and the learner's full forward round differently at about 1e-2.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    cuda = torch.cuda.is_available()
    if device == "cuda" and not cuda:
        raise ValueError(
            f"device 'cuda' was asked for, but torch {torch.__version__} sees no CUDA device "
            f"(built with CUDA {torch.version.cuda or 'none'})"
        )
    where = torch.device("cuda" if device == "cuda" or (device == "auto" and cuda) else "cpu")
    if where.type == "cuda" and dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
        raise ValueError(
            f"dtype 'bfloat16' was asked for, but {torch.cuda.get_device_name()} cannot do it "
            "(bfloat16 needs compute capability 8.0 or newer); use dtype = 'float32'"
        )
    return where, DTYPES[dtype]


def check_model_dir(directory: str | Path) -> Any:
    """Refuse, in one line naming the directory, what cannot be a policy: no directory, no
    config, not a causal LM. Returns its config. Never downloads."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"model directory {str(directory)!r} does not exist")
    if not (directory / "config.json").is_file():
        raise ValueError(f"{directory} is not a Hugging Face model directory (no config.json)")
    try:
        config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    except (ValueError, KeyError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{directory}/config.json: {first}") from None
    archs = getattr(config, "architectures", None) or []
    causal = type(config) in MODEL_FOR_CAUSAL_LM_MAPPING and (
        not archs or any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
    )
    if not causal:
        raise ValueError(
            f"{directory} is not a causal language model (model_type {config.model_type!r}, "
            f"architectures {archs})"
        )
    if getattr(config, "final_logit_softcapping", None):
        raise ValueError(
            f"{directory}: logit soft-capping (model_type {config.model_type!r}) is not "
            "supported: the learner computes logits as lm_head(hidden) only"
        )
    return config


def stop_ids(model: Any, tokenizer: Any) -> list[int]:
    """The end-of-sequence ids that end an output: the generation config's, else the
    tokenizer's (what SGLang hands its grammar backend)."""
    ids: Any = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if ids is None:
        ids = tokenizer.eos_token_id
    if ids is None:
        return []
    return [int(i) for i in ([ids] if isinstance(ids, int) else ids)]


def load_parts(directory: str | Path, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any]:
    """The causal LM (eval mode, on ``device`` in ``dtype``) and its tokenizer from a checked
    directory; a tokenizer without a chat template is refused (every prompt is rendered by it)."""
    from transformers import AutoModelForCausalLM

    check_model_dir(directory)
    tokenizer = load_tokenizer(directory)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"{directory}: the tokenizer has no chat template (the hf path renders every prompt "
            "as a chat turn); add one to tokenizer_config.json or chat_template.jinja"
        )
    no_progress_bars()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(directory), local_files_only=True, dtype=dtype
        )
    except Exception as e:  # safetensors' SafetensorError, torch's, OSError: all mean one thing
        raise ValueError(
            f"{directory}: its weights cannot be read (truncated or corrupt?): {_first_line(e)}"
        ) from None
    # transformers wraps ``to`` in functools.wraps, whose type takes ``self`` as the first argument
    return model.to(device).eval(), tokenizer  # type: ignore[arg-type]


def no_progress_bars() -> None:
    """Turn transformers' own progress bars ("Loading weights", "Writing model shards") off:
    the command line prints its own progress (none with --quiet), and a one-line error must be
    the only line. Called where weights are loaded or written, not at import."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def release_freed() -> None:
    """Hand the heap's free pages back to the system (glibc's ``malloc_trim``; nothing
    elsewhere). Building a decoder frees float64 transients, and saving a LoRA checkpoint a
    merged copy of the model, in pieces below glibc's mmap threshold, which stay in the process
    otherwise: a SmolLM2-135M decoder of 1.0 GiB of tensors grew the process by 1.5 to 2.1 GiB."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None or sys.platform != "linux":
        return
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError):  # (a libc without malloc_trim: musl)
        return


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0][:200]}" if lines else type(e).__name__


def _cache_arg(module: Any) -> str:
    """The name of the KV-cache argument: ``cache`` in transformers >= 5.2x, else
    ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    """How many leading token ids every sequence shares."""
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for s in seqs[1:]:
        k = 0
        while k < n and s[k] == first[k]:
            k += 1
        n = k
    return n


#: Below this many shared prompt tokens, a separate forward pass for them is not worth it.
MIN_SHARED = 8


# -- the model --------------------------------------------------------------------------------


class HFModel:
    """A ``transformers`` causal LM (optionally wrapped in ``peft`` LoRA), its tokenizer, its
    action grammar and the policy version of its weights.

    ``batch_size`` bounds the sequences of one forward pass; ``logit_chunk`` the output positions
    whose logits exist at once (memory: ``logit_chunk x vocab`` floats, a few times over).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        version: int = 0,
        batch_size: int = 8,
        logit_chunk: int = 256,
        grammar: ActionGrammar | None = None,
    ) -> None:
        if batch_size < 1 or logit_chunk < 1:
            raise ValueError(
                f"need batch_size and logit_chunk >= 1, got {batch_size}, {logit_chunk}"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.version = version
        self.batch_size = batch_size
        self.logit_chunk = logit_chunk
        self.vocab_size = int(self.causal.get_output_embeddings().weight.shape[0])
        self.grammar = grammar or ActionGrammar(
            tokenizer, self.vocab_size, stop_ids(self.causal, tokenizer)
        )
        self.cache_arg = _cache_arg(self.causal)
        #: The batch-invariant decoder's base matrices, built by the first policy that decodes
        #: and shared by every LoRA copy (:meth:`copy`), whose base weights are these.
        self.decoding = SharedBase()

    @classmethod
    def load(
        cls,
        directory: str | Path,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        lora_rank: int = 0,
        lora_alpha: float = 16.0,
        gradient_checkpointing: bool = False,
        **kw: Any,
    ) -> HFModel:
        """Load a model directory (from :meth:`save`, ``collective make-model``, or any local
        Hugging Face causal LM with a chat template); its version is the one :meth:`save`
        recorded there, else 0. With ``lora_rank > 0`` only LoRA adapters of that rank (on
        every linear layer but the output head) will train."""
        where, torch_dtype = placement(device, dtype)
        model, tokenizer = load_parts(directory, where, torch_dtype)
        if gradient_checkpointing:
            # transformers checkpoints layers only in train mode, where dropout would make the
            # recomputed logprobs random: refuse a model that has any.
            dropout = {
                k: v
                for k, v in model.config.to_dict().items()
                if "dropout" in k and isinstance(v, float) and v > 0
            }
            if dropout:
                raise ValueError(
                    f"{directory}: gradient checkpointing trains in train mode, and this model's "
                    f"dropout {dropout} would make its logprobs random"
                )
            no_reentrant = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
                model.activation_checkpointing_enable(no_reentrant)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=no_reentrant)
        if lora_rank > 0:
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(
                r=lora_rank,
                lora_alpha=lora_alpha,  # type: ignore[arg-type]  # peft says int; it takes a float
                lora_dropout=0.0,
                target_modules="all-linear",
            )
            with warnings.catch_warnings():
                # peft reads transformers' deprecated ``is_gradient_checkpointing`` itself (peft
                # 0.21, transformers 5.24): nothing a caller could change, so not shown to one.
                warnings.filterwarnings(
                    "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
                )
                model = get_peft_model(model, lora)
        model.eval()  # always, but while the learner checkpoints (HFModel._score): no dropout
        version = 0
        if (Path(directory) / VERSION_FILE).is_file():
            version = int(json.loads((Path(directory) / VERSION_FILE).read_text())["version"])
        return cls(model, tokenizer, version=version, **kw)

    # -- what it is ---------------------------------------------------------------------------

    @property
    def lora(self) -> bool:
        return hasattr(self.model, "disable_adapter")

    @property
    def causal(self) -> Any:
        """The ``...ForCausalLM`` module (inside the peft wrapper when there is one)."""
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """The parameters that train (the adapters only, under LoRA)."""
        return (p for p in self.model.parameters() if p.requires_grad)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Copies of the weights that train: what a checkpoint and a served version need."""
        names = {n for n, p in self.model.named_parameters() if p.requires_grad}
        return {k: v.detach().clone() for k, v in self.model.state_dict().items() if k in names}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load what :meth:`trainable_state` wrote (a strict load would miss the frozen weights,
        and tied ones that ``state_dict`` lists twice)."""
        _load_trainable(self.model, state)

    def copy(
        self, state: dict[str, torch.Tensor] | None = None, version: int | None = None
    ) -> HFModel:
        """A copy that never trains (for serving a version, or the orchestrator's frozen
        sub-agents), with ``state`` loaded into it when given. It shares the tokenizer and the
        grammar (both read-only), and under LoRA the base weights (they never train: a version
        is its adapters) and the decoder matrices built from them (:attr:`decoding`)."""
        frozen = {}
        if self.lora:
            frozen = {id(p): p for n, p in self.model.named_parameters() if "lora_" not in n}
        module = copy.deepcopy(self.model, frozen)
        module.requires_grad_(False)
        twin = HFModel(
            module.eval(),
            self.tokenizer,
            version=self.version if version is None else version,
            batch_size=self.batch_size,
            logit_chunk=self.logit_chunk,
            grammar=self.grammar,
        )
        if self.lora:
            twin.decoding = self.decoding
        if state is not None:  # (checked against what trains here: the twin trains nothing)
            _load_trainable(
                twin.model, state, {n for n, p in self.model.named_parameters() if p.requires_grad}
            )
        return twin

    def reference(self) -> _Reference | HFModel:
        """The policy training started from, for the KL term: under LoRA this very module with
        its adapters disabled (the base weights never train); otherwise a frozen copy."""
        return _Reference(self) if self.lora else self.copy()

    # -- the learner's side --------------------------------------------------------------------

    def token_logprobs(
        self,
        prompts: Sequence[str],
        outputs: Sequence[Sequence[int]],
        spaces: Sequence[ActionSpace],
        temperature: float = 1.0,
        *,
        entropy_grad: bool = False,
        top_p: float = 1.0,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per sample, the log-probability of each output token (differentiable) and the entropy
        at each output position, under the distribution it was sampled from: the grammar's mask,
        ``temperature``, the ``top_p`` nucleus. The prompt is rebuilt as every sampler builds it
        (:func:`prompt_ids`). The entropy carries a gradient only with ``entropy_grad`` (a loss
        with an entropy term: the backend passes it)."""
        if not len(prompts) == len(outputs) == len(spaces):
            raise ValueError(
                f"token_logprobs: {len(prompts)} prompts, {len(outputs)} outputs and "
                f"{len(spaces)} spaces; they must match"
            )
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 to score sampled tokens, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        for i, out in enumerate(outputs):
            bad = [t for t in out if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"output {i} has token ids {bad[:5]} outside the vocabulary")
        masks = [
            self.grammar.masks(s, o, f"output {i}")
            for i, (s, o) in enumerate(zip(spaces, outputs, strict=True))
        ]
        ids = [prompt_ids(self.tokenizer, p, s) for p, s in zip(prompts, spaces, strict=True)]
        # Batches of prompts in sorted order share the longest prefixes (see _score).
        order = sorted(range(len(ids)), key=lambda i: ids[i])
        logprobs: list[torch.Tensor] = [torch.zeros(0)] * len(ids)
        entropies: list[torch.Tensor] = [torch.zeros(0)] * len(ids)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            lp, ent = self._score(
                [ids[i] for i in idx],
                [list(outputs[i]) for i in idx],
                [masks[i] for i in idx],
                temperature,
                entropy_grad,
                top_p,
            )
            for i, a, b in zip(idx, lp, ent, strict=True):
                logprobs[i], entropies[i] = a, b
        return logprobs, entropies

    def token_counts(
        self,
        prompts: Sequence[str],
        outputs: Sequence[Sequence[int]],
        spaces: Sequence[ActionSpace],
    ) -> list[int]:
        """The prompt's ids as :meth:`token_logprobs` builds them (the chat template's) and the
        output's: what one sample puts through the forward pass."""
        return [
            len(prompt_ids(self.tokenizer, p, s)) + len(o)
            for p, o, s in zip(prompts, outputs, spaces, strict=True)
        ]

    def _checkpointed(self) -> bool:
        """Whether this forward pass checkpoints layers: gradient checkpointing is on and there
        are gradients to compute. (transformers checkpoints only in train mode, so ``_score``
        switches to it for the pass; the module rests in eval mode, where samplers find it.)"""
        return torch.is_grad_enabled() and any(
            getattr(m, "gradient_checkpointing", False) for m in self.causal.modules()
        )

    def _score(
        self,
        prompts: list[list[int]],
        outputs: list[list[int]],
        masks: list[torch.Tensor],
        temperature: float,
        entropy_grad: bool = False,
        top_p: float = 1.0,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One forward pass over a batch. The prompt tokens every sequence shares (the chat
        header and the tool list: most of a prompt) go through the model once, and their keys
        and values serve every row; gradients flow back through them once, summed. (Not under
        gradient checkpointing: transformers drops the cache when it checkpoints a layer.)"""
        device = self.device
        lengths = [len(o) for o in outputs]
        if not any(lengths):
            empty = torch.zeros(0, device=device)
            return [empty] * len(outputs), [empty] * len(outputs)
        body = self.causal.get_decoder()
        checkpointed = self._checkpointed()
        # Every row keeps at least its last prompt token, whose hidden state predicts output 0.
        shared = min(common_prefix(prompts), min(len(p) for p in prompts) - 1)
        cache = None
        if shared < MIN_SHARED or checkpointed:
            shared = 0
        else:
            cache = new_cache(self.causal.config)
            head = torch.tensor([prompts[0][:shared]], device=device)
            body(input_ids=head, use_cache=True, **{self.cache_arg: cache})
            rows = len(prompts)
            cache = new_cache(
                self.causal.config,
                [
                    (k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1))
                    for k, v in cache_pairs(cache)
                ],
            )
        # The last output token is never an input: row i is the rest of its prompt and all of
        # its output but that token.
        seqs = [p[shared:] + o[:-1] for p, o in zip(prompts, outputs, strict=True)]
        width = max(len(s) for s in seqs)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        # Right padding: real tokens keep their positions and never attend to the padding.
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        attention = torch.zeros((len(seqs), shared + width), dtype=torch.long)
        rows_at: list[int] = []
        cols_at: list[int] = []
        for i, (s, p, n) in enumerate(zip(seqs, prompts, lengths, strict=True)):
            ids[i, : len(s)] = torch.tensor(s)
            attention[i, : shared + len(s)] = 1
            # The hidden state at position t predicts token t + 1: output token k is predicted
            # at position len(prompt) - 1 + k, which is column len(prompt) - 1 + k - shared.
            rows_at += [i] * n
            cols_at += range(len(p) - 1 - shared, len(p) - 1 - shared + n)
        self.model.train(checkpointed)  # (no dropout: HFModel.load refuses a model with any)
        try:
            hidden = body(
                input_ids=ids.to(device),
                attention_mask=attention.to(device),
                use_cache=cache is not None,
                **({self.cache_arg: cache} if cache is not None else {}),
            ).last_hidden_state
        finally:
            self.model.eval()
        picked = hidden[torch.tensor(rows_at, device=device), torch.tensor(cols_at, device=device)]
        del hidden, cache  # only the output positions' rows go on
        targets = torch.tensor([t for o in outputs for t in o], device=device)
        bitmask = torch.cat([m for m in masks if len(m)]).to(device)
        head_layer = self.causal.get_output_embeddings()
        lps, ents = [], []
        for at in range(0, len(targets), self.logit_chunk):
            part = slice(at, at + self.logit_chunk)
            args = (
                head_layer,
                picked[part],
                targets[part],
                bitmask[part],
                temperature,
                entropy_grad,
                top_p,
            )
            if torch.is_grad_enabled():  # recompute the chunk's logits in backward, keep none
                lp, ent = checkpoint(_chunk, *args, use_reentrant=False)
            else:
                lp, ent = _chunk(*args)
            lps.append(lp)
            ents.append(ent)
        logp, entropy = torch.cat(lps), torch.cat(ents)
        return list(logp.split(lengths)), list(entropy.split(lengths))

    def merged(self) -> Any:
        """The causal LM with its LoRA adapters merged in, as a copy (merging in place would
        round the base weights); the module itself without LoRA."""
        if not self.lora:
            return self.causal
        return copy.deepcopy(self.model).merge_and_unload()

    def save(self, directory: str | Path) -> Path:
        """Write the weights (safetensors; merged, under LoRA), config, tokenizer and
        :attr:`version` to ``directory``, the layout SGLang's ``/update_weights_from_disk`` and
        ``--policy hf:DIR`` load; return it."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        module = self.merged() if self.lora else self.model
        no_progress_bars()
        module.save_pretrained(str(directory), safe_serialization=True)
        if self.lora:  # the merged copy goes back to the system, not to the heap
            del module
            release_freed()
        self.tokenizer.save_pretrained(str(directory))
        (directory / VERSION_FILE).write_text(json.dumps({"version": self.version}) + "\n")
        return directory


def _load_trainable(
    module: torch.nn.Module, state: dict[str, torch.Tensor], trained: set[str] | None = None
) -> None:
    """Load the tensors that train (``trained``: default, ``module``'s own), all of them and
    nothing else, an unknown name included: under LoRA a copy's base tensors are the learner's
    own (``HFModel.copy``), so a stray base tensor in ``state`` would overwrite every version's
    base at once."""
    if trained is None:
        trained = {n for n, p in module.named_parameters() if p.requires_grad}
    missing = trained - set(state)
    if missing:
        raise ValueError(f"weights lack {len(missing)} trained tensors, e.g. {min(missing)}")
    frozen = set(state) - trained
    if frozen:
        raise ValueError(
            f"weights hold {len(frozen)} tensors that do not train, e.g. {min(frozen)}"
        )
    module.load_state_dict(state, strict=False)  # (every key is a trained tensor's: checked)


def _chunk(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    bitmask: torch.Tensor,
    temperature: float,
    entropy_grad: bool,
    top_p: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob of each target and entropy, for a chunk of output positions: logits exist only
    here, ``[chunk, vocab]``, under the mask (and nucleus) the sampler used."""
    z = masked_logits(head(hidden), temperature, bitmask, top_p)
    # log_softmax, not logsumexp: on a CPU, torch's logsumexp takes a slow path over the
    # FORBIDDEN logits, log_softmax and softmax do not (bench/results/policy/README.md).
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets[:, None])[:, 0]
    # H = -sum(p * log p) as a dot product (no [chunk, vocab] product tensor); a forbidden
    # token has p = 0 exactly, so its FORBIDDEN log-probability adds nothing. Without a
    # gradient unless the loss has an entropy term: a branch no backward pass runs would keep
    # its recomputed [chunk, vocab] tensors alive as long as the entropy is.
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -torch.linalg.vecdot(torch.softmax(z, dim=-1), logp_all)
    return logp, entropy


class _Reference:
    """An LoRA model's base policy: its own module with the adapters switched off while it
    scores. Used only from the learner's thread, between its own forward passes."""

    def __init__(self, model: HFModel) -> None:
        self.model = model

    def token_logprobs(
        self, *args: Any, **kw: Any
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        with self.model.model.disable_adapter():
            return self.model.token_logprobs(*args, **kw)
