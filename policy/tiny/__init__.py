"""The tiny torch policy: a byte-level transformer on CPU with grammar-constrained sampling."""

from policy.tiny.adapter import DEFAULT_MAX_TOKENS, TinyModel, TinyPolicy
from policy.tiny.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from policy.tiny.model import TinyConfig, TinyTransformer

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "CheckpointError",
    "TinyConfig",
    "TinyModel",
    "TinyPolicy",
    "TinyTransformer",
    "load_checkpoint",
    "save_checkpoint",
]
