"""Weights sent to SGLang servers without the disk: buckets, the update group, the tensor payload.

Torch is imported only when one of these runs (the client imports this module lazily too).

**Buckets.** ``/update_weights_from_distributed`` with ``load_format: "flattened_bucket"``
(sgl-project/sglang, python/sglang/srt/weight_sync/tensor_bucket.py, FlattenedTensorBucket, and
the model runner's bucketed receive) takes one broadcast per call: the bucket's tensors, in the
order of the request's ``names``, each flattened and viewed as bytes (``uint8``), concatenated.
The server allocates the same bytes from the request's ``names``/``dtypes``/``shapes``, receives
the broadcast from rank 0 and cuts it back up. :func:`buckets` groups named tensors into buckets
of at most ``limit`` bytes (a tensor larger than that is a bucket alone); :func:`flatten` and
:func:`unflatten` are the two directions of that layout.

**The group.** ``/init_weights_update_group`` ``{master_address, master_port, rank_offset,
world_size, group_name, backend}`` (io_struct.py, InitWeightsUpdateGroupReqInput) makes each
server rank join a torch.distributed group at ``tcp://master_address:master_port`` with rank
``rank_offset + its tp rank`` (python/sglang/srt/utils, init_custom_process_group: a c10d TCP
rendezvous, the store prefixed by ``group_name``, then torch's own process-group helper, which
prefixes it again by ``group_name/`` and by the device, ``cpu/`` for gloo and ``cuda/`` for
NCCL). The learner is rank 0 and hosts the store. :class:`UpdateGroup` is the learner's side:
the backend object over a store laid out with the same prefixes, so a server that joins through
torch's helper and this learner meet, without touching torch's global registry of groups (a
learner has no default process group, and a test runs both sides in one process).
"""

from __future__ import annotations

import base64
import datetime
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

BUCKET_BYTES = 512 << 20  # per broadcast: slime and verl send buckets of this order
DTYPE_NAMES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8", "bool")


def checkpoint_tensors(model: Any) -> list[tuple[str, torch.Tensor]]:
    """The tensors an :class:`policy.hf.model.HFModel`'s ``save`` writes, by the names it writes
    them under (merged, under LoRA; a tensor tied to an earlier one, as a tied output head, once):
    what an SGLang server loads by name from ``/update_weights_from_distributed`` or
    ``/update_weights_from_tensor``."""
    import copy

    module = model.model
    if model.lora:  # merge into a copy: merging in place would round the base weights
        module = copy.deepcopy(model.model).merge_and_unload()
    out, seen = [], set()
    for name, tensor in module.state_dict().items():
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        out.append((name, tensor.detach()))
    return out


def dtype_name(tensor: torch.Tensor) -> str:
    """The dtype as SGLang's requests spell it (``"bfloat16"``; the server reads
    ``getattr(torch, name)``)."""
    return str(tensor.dtype).removeprefix("torch.")


def buckets(
    named: Iterable[tuple[str, torch.Tensor]], limit: int = BUCKET_BYTES
) -> list[list[tuple[str, torch.Tensor]]]:
    """``named`` in order, cut into runs of at most ``limit`` bytes each."""
    out: list[list[tuple[str, torch.Tensor]]] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if not out or (size + nbytes > limit and out[-1]):
            out.append([])
            size = 0
        out[-1].append((name, tensor))
        size += nbytes
    return out


def flatten(bucket: Sequence[tuple[str, torch.Tensor]]) -> torch.Tensor:
    """The bucket's bytes, tensor after tensor (the flattened_bucket layout)."""
    import torch

    return torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for _, t in bucket])


def unflatten(
    flat: torch.Tensor, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
) -> list[tuple[str, torch.Tensor]]:
    """The tensors a flattened bucket holds, given the request's names, dtypes and shapes."""
    import torch

    out, start = [], 0
    for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
        kind = getattr(torch, dtype)
        numel = 1
        for d in shape:
            numel *= int(d)
        nbytes = numel * torch.empty((), dtype=kind).element_size()
        out.append((name, flat[start : start + nbytes].view(kind).reshape(list(shape)).clone()))
        start += nbytes
    if start != flat.numel():
        raise ValueError(f"the bucket holds {flat.numel()} bytes; the tensors named need {start}")
    return out


def bucket_bytes(dtypes: Sequence[str], shapes: Sequence[Sequence[int]]) -> int:
    """The bytes a bucket of these dtypes and shapes holds (a ValueError for an unknown dtype)."""
    import torch

    total = 0
    for dtype, shape in zip(dtypes, shapes, strict=True):
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"unknown dtype {dtype!r}")
        numel = 1
        for d in shape:
            numel *= int(d)
        total += numel * torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return total


def group_store(
    host: str, port: int, rank: int, world_size: int, group_name: str, device: str, timeout: float
) -> Any:
    """The c10d store of ``group_name`` as torch's helper lays it out for ``device`` (see the
    module docstring); rank 0 hosts the TCP store (an OSError when the port is taken)."""
    import torch.distributed as dist

    wait = datetime.timedelta(seconds=timeout)
    tcp = dist.TCPStore(host, port, world_size, rank == 0, timeout=wait, wait_for_workers=False)
    named = dist.PrefixStore(f"{group_name}/", dist.PrefixStore(group_name, tcp))
    return tcp, dist.PrefixStore(f"{device}/", named)


class UpdateGroup:
    """The learner's side (rank 0) of a weight-update group of ``world_size`` ranks.

    ``backend`` is ``"gloo"`` (CPU tensors) or ``"nccl"`` (CUDA tensors). :meth:`broadcast`
    blocks for at most ``timeout`` seconds (the backend's own bound; the client also abandons
    the thread at its deadline). Making one hosts the store (an OSError when the port is taken);
    :meth:`join` forms the group while the servers join."""

    def __init__(
        self, host: str, port: int, world_size: int, group_name: str, backend: str, timeout: float
    ) -> None:
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be gloo or nccl, got {backend!r}")
        self.host, self.port, self.world_size = host, port, world_size
        self.group_name, self.backend, self.timeout = group_name, backend, timeout
        self._device = "cpu" if backend == "gloo" else "cuda"
        self._tcp, self._store = group_store(
            host, port, 0, world_size, group_name, self._device, timeout
        )
        self._pg: Any = None

    def join(self) -> None:
        """Wait until every rank has joined (blocks; at most ``timeout`` seconds)."""
        import torch.distributed as dist

        wait = datetime.timedelta(seconds=self.timeout)
        if self.backend == "gloo":
            self._pg = dist.ProcessGroupGloo(self._store, 0, self.world_size, wait)
        else:  # pragma: no cover - needs a GPU
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = wait
            self._pg = dist.ProcessGroupNCCL(self._store, 0, self.world_size, options)

    def broadcast(self, flat: torch.Tensor) -> None:
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.timeout = datetime.timedelta(seconds=self.timeout)
        self._pg.broadcast([flat], options).wait()

    def close(self) -> None:
        """Let the group go. A broken group's backend waits out its pending work (up to
        ``timeout``) when it is destroyed: that happens on a thread of its own, not here."""
        if self._pg is None:
            return
        if self.backend == "nccl":  # pragma: no cover - needs a GPU
            abort = getattr(self._pg, "abort", None)
            if callable(abort):
                abort()
        box = [self._pg]
        self._pg = None
        threading.Thread(target=box.clear, name="weight-group-close", daemon=True).start()
        self._tcp = None


def serialize_named_tensors(named: Sequence[tuple[str, torch.Tensor]]) -> str:
    """One entry of ``/update_weights_from_tensor``'s ``serialized_named_tensors``: the list of
    ``(name, tensor)`` pickled with torch's multiprocessing reductions (the tensors' memory is
    shared, not copied: CUDA IPC handles for GPU tensors) and base64-encoded, as SGLang's
    MultiprocessingSerializer.serialize(..., output_str=True) makes it
    (python/sglang/srt/utils, MultiprocessingSerializer; the server decodes entry tp_rank)."""
    import io
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers the tensor reductions)

    buffer = io.BytesIO()
    ForkingPickler(buffer).dump([(name, t.detach()) for name, t in named])
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def deserialize_named_tensors(text: str) -> list[tuple[str, torch.Tensor]]:
    """The other direction (what the server does with its entry)."""
    import pickle

    import torch.multiprocessing  # noqa: F401

    return list(pickle.loads(base64.b64decode(text)))
