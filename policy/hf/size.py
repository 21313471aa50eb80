"""What a model directory holds, read without loading it: its parameters (from the safetensors
headers: exact, and no tensor read), its shape (``config.json``) and what LoRA would add. The
memory guard (``collective.rl.checks``) counts a run's model, training state and served copies
from these before any weight is loaded.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import msgspec

#: The largest header a safetensors file may have (the format's own limit): a length field
#: beyond it is a damaged file, refused before it is read.
MAX_HEADER = 100_000_000


class ModelSize(msgspec.Struct, frozen=True, kw_only=True):
    parameters: int  # every stored tensor's elements
    linear: list[tuple[int, int]]  # (out, in) of each layer's weight matrix: LoRA's targets
    layers: int
    hidden: int
    vocab: int
    tied: bool  # the output head is the embedding (a decoder still keeps a copy of each)

    def adapters(self, rank: int) -> int:
        """LoRA's parameters at ``rank`` on every linear layer but the head (``all-linear``,
        as ``HFModel.load`` asks peft): ``rank x (in + out)`` each."""
        return sum(rank * (i + o) for o, i in self.linear) if rank > 0 else 0


def _header(path: Path) -> dict[str, dict]:
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER:
            raise ValueError(f"{path.name}: a header of {n:,} bytes (at most {MAX_HEADER:,})")
        return json.loads(f.read(n))


def model_size(directory: str | Path) -> ModelSize:
    """The size of the model in ``directory`` (ValueError, one line, where it cannot be read)."""
    root = Path(directory)
    files = sorted(root.glob("*.safetensors"))
    try:
        config = json.loads((root / "config.json").read_text())
        tensors = {k: v for f in files for k, v in _header(f).items() if k != "__metadata__"}
    except (OSError, ValueError, struct.error) as e:
        raise ValueError(f"{root}: cannot read its size ({type(e).__name__}: {e})") from None
    if not tensors:
        raise ValueError(f"{root}: no safetensors weights to size")
    count = 0
    linear = []
    for name, t in tensors.items():
        count += math.prod(int(d) for d in t["shape"])
        if ".layers." in name and name.endswith(".weight") and len(t["shape"]) == 2:
            linear.append((int(t["shape"][0]), int(t["shape"][1])))
    tied = bool(config.get("tie_word_embeddings", False))
    hidden, vocab = int(config["hidden_size"]), int(config["vocab_size"])
    return ModelSize(
        parameters=count,
        linear=linear,
        layers=int(config["num_hidden_layers"]),
        hidden=hidden,
        vocab=vocab,
        tied=tied,
    )
