"""Checkpoints of the tiny policy: its weights file (``policy.tiny.weights``) read into, or
written from, a :class:`TinyModel`."""

from __future__ import annotations

from pathlib import Path

from policy.tiny.adapter import TinyModel
from policy.tiny.weights import CheckpointError, CheckpointMeta, TokenizerSpec

__all__ = [
    "CheckpointError",
    "CheckpointMeta",
    "TokenizerSpec",
    "load_checkpoint",
    "save_checkpoint",
]


def save_checkpoint(model: TinyModel, path: str | Path) -> Path:
    return model.save_to(Path(path))


def load_checkpoint(path: str | Path, **model_kw: object) -> TinyModel:
    return TinyModel.load(path, **model_kw)
