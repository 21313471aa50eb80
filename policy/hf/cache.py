"""The model's own KV cache, as ``transformers`` 4.5x and 5.x keep it: made empty or from
(keys, values) pairs, and read back as pairs (the shared prompt heads and the decoder's prefill
pass them between a model forward and the next)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def new_cache(config: Any, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]] = ()) -> Any:
    """A KV cache, empty or holding ``pairs`` (one (keys, values) per layer). The tensors given
    are never written: a cache's update concatenates into new ones."""
    from transformers import DynamicCache

    if pairs:
        return DynamicCache(list(pairs))
    try:
        return DynamicCache(config=config)
    except TypeError:  # transformers 4.x takes no config
        return DynamicCache()


def cache_pairs(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) of each layer of a dynamic cache (transformers 4.5x and 5.x)."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))
