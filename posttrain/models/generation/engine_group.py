"""The one driver-side ``Generation``: a data-parallel group of engine actors.

Both backends run behind it, the Hugging Face worker (``hf_generation_worker``) and the
vLLM worker (``vllm/vllm_generation_worker``); they differ only inside the worker. The
driver shards prompts over the engines, gathers their outputs in order, sends refits
through the object store once (or has the policy broadcast them), and insists that every
engine holds the same weights.
Errors come back as the workers' own one-line :class:`~posttrain.errors.PosttrainError`
(``RayWorkerGroup`` unwraps Ray's task error), never as a Ray traceback.
"""

from __future__ import annotations

from typing import Any

import ray
import torch

from posttrain.config import GenerationWorkerConfig
from posttrain.distributed.sharding import contiguous_shards
from posttrain.distributed.transport import Cluster, current_transport
from posttrain.distributed.worker_group import Pending
from posttrain.models.generation.interfaces import GenerationOutput, SamplingParams
from posttrain.models.generation.sharding import gather_outputs
from posttrain.weight_sync.receipt import ProbeRequest, RefitReceipt, agreed_version, gather_receipts


class EngineGroup:
    """``Generation`` backed by one engine per Ray actor.

    Args:
        cluster: virtual cluster to place the engines on.
        worker_cls: the ``ray.remote`` engine class (``HfGenerationWorker`` or
            ``VllmGenerationWorker``): ``start``, ``generate``, ``score``, ``gpu_uuid`` and the
            refit calls of ``weight_sync.receiver.WeightReceiver``, constructed as
            ``(model_path, cfg, rank=r)``.
        model_path: Hugging Face model directory (initial weights).
        cfg: the workers' config (the same for every engine).
        bundle_indices: one engine per listed bundle.
        reserve: False for engines colocated on the policy's bundle (they reserve nothing,
            see ``RayWorkerGroup``).
        who: how errors name the engines, e.g. "vLLM engines".

    The engines start in the background: the constructor returns at once and
    :meth:`wait_ready` collects their start-up, so the policy can start meanwhile.
    """

    def __init__(self, cluster: Cluster, worker_cls: Any, model_path: str, cfg: GenerationWorkerConfig,
                 bundle_indices: list[int], reserve: bool = True, who: str = "generation engines"):
        self.group = current_transport().group(cluster, worker_cls, model_path, cfg, bundle_indices=bundle_indices,
                                               reserve=reserve)
        self.model_path = model_path
        self.group_cfg = cfg
        self.who = who
        self._starting = self.group.submit_all("start")
        self._gpus: list[str | None] | None = None  # each engine's GPU, once asked for

    def wait_ready(self) -> None:
        """Block until every engine has started; on failure the engines are killed first.

        Raises:
            WorkerStartError: an engine's constructor raised (one line).
            EngineStartError, ConfigError: an engine did not start (one line from the worker,
                e.g. a KV cache that does not fit).
        """
        try:
            self.group.wait_ready(f"{self.group.name} for '{self.model_path}'")
            self.group.gather(self._starting, "start")
            self._starting = []  # done: the group may now be handed to another actor (the rollout producer)
        except BaseException:
            self.shutdown()
            raise

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """Split ``prompts`` into contiguous shards, one per engine, and gather in order.

        Raises:
            StaleWeightsError: the engines report different weight versions, or one is
                labelled or stamped with another version than the one it was last given.
        """
        shards = contiguous_shards(prompts, len(self.group))
        return gather_outputs(self.group.run_sharded("generate", shards, params=params), self.who)

    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float) -> list[list[float]]:
        """Teacher-forced logprobs of ``completions`` (see ``Generation.score``), sharded like :meth:`generate`."""
        n = len(self.group)
        shards = self.group.run_sharded("score", contiguous_shards(prompts, n), contiguous_shards(completions, n),
                                        temperature=temperature)
        return [row for rows in shards for row in rows]

    def update_weights(self, weights: dict[str, torch.Tensor] | ray.ObjectRef, version: int,
                       probe: ProbeRequest | None = None) -> RefitReceipt:
        """Refit: the weights go into the object store once (or are there already: a
        reference from ``Policy.put_weights``); every engine loads that copy, reads its
        version back and scores its shard of ``probe`` in the same call.

        Raises:
            StaleWeightsError: an engine could not load the weights, or the engines disagree
                on their version afterwards.
        """
        n = len(self.group)
        weights = self.group.share(weights)  # one copy for every engine
        refs = self.group.submit_sharded("update_weights", [weights] * n, [version] * n, self._probe_shards(probe))
        return gather_receipts(self.group.gather(refs, "update_weights"), self.who)

    def start_joining_broadcast(self, host: str, port: int, world_size: int, timeout_s: float) -> Pending[None]:
        """Every engine joins the policy's refit broadcast group at ``host:port`` (as rank
        ``1 + rank``), started, not waited for: the policy joins at the same time."""
        refs = self.group.submit_all("join_weight_broadcast", host, port, world_size, timeout_s)
        return Pending(self.group.gather, refs, "join_weight_broadcast", lambda _: None)

    def start_receiving(self, version: int, probe: ProbeRequest | None = None) -> Pending[RefitReceipt]:
        """The engines' side of a refit broadcast, started without waiting (the policy worker
        sends at the same time): each loads what arrives, reads its version back and scores
        its shard of ``probe``; one receipt when waited for.

        Raises (at ``wait``):
            StaleWeightsError: an engine could not load, or they disagree on the version.
        """
        n = len(self.group)
        refs = self.group.submit_sharded("receive_weights", [version] * n, self._probe_shards(probe))
        return Pending(self.group.gather, refs, "receive_weights", lambda answers: gather_receipts(answers, self.who))

    def _probe_shards(self, probe: ProbeRequest | None) -> list[ProbeRequest | None]:
        """``probe`` split like :meth:`score` splits its rows, one shard per engine."""
        n = len(self.group)
        if probe is None:
            return [None] * n
        return [ProbeRequest(p, c, probe.temperature) for p, c in
                zip(contiguous_shards(probe.prompts, n), contiguous_shards(probe.completions, n), strict=True)]

    @property
    def num_engines(self) -> int:
        return len(self.group)

    @property
    def refit_setting(self) -> str:
        """``generation.refit_transport``: how the policy may refit these engines."""
        return self.group_cfg.refit_transport

    @property
    def refit_bucket_bytes(self) -> int:
        """``generation.refit_bucket_mb`` in bytes: the largest bucket of a broadcast refit."""
        return self.group_cfg.refit_bucket_mb * 2**20

    def gpu_uuids(self) -> list[str | None]:
        """Each engine's GPU (None on a CPU), in rank order; asked for once (engines do not move)."""
        if self._gpus is None:
            self._gpus = self.group.run_all("gpu_uuid")
        return self._gpus

    def weight_version(self) -> int:
        """The engines' weight version.

        Raises:
            StaleWeightsError: the engines disagree.
        """
        return agreed_version(self.group.run_all("weight_version"), self.who)

    def node_ids(self) -> list[str]:
        """The node each engine runs on (Ray's node id), in rank order."""
        return self.group.node_ids()

    def config_reads(self) -> frozenset[str]:
        """The run's config keys the engines read so far (``posttrain.config_reads``)."""
        return frozenset().union(*self.group.run_all("config_reads"))

    def shutdown(self) -> None:
        """Kill every engine actor (their bundles stay with the cluster)."""
        self.group.shutdown()
