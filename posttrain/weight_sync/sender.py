"""The policy side of a refit, one implementation for every policy backend.

A policy worker inherits :class:`WeightSender` and supplies what it holds: ``get_weights`` (the
Hugging Face-named state dict), ``get_logprobs`` (the probe's trainer side), ``rank``,
``device`` and :meth:`~WeightSender.refit_dtype`; a backend that can send less or send its own
tensors overrides :meth:`~WeightSender._refit_weights` or :meth:`~WeightSender._refit_source`.
The sender puts the weights into Ray's object store or shares CUDA IPC handles of them
(``put_weights``), or serves and feeds a broadcast group (``serve_weight_broadcast``,
``join_weight_broadcast``, ``broadcast_weights``). Each call scores the weight-sync probe in the
same call as it sends. The driver's side is ``weight_sync.refit``.
"""

from __future__ import annotations

from typing import Any

import torch

from posttrain.data.batch import TokenBatch
from posttrain.distributed.transport import object_store_put
from posttrain.weight_sync.broadcast import WeightBroadcast, serve_store
from posttrain.weight_sync.transport import CudaIpcWeights, gpu_uuid, node_ip


class WeightSender:
    """Base class of every policy worker: the refit calls the driver makes on the policy side."""

    rank: int
    device: torch.device
    _broadcast: WeightBroadcast | None = None  # the refit broadcast group (rank 0, once joined)
    _broadcast_store: Any = None
    _shared_weights: dict[str, torch.Tensor] | None = None  # the tensors of the last CUDA IPC refit

    # ------------------------------------------------------------------ what a backend implements
    def get_weights(self) -> dict[str, torch.Tensor]:
        """Current weights, Hugging Face names, CPU tensors."""
        raise NotImplementedError

    def get_logprobs(self, batch: TokenBatch, reference: bool = False, whole_vocab: bool = False) -> torch.Tensor:
        """``[B, L]`` float32 completion logprobs (``PolicyWorkerBase.get_logprobs``)."""
        raise NotImplementedError

    def refit_dtype(self) -> torch.dtype:
        """The dtype the engines hold their weights in (a broadcast converts to it as it packs)."""
        raise NotImplementedError

    def _refit_weights(self, on_device: bool = False) -> dict[str, torch.Tensor]:
        """What a refit sends: :meth:`get_weights` unless a backend can send less
        (``on_device``: it may leave them on the GPU, for CUDA IPC)."""
        return self.get_weights()

    def _refit_source(self) -> dict[str, torch.Tensor]:
        """What :meth:`broadcast_weights` sends, on any device and in any dtype (it converts
        as it packs): :meth:`_refit_weights` unless a backend can hand over its own tensors."""
        return self._refit_weights(on_device=True)

    # ------------------------------------------------------------------ the refit calls
    def _probe(self, probe: TokenBatch | None) -> torch.Tensor | None:
        """The trainer side of the weight-sync probe: ``[B, L]`` logprobs over the whole vocabulary."""
        return self.get_logprobs(probe, whole_vocab=True) if probe is not None else None

    def gpu_uuid(self) -> str | None:
        """The UUID of this worker's GPU (None on a CPU): see :func:`posttrain.weight_sync.transport.gpu_uuid`."""
        return gpu_uuid(self.device)

    def put_weights(self, probe: TokenBatch | None = None,
                    cuda_ipc: bool = False) -> tuple[list[Any], torch.Tensor | None]:
        """Refit without the driver: the weights of :meth:`get_weights` go into Ray's object
        store from here, and the driver hands their reference straight to the engines (it
        never deserializes them). With ``cuda_ipc`` (the engines share this worker's GPU) the
        weights stay on the GPU and only their CUDA IPC handles travel
        (:class:`~posttrain.weight_sync.transport.CudaIpcWeights`; kept alive here until the
        next refit); a backend whose refit weights are not on the GPU sends them as usual.

        Returns:
            ``([ref], probe logprobs)``: the reference wrapped in a list, so Ray passes it on
            instead of fetching it, and the trainer's ``[B, L]`` logprobs of ``probe`` (the
            weight-sync probe, in the same call) or None. Only rank 0's weights are
            meaningful (other ranks of a tensor-parallel group give ``{}``).
        """
        weights: Any = self._refit_weights(on_device=cuda_ipc)
        self._shared_weights = None  # the previous refit's IPC tensors: every engine has copied them
        if cuda_ipc and weights and all(t.is_cuda for t in weights.values()):
            self._shared_weights = weights
            weights = CudaIpcWeights.share(weights)
        return [object_store_put(weights)], self._probe(probe)

    def serve_weight_broadcast(self, timeout_s: float) -> tuple[str, int] | None:
        """Rank 0: serve the TCP store of a refit broadcast group (the engines join it) and
        return its ``(host, port)``; other ranks take no part in the broadcast (None).
        Then every member calls ``join_weight_broadcast`` at once."""
        if self.rank != 0:
            return None
        self._broadcast_store = serve_store(node_ip(), timeout_s)
        return node_ip(), self._broadcast_store.port

    def join_weight_broadcast(self, world_size: int, timeout_s: float) -> None:
        """Rank 0: become the sender (rank 0) of the group served by :meth:`serve_weight_broadcast`,
        with ``world_size - 1`` engines (they join at the same time); a no-op on other ranks.
        A group this worker had before (other engines) is released."""
        if self.rank != 0:
            return
        if self._broadcast is not None:
            self._broadcast.shutdown()
        self._broadcast = WeightBroadcast(self._broadcast_store, 0, world_size, self.device.type, timeout_s)

    def broadcast_weights(self, bucket_bytes: int,
                          probe: TokenBatch | None = None) -> tuple[torch.Tensor | None, int, int]:
        """Refit over the broadcast group: rank 0 sends the weights (Hugging Face names, in
        :meth:`refit_dtype`, a tied name once) in buckets of at most ``bucket_bytes``, while the
        engines receive (the driver calls them at the same time). Every rank must be called
        (a tensor-parallel model gathers its shards first).

        Returns:
            ``(probe logprobs, buckets, bytes)``: the trainer's ``[B, L]`` logprobs of ``probe``
            or None, and how many buckets and bytes were sent (0 and 0 on ranks other than 0).
        """
        weights = self._refit_source()
        buckets = sent = 0
        if self._broadcast is not None:  # rank 0
            plan = self._broadcast.send(weights, self.refit_dtype(), bucket_bytes)
            buckets, sent = len(plan.buckets), sum(bucket.nbytes for bucket in plan.buckets)
        del weights
        return self._probe(probe), buckets, sent
