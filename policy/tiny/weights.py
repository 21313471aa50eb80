"""The tiny model's weights on disk: weights, network config, tokenizer and version in one file.

The file is a ``torch.save`` of ``{"meta": <JSON text>, "state_dict": {...}}``, loaded with
``weights_only=True`` (no pickled code runs). ``meta`` is a :class:`CheckpointMeta`, checked on
load against this code's tokenizer and the weights' shapes, so a wrong, truncated or corrupt
file fails with an error that names the file and what is wrong with it.

This module knows the network only (``TinyTransformer``), not the policy around it, so the
policy (``adapter``) imports it and nothing imports back: ``policy.tiny.checkpoint`` is the
convenience of both together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec
import torch

from policy.tiny.model import TinyConfig, TinyTransformer
from policy.tokenizer import BOS, EOS, PAD, VOCAB_SIZE

FORMAT = 1


class TokenizerSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the token ids mean: the weights are useless under any other mapping."""

    kind: Literal["bytes"] = "bytes"
    vocab_size: int = VOCAB_SIZE
    pad: int = PAD
    bos: int = BOS
    eos: int = EOS


class CheckpointMeta(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    format: int = FORMAT
    config: TinyConfig
    tokenizer: TokenizerSpec = TokenizerSpec()
    version: int = 0


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable, corrupt, or does not fit this code."""


def snapshot(net: TinyTransformer) -> dict[str, torch.Tensor]:
    """A copy of the weights, to write while the network goes on changing."""
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def save_weights(
    config: TinyConfig, version: int, state: dict[str, torch.Tensor], path: str | Path
) -> Path:
    """Write atomically (a crash never leaves half a checkpoint under the final name)."""
    from collective.base.outputs import save_torch

    path = Path(path)
    meta = CheckpointMeta(config=config, version=version)
    save_torch({"meta": msgspec.json.encode(meta).decode(), "state_dict": state}, path)
    return path


def load_weights(path: str | Path) -> tuple[TinyTransformer, int]:
    """The network and its version, checked (see the module's docstring)."""
    from collective.base.outputs import InputError, check_input

    path = Path(path)
    try:
        check_input(path, "checkpoint")  # a FIFO would block torch.load forever
    except InputError as e:
        raise CheckpointError(str(e)) from None
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many kinds for a bad file; all mean the same here
        raise CheckpointError(
            f"{path}: not a readable tiny-policy checkpoint (truncated or corrupt: {e})"
        ) from None
    if not isinstance(blob, dict) or not {"meta", "state_dict"} <= blob.keys():
        raise CheckpointError(f"{path}: not a tiny-policy checkpoint (no meta and state_dict)")
    try:
        meta = msgspec.json.decode(blob["meta"], type=CheckpointMeta)
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError) as e:
        raise CheckpointError(f"{path}: invalid checkpoint metadata: {e}") from None
    if meta.format != FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {meta.format}, this code reads {FORMAT}")
    if meta.tokenizer != TokenizerSpec():
        raise CheckpointError(
            f"{path}: the weights were trained with tokenizer {meta.tokenizer}, "
            f"this code has {TokenizerSpec()}"
        )
    net = TinyTransformer(meta.config)
    try:
        net.load_state_dict(blob["state_dict"], strict=True)
    except (RuntimeError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{path}: weights do not match config {meta.config}: {e}") from None
    for name, p in net.named_parameters():
        if not bool(torch.isfinite(p).all()):
            raise CheckpointError(f"{path}: weight {name} contains NaN or infinity")
    return net, meta.version
