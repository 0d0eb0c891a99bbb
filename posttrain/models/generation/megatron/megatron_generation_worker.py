"""Generation with megatron-core's inference loop (``generation.backend=megatron``), as a Ray actor.

``MegatronGenerationWorkerImpl`` holds a megatron-core ``GPTModel`` of its own, built from the
Hugging Face checkpoint, and samples with ``posttrain.models.megatron.inference.MegatronSampler``
(megatron's static-batch loop and KV cache, posttrain's sampler). The policy's weights reach it
through a refit in Hugging Face names, as they reach the HF and vLLM engines; it converts them
to megatron's layout on load. It needs a GPU (megatron-core's forward is CUDA-only) and the
``mcore`` extra.
"""

from __future__ import annotations

from collections.abc import Iterator

import ray
import torch

from posttrain.config import GenerationWorkerConfig
from posttrain.distributed.ray_cluster import free_port
from posttrain.models.generation.engine import EngineWorker, teacher_forced_logprobs
from posttrain.models.generation.interfaces import GenerationOutput, SamplingParams
from posttrain.models.precision import use_tf32_for_fp32
from posttrain.weight_sync.receiver import Shapes
from posttrain.weight_sync.transport import gpu_uuid


class MegatronGenerationWorkerImpl(EngineWorker):
    """Args: model_path (a Hugging Face Qwen2 directory), cfg (its ``dtype``: float32, or
    bfloat16 for a bf16 policy; ``tf32``), rank (the engine's index: it offsets the seeds).

    One engine is one process and one GPU (tensor-parallel size 1, its own ``torch.distributed``
    group of one). Raises (at construction, reported by ``EngineGroup.wait_ready``):
    ``RuntimeError`` without a GPU, ``ConfigError`` for a model the converter does not map.
    """

    def __init__(self, model_path: str, cfg: GenerationWorkerConfig | None = None, rank: int = 0):
        from transformers import AutoConfig
        from transformers.utils import logging as hf_logging

        from posttrain.models.megatron import model as mc
        from posttrain.models.megatron.conversion import GPTShape, read_hf_weights
        from posttrain.models.megatron.inference import MegatronSampler

        self.cfg = cfg = cfg or GenerationWorkerConfig()
        if not torch.cuda.is_available():
            raise RuntimeError("generation.backend=megatron needs a GPU: megatron-core's forward pass is CUDA-only")
        hf_logging.disable_progress_bar()
        torch.set_num_threads(cfg.num_threads)  # as the megatron policy worker sets policy.num_threads
        self.rank, self.version = rank, 0
        precision: mc.Precision = "bf16-mixed" if cfg.dtype == "bfloat16" else "fp32"
        use_tf32_for_fp32("cuda", precision == "fp32" and cfg.tf32)  # as the policy worker does
        hf_config = AutoConfig.from_pretrained(model_path)
        self.shape = GPTShape.from_hf_config(hf_config)
        mc.init_parallel_state(f"tcp://127.0.0.1:{free_port('127.0.0.1')}", 0, 1, 1, cfg.seed)  # a group of one
        hf = read_hf_weights(model_path)
        self._shapes: Shapes = {name: tuple(t.shape) for name, t in hf.items()}
        self.model = mc.build_gpt_model(self.shape, precision, 1).eval()
        self._load_hf(hf)
        self.eos_id = hf_config.eos_token_id
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.sampler = MegatronSampler(self.model, self.shape.vocab_size, self.eos_id)

    def _load_hf(self, hf: dict[str, torch.Tensor]) -> None:
        """Copy a whole Hugging Face state dict into the megatron model (converted, in place)."""
        from posttrain.models.megatron.conversion import hf_to_megatron
        from posttrain.models.megatron.model import load_local_state

        load_local_state(self.model, hf_to_megatron(hf, self.shape, 0, 1))

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """Sample one completion per prompt; see :class:`posttrain.models.generation.interfaces.Generation`."""
        completions, logprobs = self.sampler.generate(prompts, params, seed=params.seed * 1_000_003 + self.rank)
        return GenerationOutput(completions, logprobs, self.version)

    @torch.no_grad()
    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float) -> list[list[float]]:
        """Teacher-forced logprobs of ``completions`` at ``temperature`` (see ``Generation.score``):
        one prefill of each whole sequence, as the trainer scores it."""

        from posttrain.models.megatron.model import right_padded_logits

        return teacher_forced_logprobs(lambda batch: right_padded_logits(self.model, batch.input_ids,
                                                                         self.shape.vocab_size),
                                       prompts, completions, temperature, self.eos_id, self.device)

    def gpu_uuid(self) -> str | None:
        return gpu_uuid(self.device)

    def refit_shapes(self) -> Shapes:
        """The Hugging Face names and shapes of the checkpoint it was built from."""
        return self._shapes

    def refit_device(self) -> str:
        return "cuda"

    def _load_weights(self, tensors: Iterator[tuple[str, torch.Tensor]], version: int) -> None:
        """Collect the whole refit (megatron fuses q, k and v: one layer needs three HF tensors),
        convert it, copy it in place; then the version."""
        hf = {name: tensor.detach().to("cpu", torch.float32, copy=True) for name, tensor in tensors}
        self._load_hf(hf)
        self.version = version

    def weight_version(self) -> int:
        return self.version


@ray.remote
class MegatronGenerationWorker(MegatronGenerationWorkerImpl):
    """Ray actor wrapper of :class:`MegatronGenerationWorkerImpl` (no logic of its own)."""
