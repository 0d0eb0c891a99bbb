"""The engine side of a refit, one implementation for every engine.

An engine worker inherits :class:`WeightReceiver` and supplies four things: the names and
shapes it takes (:meth:`~WeightReceiver.refit_shapes`), how it copies tensors in
(:meth:`~WeightReceiver._load_weights`), its ``weight_version`` and its ``score``. The
receiver owns the rest: opening CUDA IPC handles, joining the policy's broadcast group, and
one strictness for every transport and engine: a refit that misses a tensor, brings one the
engine does not have, or has a shape that differs is refused in one line before any tensor
loads, and the engine keeps its old weights and version (:func:`check_refit`). Each answer is
a :class:`~posttrain.weight_sync.receipt.RefitReceipt` read back from the engine itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager

import torch

from posttrain.errors import StaleWeightsError
from posttrain.weight_sync.broadcast import WeightBroadcast, connect_store
from posttrain.weight_sync.receipt import ProbeRequest, RefitReceipt, refit_receipt
from posttrain.weight_sync.transport import CudaIpcWeights, materialize

Shapes = Mapping[str, tuple[int, ...]]


def _first(names: list[str]) -> str:
    return f"{names[:3]}{'...' if len(names) > 3 else ''}"


def check_refit(expected: Shapes, incoming: Shapes, rank: int, version: int) -> None:
    """Refuse a refit whose tensors are not exactly the engine's: every name of ``expected``
    with its shape, and nothing else.

    Args:
        expected: the engine's Hugging Face names and shapes (``WeightReceiver.refit_shapes``).
        incoming: the refit's names and shapes (a state dict's, or a broadcast plan's).
        rank: the engine's rank, for the message.
        version: the weight version being loaded, for the message.

    Raises:
        StaleWeightsError: a name missing or unknown (the first few of each), or the first
            shape that differs.
    """
    missing = sorted(set(expected) - set(incoming))
    unknown = sorted(set(incoming) - set(expected))
    if missing or unknown:
        raise StaleWeightsError(f"generation worker {rank} cannot load weight version {version}: "
                                f"missing {_first(missing)}, unknown {_first(unknown)}")
    wrong = [name for name, shape in incoming.items() if tuple(expected[name]) != tuple(shape)]
    if wrong:
        raise StaleWeightsError(f"generation worker {rank} cannot load weight version {version}: "
                                f"{wrong[0]} is {list(incoming[wrong[0]])}, the model's is {list(expected[wrong[0]])}")


class WeightReceiver:
    """Base class of every engine worker: the three refit calls the driver makes
    (``weight_sync.refit``), over the hooks an engine implements.

    Subclasses set ``rank`` and implement :meth:`refit_shapes`, :meth:`_load_weights`,
    :meth:`refit_device`, ``weight_version()`` and ``score(...)``; an engine that must be
    awake to load (vLLM's sleep mode) overrides :meth:`_loading`.
    """

    rank: int
    _broadcast: WeightBroadcast | None = None  # the policy's broadcast group, once joined

    # ------------------------------------------------------------------ what an engine implements
    def refit_shapes(self) -> Shapes:
        """Every tensor a refit must bring, by Hugging Face name, with its shape."""
        raise NotImplementedError

    def _load_weights(self, tensors: Iterator[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy ``tensors`` (checked against :meth:`refit_shapes` already) into the model and
        make ``version`` the engine's weight version."""
        raise NotImplementedError

    def refit_device(self) -> str:
        """The torch device type the engine's weights live on ("cpu" or "cuda"): a broadcast's buffers go there."""
        raise NotImplementedError

    def weight_version(self) -> int:
        """The weight version the engine generates with now, read from the engine itself."""
        raise NotImplementedError

    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float) -> list[list[float]]:
        """Teacher-forced logprobs of ``completions`` at ``temperature``, one row per completion
        (``Generation.score``): the probe's engine side after a refit."""
        raise NotImplementedError

    def _loading(self) -> AbstractContextManager[None]:
        """Held around a load and the probe scored after it (default: nothing to do)."""
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ the refit calls
    def update_weights(self, weights: dict[str, torch.Tensor] | CudaIpcWeights, version: int,
                       probe: ProbeRequest | None = None) -> RefitReceipt:
        """Load the policy's weights in place (a state dict with Hugging Face names, or CUDA
        IPC handles of the policy's GPU tensors); answer with the version read back and
        ``probe`` scored under the new weights.

        Raises:
            StaleWeightsError: :func:`check_refit` refused the tensors; nothing was loaded.
        """
        with self._loading():
            tensors = materialize(weights)
            check_refit(self.refit_shapes(), {name: tuple(t.shape) for name, t in tensors.items()},
                        self.rank, version)
            self._load_weights(iter(tensors.items()), version)
            del tensors
            return refit_receipt(self, probe)

    def join_weight_broadcast(self, host: str, port: int, world_size: int, timeout_s: float) -> None:
        """Join the policy's refit broadcast group served at ``host:port`` as rank ``1 + rank``."""
        store = connect_store(host, port, timeout_s)
        self._broadcast = WeightBroadcast(store, 1 + self.rank, world_size, self.refit_device(), timeout_s)

    def receive_weights(self, version: int, probe: ProbeRequest | None = None) -> RefitReceipt:
        """Load the weights the policy broadcasts now, bucket by bucket as they arrive (names
        and shapes are checked from the sender's plan before the first bucket loads), then
        answer as :meth:`update_weights` does.

        Raises:
            StaleWeightsError: as :meth:`update_weights` (every bucket is still received, so
                the sender is not left waiting).
            RuntimeError: no broadcast group was joined.
        """
        if self._broadcast is None:
            raise RuntimeError(f"generation worker {self.rank}: receive_weights before join_weight_broadcast")
        with self._loading():
            with self._broadcast.receive() as reception:
                check_refit(self.refit_shapes(), reception.plan.shapes, self.rank, version)
                self._load_weights(iter(reception), version)
            return refit_receipt(self, probe)
