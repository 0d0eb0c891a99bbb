"""The one refit: the policy's weights into the engines, checked on arrival.

:func:`refit` is the entry every loop calls after a train step. It picks the transport
(:func:`refit_transport`), moves the weights without the driver holding them, insists that
the engines read back the trainer's version, and (with a probe) that they now score like
the trainer. Both sides are typed by what the refit needs of them: :class:`RefitSource` (the
driver's policy, ``models.policy.lm_policy.Policy``) and :class:`RefitTarget` (the driver's
engine group, ``models.generation.engine_group.EngineGroup``); a test double implements the same
protocol.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from posttrain.data.batch import TokenBatch
from posttrain.distributed.worker_group import Pending, wait_both
from posttrain.errors import StaleWeightsError
from posttrain.weight_sync.broadcast import BROADCAST_TIMEOUT_S
from posttrain.weight_sync.probe import RefitProbe
from posttrain.weight_sync.receipt import ProbeRequest, RefitReceipt
from posttrain.weight_sync.transport import Transport, choose_refit_transport


class RefitTarget(Protocol):
    """The engines, as a refit reaches them from the driver."""

    @property
    def refit_setting(self) -> str:
        """``generation.refit_transport``: "auto" or "object_store"; "in_place" for engines that
        read the policy's own weights (nothing is sent)."""
        ...

    @property
    def refit_bucket_bytes(self) -> int:
        """The largest bucket of a broadcast refit, bytes."""
        ...

    @property
    def num_engines(self) -> int:
        """Engines in the group (ranks 1..N of a broadcast group)."""
        ...

    def gpu_uuids(self) -> list[str | None]:
        """Each engine's GPU (None: a CPU), in rank order."""
        ...

    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float) -> list[list[float]]:
        """Teacher-forced logprobs, sharded over the engines (the probe asks when not handed rows)."""
        ...

    def update_weights(self, weights: Any, version: int, probe: ProbeRequest | None = None) -> RefitReceipt:
        """Load ``weights`` (an object-store reference, or a state dict) in every engine; one receipt."""
        ...

    def start_joining_broadcast(self, host: str, port: int, world_size: int, timeout_s: float) -> Pending[None]:
        """Every engine joins the policy's broadcast group (ranks 1..N), started, not waited for."""
        ...

    def start_receiving(self, version: int, probe: ProbeRequest | None = None) -> Pending[RefitReceipt]:
        """Every engine loads the broadcast that starts now, started, not waited for; one receipt."""
        ...


class RefitSource(Protocol):
    """The policy, as a refit reads it from the driver."""

    @property
    def weight_version(self) -> int:
        """The trainer's weight version: the one the engines must read back after the refit."""
        ...

    #: the engine group the policy's broadcast group was set up with (None: none yet)
    broadcast_peer: RefitTarget | None
    #: (buckets, bytes) of the last broadcast refit
    last_broadcast: tuple[int, int] | None

    def gpu_uuid(self) -> str | None:
        """Rank 0's GPU (None: a CPU)."""
        ...

    def get_logprobs(self, batch: TokenBatch, reference: bool = False, whole_vocab: bool = False) -> torch.Tensor:
        """``[B, L]`` float32 logprobs (the probe's trainer side when the send did not score it)."""
        ...

    def put_weights(self, probe: TokenBatch | None = None, cuda_ipc: bool = False) -> tuple[Any, torch.Tensor | None]:
        """``(object-store reference of the weights, the trainer's probe logprobs or None)``."""
        ...

    def serve_weight_broadcast(self, timeout_s: float) -> tuple[str, int]:
        """Rank 0 serves a broadcast group's store: its ``(host, port)``."""
        ...

    def start_joining_broadcast(self, world_size: int, timeout_s: float) -> Pending[None]:
        """Rank 0 joins the group it serves as the sender (rank 0), started, not waited for."""
        ...

    def start_broadcast(self, bucket_bytes: int,
                        probe: TokenBatch | None = None) -> Pending[tuple[torch.Tensor | None, int, int]]:
        """Rank 0 sends; ``(trainer probe logprobs or None, buckets, bytes)`` when waited for."""
        ...


def refit_transport(policy: RefitSource, engines: RefitTarget) -> Transport:
    """How a refit reaches ``engines`` (:func:`~posttrain.weight_sync.transport.choose_refit_transport`
    of their setting and of the GPUs; none is asked for under ``object_store``)."""
    if engines.refit_setting in ("object_store", "in_place"):
        return engines.refit_setting  # type: ignore[return-value]
    return choose_refit_transport(engines.refit_setting, policy.gpu_uuid(), engines.gpu_uuids())


def refit(policy: RefitSource, engines: RefitTarget, probe: RefitProbe | None = None,
          transport: Transport | None = None) -> dict[str, float]:
    """Copy the policy's weights into the engines, check the versions agree, and (with a
    ``probe``) check that the engines now score like the trainer.

    The weights never pass through the driver (``transport``, default :func:`refit_transport`):
    when every engine holds the policy's GPU, only CUDA IPC handles travel and the engines
    copy device to device; engines that read the policy's own weights (``in_place``: the megatron
    engine colocated with a Megatron policy) are sent nothing and only publish the version;
    otherwise the policy worker broadcasts them to the engines (NCCL
    between GPUs, gloo between CPUs), or, where neither can be used, puts them into Ray's
    object store and the driver passes the reference on. The trainer scores the probe in the
    same call as it sends; the engines read their version back and score the probe in the same
    call as they load (``RefitReceipt``): one exchange per side, and over a broadcast the two
    score at once.

    Returns:
        The probe's ``train/refit_logprob_error`` and ``train/refit_token_mult_prob_error``
        (empty without a probe).

    Raises:
        StaleWeightsError: an engine refused the weights (a name or shape that is not its own),
            or reports a different weight version than the trainer (a refit that did not
            arrive: generation would sample from stale weights).
        RefitProbeError: the probe error is over its bound (stale, partial or misnamed weights).
    """
    version = policy.weight_version
    transport = transport or refit_transport(policy, engines)
    probe_batch, probe_request = (probe.batch, probe.request) if probe is not None else (None, None)
    if transport == "broadcast":
        trainer_probe, receipt = _broadcast(policy, engines, version, probe_batch, probe_request)
    elif transport == "in_place":  # the engines read the policy's own tensors: publish the version, send nothing
        trainer_probe, receipt = None, engines.update_weights(None, version, probe_request)
    else:
        weights, trainer_probe = policy.put_weights(probe_batch, cuda_ipc=transport == "cuda_ipc")
        receipt = engines.update_weights(weights, version, probe_request)
        del weights  # the engines hold their copies: the object store may free it
    if receipt.weight_version != version:
        raise StaleWeightsError(f"refit failed: generation engine at weight version {receipt.weight_version}, "
                                f"trainer at {version}")
    if probe is None:
        return {}
    metrics = probe.measure(policy, engines, trainer_probe, receipt.probe_logprobs)
    probe.check(metrics, version)
    return metrics


def _broadcast(policy: RefitSource, engines: RefitTarget, version: int, probe: TokenBatch | None,
               engine_probe: ProbeRequest | None) -> tuple[torch.Tensor | None, RefitReceipt]:
    """A refit over the policy worker's broadcast group (``weight_sync.broadcast``): the sender
    and the receivers run at once. The group is set up at the first broadcast to ``engines``."""
    if policy.broadcast_peer is not engines:
        host, port = policy.serve_weight_broadcast(BROADCAST_TIMEOUT_S)
        world_size = 1 + engines.num_engines
        joining = policy.start_joining_broadcast(world_size, BROADCAST_TIMEOUT_S)
        # the engines first, then the policy; a side that fails because the other died reports the death
        wait_both(engines.start_joining_broadcast(host, port, world_size, BROADCAST_TIMEOUT_S), joining)
        policy.broadcast_peer = engines
    sending = policy.start_broadcast(engines.refit_bucket_bytes, probe)
    receipt, (trainer_probe, buckets, sent) = wait_both(engines.start_receiving(version, engine_probe), sending)
    policy.last_broadcast = (buckets, sent)
    return trainer_probe, receipt
