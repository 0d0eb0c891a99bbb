"""What every algorithm sets up the same way: Ray, the virtual cluster, policy, generation."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from posttrain.algorithms import checkpointing
from posttrain.algorithms.unread_keys import check_reads, not_started, note_reads
from posttrain.config import (
    ClusterConfig,
    GenerationConfig,
    ModelConfig,
    PolicyConfig,
    PolicyWorkerConfig,
    RunConfig,
    resolve_precision,
)
from posttrain.config_reads import untracked
from posttrain.data.chat import ChatEncoder
from posttrain.distributed.node_placement import describe_placement, placement_metrics
from posttrain.distributed.transport import Cluster, current_transport
from posttrain.errors import ConfigError
from posttrain.models.generation.backends import (
    check_engine_keys,
    check_engine_placement,
    create_generation,
    create_in_place,
    num_bundles,
    resolve_backend,
    serves_in_place,
)
from posttrain.models.generation.interfaces import Generation
from posttrain.models.generation.megatron.in_place import check_in_place
from posttrain.models.policy.interfaces import TrainResult
from posttrain.models.policy.lm_policy import Policy, check_backend, num_policy_workers
from posttrain.models.tiny import build_tiny_model
from posttrain.utils.logger import MetricsLogger
from posttrain.utils.memory import peak_rss_gib
from posttrain.utils.timer import Timer
from posttrain.weight_sync.probe import RefitProbe
from posttrain.weight_sync.refit import refit


@dataclass
class Runtime:
    """The live parts of a run. ``generation`` holds its own weights; :func:`refit` syncs them
    and, when ``probe`` is set, checks them with the weight-sync probe. ``generation`` is None
    in a run that never generates (SFT validating by loss only): see :attr:`engine`."""

    model_path: str
    tokenizer: Any
    cluster: Cluster
    policy: Policy
    generation: Generation | None
    chat: ChatEncoder
    probe: RefitProbe | None = None
    placement: dict[str, float] = field(default_factory=dict)  # placement_metrics of the workers' nodes

    @property
    def engine(self) -> Generation:
        """The generation engine.

        Raises:
            ConfigError: this run started none (``setup_runtime(..., with_generation=False)``).
        """
        if self.generation is None:
            raise ConfigError("this run started no generation engine (it was set up to validate by loss only)")
        return self.generation

    def resource_metrics(self, timer: Timer, step_start: float, trained: TrainResult | None) -> dict[str, float]:
        """``timing/<phase>`` and ``timing/step`` (s, since ``step_start``, a ``perf_counter``
        reading), ``memory/<process>_peak_rss`` (GiB) of the driver and of the policy workers:
        as the step's train call ``trained`` reported it, or asked for when the step trained
        nothing (None: an asynchronous step whose samples were all stale), ``placement/*``
        (where the workers run: ``distributed.node_placement.placement_metrics``), and on the
        steps that timed the plain torch reference (``policy.reference_timing_period``) its
        :attr:`TrainResult.timing` and ``timing/step_over_reference`` (the whole step's seconds
        over the reference's)."""
        metrics = timer.pop()
        metrics["timing/step"] = time.perf_counter() - step_start
        if trained is not None and trained.timing:
            metrics.update(trained.timing)
            metrics["timing/step_over_reference"] = metrics["timing/step"] / trained.timing["timing/reference_step"]
        metrics["memory/driver_peak_rss"] = peak_rss_gib()
        metrics["memory/policy_peak_rss"] = (trained.peak_memory_gib if trained is not None
                                             else self.policy.peak_memory_gib())
        metrics.update(self.placement)
        return metrics

    def config_reads(self) -> frozenset[str]:
        """The run's config keys the policy workers and the engines read so far (``posttrain.config_reads``)."""
        return self.policy.config_reads() | (self.generation.config_reads() if self.generation is not None
                                             else frozenset())

    def shutdown(self) -> None:
        if self.generation is not None:
            self.generation.shutdown()
        self.policy.shutdown()
        self.cluster.shutdown()


def resolve_model_path(cfg: ModelConfig) -> str:
    """``cfg.path`` when set (must be a Hugging Face directory), else the tiny model's build dir.

    Raises:
        ConfigError: ``cfg.path`` has no ``config.json``.
    """
    if cfg.path is None:
        return str(build_tiny_model(cfg.tiny))
    from pathlib import Path

    if not (Path(cfg.path) / "config.json").is_file():
        raise ConfigError(f"model.path '{cfg.path}' is not a Hugging Face model directory (no config.json)")
    return cfg.path


def setup_runtime(model: ModelConfig, policy: PolicyConfig, generation: GenerationConfig,
                  cluster: ClusterConfig, seed: int, with_generation: bool = True,
                  with_reference: bool = True) -> Runtime:
    """Start Ray, reserve the bundles, place the policy and (``with_generation``) the
    generation backend; without it no engine starts and nothing is reserved for one.
    ``with_reference=False``: the policy keeps no frozen reference copy (a run whose loss
    never scores it; it saves a model's worth of memory).

    The backend is ``generation.backend`` resolved (``auto``: vLLM when installed). The
    policy takes bundle 0 (and one more per extra tensor-parallel rank of a Megatron
    policy); colocated vLLM engines share bundle 0, other engines take one bundle each, and a
    colocated megatron engine over a Megatron policy is the policy's own workers (in place:
    ``models.generation.megatron.in_place``).
    The policy workers compute logprobs under the sampling distribution (temperature, top-k,
    top-p), so the engine's and the trainer's logprobs of the same tokens are comparable.

    Raises:
        ConfigError: vLLM asked for and not installed; a Megatron policy or Megatron engines
            without megatron-core or GPUs; the cluster cannot hold the bundles.
        EngineStartError: a vLLM engine did not start.
        WorkerStartError: a policy or generation worker's constructor raised (e.g. weights
            it cannot load).
    """
    from transformers import AutoTokenizer

    sampling, placed = untracked(generation), untracked(cluster)  # a copy: the workers' reads of it count
    worker_cfg = PolicyWorkerConfig.of(policy, sampling.temperature, placed.device, with_reference,
                                       top_k=sampling.top_k, top_p=sampling.top_p)
    model_path = resolve_model_path(model)
    check_backend(worker_cfg, cluster.gpus_per_worker)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    # A missing vLLM extra: one line, before Ray starts (and no check when nothing generates).
    backend = resolve_backend(generation.backend) if with_generation else None
    in_place = backend is not None and serves_in_place(generation, backend, policy.backend)
    if backend:
        check_engine_placement(backend, cluster.gpus_per_worker)
        check_engine_keys(generation, backend)
    if in_place:
        check_in_place(policy.megatron.tensor_model_parallel_size, generation.num_workers,
                       pipeline_parallel_size=policy.megatron.pipeline_model_parallel_size)
    transport = current_transport()  # Ray, unless the caller chose another (distributed/transport.py)
    transport.start(cluster.address, cluster.num_cpus, cluster.num_gpus)
    policy_workers = num_policy_workers(worker_cfg)
    bundles = (num_bundles(generation, backend, policy_workers, policy.backend, cluster.gpus_per_worker) if backend
               else policy_workers)
    vc = transport.cluster(bundles, cluster.cpus_per_worker, cluster.gpus_per_worker, cluster.placement_strategy)
    gen: Generation | None = None
    try:
        pol = Policy(vc, model_path, worker_cfg, seed, bundle_indices=list(range(policy_workers)))
    except BaseException:
        vc.shutdown()
        raise
    try:
        if backend and in_place:
            gen = create_in_place(backend, pol)
        elif backend:
            gen = create_generation(generation, cluster, vc, model_path, backend, seed, policy_workers,
                                    worker_cfg.resolved_precision, worker_cfg.tf32)
        # Both start in parallel; a constructor error surfaces here, as one line.
        pol.wait_ready()
        if gen is not None:
            gen.wait_ready()
        # where each worker runs, asked of the workers (a call, so inside the clean-up)
        policy_nodes = pol.node_ids()
        engine_nodes = gen.node_ids() if gen is not None else []
    except BaseException:
        for part in (gen, pol):
            if part is not None:
                part.shutdown()
        vc.shutdown()
        raise
    probe = (RefitProbe(generation.refit_probe, tokenizer, generation.temperature, worker_cfg.resolved_precision,
                        num_engines=gen.num_engines)
             if generation.refit_probe.num_sequences and gen is not None else None)
    engine = "no generation engine"
    if backend:
        where = (" (in place: the policy's own weights)" if in_place
                 else " (colocated)" if bundles == policy_workers  # the engines hold no bundle of their own
                 else "")
        engine = f"{generation.num_workers} x {backend} engine{where}"
    where_nodes = describe_placement(policy_nodes, engine_nodes, transport.node_addresses())
    print(f"runtime: {describe_policy(policy, pol)} policy, {engine}, on {cluster.device}; {where_nodes}", flush=True)
    return Runtime(model_path, tokenizer, vc, pol, gen, ChatEncoder(tokenizer), probe,
                   placement_metrics(policy_nodes, engine_nodes))


def describe_policy(policy: PolicyConfig, workers: Policy | None = None) -> str:
    """``hf``, ``hf + LoRA (rank R[: T of N parameters trained, P%])`` (the counts when the
    ``workers`` are given) or ``megatron (tp=N[, pp=M], <precision>)``: what the start-up line names."""
    if policy.backend == "megatron":
        precision = resolve_precision(policy.precision, "cuda")  # megatron runs on CUDA only
        pp = policy.megatron.pipeline_model_parallel_size
        stages = f", pp={pp}" if pp > 1 else ""
        return f"megatron (tp={policy.megatron.tensor_model_parallel_size}{stages}, {precision})"
    if policy.lora.rank > 0:
        counts = ""
        if workers is not None:
            trained, total = workers.parameter_counts()
            counts = f": {trained:,} of {total:,} parameters trained, {100 * trained / total:.2f}%"
        return f"hf + LoRA (rank {policy.lora.rank}{counts})"
    return policy.backend


@contextlib.contextmanager
def open_run(cfg: RunConfig, seed: int, num_steps: int, name: str, with_generation: bool = True,
             with_reference: bool = True) -> Iterator[tuple[Runtime, MetricsLogger, int]]:
    """The runtime, the metrics logger and the last finished step of one training run (0 for
    a fresh run; N when it resumes from checkpoint ``step_N``: the policy, the engine and the
    RNGs are restored, the logger continues after N), torn down however it ends.

    On a normal exit the final policy is saved to ``cfg.checkpoint.save_path`` (when set);
    on any exit the logger is closed and the workers and their reservation are released.
    Every config key the file or the overrides set must be read: by the end of set-up (but
    ``unread_keys.READ_AFTER_SET_UP``), and by the end of a run that trained a step
    (:mod:`posttrain.algorithms.unread_keys`).
    ``num_steps`` and ``name`` (e.g. "GRPO") drive the console's progress (bar and ETA).
    ``with_generation=False``: no engine starts (a run that never generates);
    ``with_reference=False``: the policy keeps no reference copy (a loss without a KL term).

    Raises:
        ConfigError: ``checkpoint.resume`` names a path that is not a complete checkpoint; a
            config key set that nothing read, at the end of set-up or of the run.
    """
    resume_from = checkpointing.find_resume(cfg.checkpoint)
    rt = setup_runtime(cfg.model, cfg.policy, cfg.generation, cfg.cluster, seed, with_generation, with_reference)
    try:
        start = 0
        if resume_from is not None:
            start = checkpointing.restore(rt.policy, resume_from)
            if rt.generation is not None:
                refit(rt.policy, rt.generation, rt.probe)
            print(f"resumed from {resume_from} (step {start})", flush=True)
        logger = MetricsLogger(cfg.logger.log_dir, cfg.logger.print_period,
                               resume_step=start if resume_from is not None else None, num_steps=num_steps,
                               name=name)
        try:
            note_reads(cfg, rt.config_reads())  # what the workers read, into the run's record
            if rt.generation is None:
                not_started(cfg, "generation.")
            check_reads(cfg, at_set_up=True)
            yield rt, logger, start
            if cfg.checkpoint.save_path:
                rt.policy.export(cfg.checkpoint.save_path)
            if any(int(s) > start for series in logger.metrics.values() for s in series):
                # (a run that ran no step, resumed at its end or stopped at once, read none of its loop's keys)
                note_reads(cfg, rt.config_reads())
                check_reads(cfg, at_set_up=False)
        finally:
            logger.close()
    finally:
        rt.shutdown()
