"""Refit over a collective: the policy worker broadcasts its weights to every engine, bucket by bucket.

When the engines do not hold the policy's GPU, a refit through Ray's object store copies the
weights to host memory, through the store and back (2.8 s for a 0.39B model in bf16 on an
H100). A broadcast sends them device to device instead: NCCL between GPUs, gloo between
CPUs. The weights go in buckets of at most ``bucket_bytes`` (a tensor larger than that goes
alone), so neither side holds more than one extra bucket at a time, and each engine loads a
bucket's tensors while the next one is on its way.

The process group is one of its own, built on a TCP store that the sender serves: torch's
default group belongs to whoever set it up in that process (vLLM's engine, Megatron's tensor
parallelism), so ``init_process_group`` cannot be used. Rank 0 sends (the policy); the engines
are ranks 1..N. Each refit starts with the sender writing its :class:`BucketPlan` (names,
shapes, dtypes, tied names) into the store, where the receivers read it: they need not know
the sender's model, and a name or shape that does not fit is found before any tensor loads.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from posttrain.weight_sync.transport import tensor_identity

# Byte offsets of tensors in a bucket are multiples of this, so a slice of the bucket's
# uint8 buffer can be viewed as any dtype (a view must start on a multiple of its element size).
ALIGN = 16
STORE_PREFIX = "posttrain/weight_broadcast"
# How long a member waits for the others (to join, or in a collective) before it raises: a
# worker that died mid-refit fails the refit after this, instead of hanging the run.
BROADCAST_TIMEOUT_S = 600.0


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class TensorSlot:
    """Where one named tensor lies in its bucket.

    Attributes:
        name: Hugging Face parameter name.
        shape: its shape.
        dtype: torch dtype name of the bytes sent (the engine's dtype), e.g. "bfloat16".
        offset: bytes from the start of the bucket.
        alias_of: for a tied name (an output embedding tied to the input one), the name whose
            bytes it shares: it takes no bytes of its own, and the receiver yields the same
            tensor under both names.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int
    alias_of: str | None = None

    @property
    def nbytes(self) -> int:
        return 0 if self.alias_of else torch.Size(self.shape).numel() * getattr(torch, self.dtype).itemsize

    def view(self, bucket: torch.Tensor) -> torch.Tensor:
        """This tensor as a view of ``bucket`` (the received ``[nbytes]`` uint8 buffer)."""
        dtype = getattr(torch, self.dtype)
        size = torch.Size(self.shape).numel() * dtype.itemsize
        return bucket[self.offset:self.offset + size].view(dtype).view(self.shape)


@dataclass(frozen=True)
class Bucket:
    """One broadcast: ``nbytes`` bytes holding ``slots`` (aliases of its tensors included)."""

    nbytes: int
    slots: tuple[TensorSlot, ...]


@dataclass(frozen=True)
class BucketPlan:
    """How a refit's weights are split into buckets, in the order the sender's state dict names them."""

    buckets: tuple[Bucket, ...]

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every name sent (tied ones included) and its shape."""
        return {slot.name: slot.shape for bucket in self.buckets for slot in bucket.slots}


def plan_buckets(weights: dict[str, torch.Tensor], dtype: torch.dtype, bucket_bytes: int) -> BucketPlan:
    """Split ``weights`` into consecutive buckets of at most ``bucket_bytes`` bytes each in ``dtype``.

    A tensor larger than ``bucket_bytes`` is a bucket of its own. Names that share one tensor
    (same storage, offset and shape: a tied embedding) are sent once; the later names are
    aliases of the first, in the same bucket.

    Raises:
        ValueError: ``bucket_bytes`` < 1.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes}: expected at least 1")
    type_name = str(dtype).removeprefix("torch.")
    groups: list[list[TensorSlot]] = [[]]
    sizes = [0]
    placed: dict[tuple[int, int, tuple[int, ...]], tuple[int, TensorSlot]] = {}  # tensor -> (bucket, slot)
    for name, tensor in weights.items():
        shape = tuple(tensor.shape)
        key = tensor_identity(tensor)
        if key in placed:  # a tied name: the bytes are in that bucket already
            index, original = placed[key]
            groups[index].append(TensorSlot(name, shape, type_name, original.offset, alias_of=original.name))
            continue
        nbytes = tensor.numel() * dtype.itemsize
        if groups[-1] and sizes[-1] + nbytes > bucket_bytes:
            groups.append([])
            sizes.append(0)
        slot = TensorSlot(name, shape, type_name, sizes[-1])
        groups[-1].append(slot)
        placed[key] = (len(groups) - 1, slot)
        sizes[-1] = _aligned(sizes[-1] + nbytes)
    return BucketPlan(tuple(Bucket(size, tuple(group)) for size, group in zip(sizes, groups, strict=True) if group))


def serve_store(host: str, timeout_s: float) -> dist.TCPStore:
    """A TCP store served by this process (the sender) on a free port of ``host`` (``.port``)."""
    return dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))


def connect_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """A client of the store at ``host:port`` (a receiver)."""
    return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))


class Reception:
    """One refit's weights as they arrive: :attr:`plan` at once, then ``(name, tensor)`` pairs
    bucket by bucket as the iteration asks for them.

    A receiver that stops early must still take every bucket, or the sender waits forever:
    :meth:`close` (also called on leaving a ``with`` block) receives what is left and drops it.
    The tensors are views of a bucket's buffer, valid until the caller lets go of them.
    """

    def __init__(self, broadcast: WeightBroadcast, plan: BucketPlan):
        self.broadcast, self.plan = broadcast, plan
        self._next = 0  # the next bucket to receive
        self._failed = False

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        while self._next < len(self.plan.buckets):
            bucket = self.plan.buckets[self._next]
            flat = self._receive(bucket)
            for slot in bucket.slots:
                yield slot.name, slot.view(flat)

    def _receive(self, bucket: Bucket) -> torch.Tensor:
        self._next += 1
        flat = torch.empty(bucket.nbytes, dtype=torch.uint8, device=self.broadcast.device)
        try:
            self.broadcast.broadcast(flat)
        except BaseException:
            self._failed = True  # the group is broken: waiting for more buckets would only time out again
            raise
        return flat

    def close(self) -> None:
        """Receive and drop the buckets not yet taken (nothing after a failed receive)."""
        while not self._failed and self._next < len(self.plan.buckets):
            self._receive(self.plan.buckets[self._next])

    def __enter__(self) -> Reception:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WeightBroadcast:
    """This process's member of the refit broadcast group.

    Args:
        store: the sender's :func:`serve_store`, or a receiver's :func:`connect_store` to it.
        rank: 0 for the sender (the policy), 1..N for the engines.
        world_size: 1 + the number of engines.
        device: "cuda" (NCCL; this process's current GPU) or "cpu" (gloo).
        timeout_s: how long a collective waits for the others before it raises.

    Every member must construct it at the same time (gloo connects all ranks in the constructor).
    """

    def __init__(self, store: dist.Store, rank: int, world_size: int, device: str,
                 timeout_s: float = BROADCAST_TIMEOUT_S):
        prefixed = dist.PrefixStore(STORE_PREFIX, store)
        timeout = timedelta(seconds=timeout_s)
        self.store, self.rank, self.world_size = store, rank, world_size
        self.group: Any  # a ProcessGroupNCCL or ProcessGroupGloo (torch's stubs give them no collectives)
        if device == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.device = torch.device("cuda", torch.cuda.current_device())
            self.group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
        else:
            self.device = torch.device("cpu")
            self.group = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        self.refits = 0  # refits so far; sender and receivers count in step

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast ``tensor`` in place from rank 0 to the others."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()

    def _plan_key(self, refit: int) -> str:
        return f"{STORE_PREFIX}/plan/{refit}"

    def send(self, weights: dict[str, torch.Tensor], dtype: torch.dtype, bucket_bytes: int) -> BucketPlan:
        """Rank 0: broadcast ``weights`` (any device and dtype; sent as ``dtype``) in buckets.

        Returns the plan it sent (the receivers read it from the store first).
        """
        plan = plan_buckets(weights, dtype, bucket_bytes)
        if self.refits > 0:  # every receiver has finished the refit before the previous one
            self.store.delete_key(self._plan_key(self.refits - 1))
        self.store.set(self._plan_key(self.refits), pickle.dumps(plan))  # type: ignore[arg-type]  # takes bytes
        self.refits += 1
        for bucket in plan.buckets:
            flat = torch.empty(bucket.nbytes, dtype=torch.uint8, device=self.device)
            for slot in bucket.slots:
                if slot.alias_of is None:
                    slot.view(flat).copy_(weights[slot.name])  # converts to the engine's dtype here, a tensor at a time
            self.broadcast(flat)
        return plan

    def receive(self) -> Reception:
        """Ranks 1..N: the next refit's weights, as a :class:`Reception` (waits for the plan)."""
        plan = pickle.loads(self.store.get(self._plan_key(self.refits)))
        self.refits += 1
        return Reception(self, plan)

    def shutdown(self) -> None:
        """Release the group (its NCCL communicator or gloo connections)."""
        if hasattr(self.group, "shutdown"):
            self.group.shutdown()
