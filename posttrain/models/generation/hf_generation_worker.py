"""Generation with Hugging Face ``generate`` on torch, as a Ray actor.

``HfGenerationWorkerImpl`` holds its own copy of the model; the policy's weights reach it
only through a refit (``weight_sync.receiver.WeightReceiver``), exactly as they reach vLLM.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ray
import torch

from posttrain.config import GenerationWorkerConfig
from posttrain.models.generation.engine import EngineWorker, teacher_forced_logprobs
from posttrain.models.generation.interfaces import GenerationOutput, SamplingParams
from posttrain.models.precision import use_tf32_for_fp32
from posttrain.weight_sync.receiver import Shapes
from posttrain.weight_sync.transport import gpu_uuid


class HfGenerationWorkerImpl(EngineWorker):
    """Args: model_path (Hugging Face directory), cfg (its ``num_threads``, ``dtype`` and
    ``device``: "cpu", or "cuda" for the actor of a GPU bundle), rank.

    The model loads in the constructor (an error there is one line at the driver's
    ``wait_ready``); ``start`` has nothing left to do (the contract's default).
    """

    def __init__(self, model_path: str, cfg: GenerationWorkerConfig | None = None, rank: int = 0):
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        self.cfg = cfg = cfg or GenerationWorkerConfig()
        hf_logging.disable_progress_bar()
        torch.set_num_threads(cfg.num_threads)
        self.device = torch.device(cfg.device)
        use_tf32_for_fp32(self.device, cfg.dtype == "float32" and cfg.tf32)  # as the policy worker does
        # transformers wraps PreTrainedModel.to in a decorator that mypy reads as unbound.
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, cfg.dtype))
        self.model = model.to(self.device).eval()  # type: ignore[arg-type]
        self.pad_id = self.model.config.pad_token_id
        self.eos_id = self.model.config.eos_token_id
        self.version = 0
        self.rank = rank

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        # Built as lists, one tensor each: per-row writes cost ~2 ms for 128 prompts.
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
        return ids, mask

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """Sample one completion per prompt; see :class:`posttrain.models.generation.interfaces.Generation`."""
        if not prompts:  # a data-parallel shard can be empty when prompts < workers
            return GenerationOutput([], [], self.version)
        torch.manual_seed(params.seed * 1_000_003 + self.rank)
        ids, mask = (t.to(self.device) for t in self._left_pad(prompts))
        sampling: dict[str, Any] = (
            {"do_sample": False}
            if params.greedy
            else {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k}
        )
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=params.max_new_tokens,
            eos_token_id=self.eos_id, pad_token_id=self.pad_id, output_scores=True,
            return_dict_in_generate=True, **sampling,
        )
        new_tokens = out.sequences[:, ids.shape[1]:]  # [B, T]
        # The processed scores, what each token was drawn from: logits / T with -inf outside
        # the top-k / top-p set (vLLM's processed_logprobs; the trainer's ops.compute_logprobs).
        scores = torch.stack(out.scores, dim=1).float()  # [B, T, V]
        token_logprobs = torch.log_softmax(scores, -1).gather(-1, new_tokens[:, :, None]).squeeze(-1)
        completions, logprobs = [], []
        for row, row_lp in zip(new_tokens.tolist(), token_logprobs.tolist(), strict=True):
            end = row.index(self.eos_id) + 1 if self.eos_id in row else len(row)
            completions.append(row[:end])
            logprobs.append(row_lp[:end])
        return GenerationOutput(completions, logprobs, self.version)

    @torch.no_grad()
    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float) -> list[list[float]]:
        """Teacher-forced logprobs of ``completions`` at ``temperature`` (see ``Generation.score``)."""
        return teacher_forced_logprobs(
            lambda b: self.model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits,
            prompts, completions, temperature, self.pad_id, self.device)

    def gpu_uuid(self) -> str | None:
        """This worker's GPU (None on a CPU): the driver refits over CUDA IPC when it is the policy's."""
        return gpu_uuid(self.device)

    def refit_shapes(self) -> Shapes:
        """The model's state dict names and shapes (a tied embedding under both of its names)."""
        return {name: tuple(t.shape) for name, t in self.model.state_dict().items()}

    def refit_device(self) -> str:
        return self.device.type

    def _load_weights(self, tensors: Iterator[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy each tensor into the model's own (in place: no new allocation); then the version."""
        state = self.model.state_dict()
        for name, tensor in tensors:
            state[name].copy_(tensor)
        self.version = version

    def weight_version(self) -> int:
        return self.version


@ray.remote
class HfGenerationWorker(HfGenerationWorkerImpl):
    """Ray actor wrapper of :class:`HfGenerationWorkerImpl` (no logic of its own)."""
