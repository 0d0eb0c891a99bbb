"""Sampling from a megatron-core ``GPTModel`` with megatron-core's own inference loop and KV cache.

megatron-core's static-batch loop (``TextGenerationController.generate_all_output_tokens_static_batch``
with a ``StaticInferenceContext``) runs the prefill and the decode steps, keeps the KV cache and
stops every row at EOS. Its sampler is the one part replaced (``sample_from_logits``, the
controller's hook for it): megatron's returns the logprobs of the *raw* logits, refuses top-k
with top-p, can sample the padded vocabulary's ids and draws from one generator per process.
Here each step's token is drawn from the distribution posttrain's trainer scores
(``ops.sampling_log_softmax``: logits over the temperature, renormalised over the top-k then
top-p tokens, padded ids excluded) with a generator seeded per call, and its logprob under that
distribution is recorded as it is drawn: the behaviour logprobs of GRPO's importance ratio.

Why the static loop, not megatron-core's dynamic engine: the dynamic engine requires flash-attn
(>= 2.7.3), which has no float32 kernels, and the static loop runs the policy's own local layer
spec in fp32 and bf16. CUDA graphs stay off (they need a fixed batch and would capture the
weights' addresses between optimizer steps).

Freshness: every :meth:`MegatronSampler.generate` builds a new ``StaticInferenceContext`` (an
empty KV cache) and drops it at the end, so no call can read keys or values computed with
another call's prompts or another version of the weights; the model is read where it is (no
copy), so a call sees the weights of the last completed optimizer step.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from posttrain.models.generation.interfaces import SamplingParams
from posttrain.models.megatron.model import unwrap
from posttrain.ops import sampling_log_softmax


@dataclass
class _Tokenizer:
    """What megatron's loop asks of a tokenizer in static batching: the EOS id (``eod``), and a
    ``detokenize`` for the text it attaches to each request (unused here: posttrain works on ids)."""

    eod: int

    def detokenize(self, ids: list[int], **kwargs: Any) -> str:
        return ""


class _StepSampler:
    """Draws each step's tokens for megatron's loop and records them with their logprobs.

    One instance serves one :meth:`MegatronSampler.generate` call: step ``s`` samples the token
    at position ``min_prompt_len + s`` of every row (rows whose prompt is longer discard it
    until their prompt ends: megatron writes a sample only where ``generation_started``).
    """

    def __init__(self, params: SamplingParams, vocab_size: int, generator: torch.Generator):
        self.params, self.vocab_size, self.generator = params, vocab_size, generator
        self.tokens: list[torch.Tensor] = []  # per step, [B] int64
        self.logprobs: list[torch.Tensor] = []  # per step, [B] float32

    def __call__(self, last_token_logits: torch.Tensor) -> torch.Tensor:
        logits = last_token_logits[:, : self.vocab_size].float()  # [B, V]: no padded id is ever drawn
        p = self.params
        if p.greedy:
            logp = torch.log_softmax(logits, dim=-1)
            tokens = logp.argmax(dim=-1)
        else:
            logp = sampling_log_softmax(logits, p.temperature, p.top_k, p.top_p)
            tokens = torch.multinomial(logp.exp(), 1, generator=self.generator).squeeze(-1)
        self.tokens.append(tokens)
        self.logprobs.append(logp.gather(-1, tokens[:, None]).squeeze(-1))
        return tokens


def _controller_class() -> type:
    """megatron-core's ``TextGenerationController`` with its sampler replaced (imported lazily:
    posttrain imports without megatron-core)."""
    from megatron.core.inference.text_generation_controllers.text_generation_controller import (
        TextGenerationController,
    )

    class Controller(TextGenerationController):
        step_sampler: _StepSampler

        def sample_from_logits(self, last_token_logits: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            return self.step_sampler(last_token_logits)

    return Controller


class MegatronSampler:
    """Generates completions with a megatron-core ``GPTModel`` (one tensor-parallel rank of it).

    Args:
        model: the ``GPTModel`` (or its ``Float16Module`` wrapper; not the DDP wrapper), on
            the current CUDA device, returning full-vocabulary logits (``parallel_output=False``).
        vocab_size: the tokenizer's vocabulary (the model's output is padded past it).
        eos_id: the token that ends a completion.

    megatron's inference config also asks for the hidden size, the parameter dtype and the
    padded vocabulary: they are read from the model's own ``TransformerConfig``.

    Every tensor-parallel rank of a model must call :meth:`generate` with the same arguments
    (the forward pass is collective); all ranks then return the same completions.
    """

    def __init__(self, model: torch.nn.Module, vocab_size: int, eos_id: int):
        self.model, self.vocab_size, self.eos_id = model, vocab_size, eos_id
        self.controller_class = _controller_class()

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 seed: int) -> tuple[list[list[int]], list[list[float]]]:
        """Sample one completion per prompt.

        Args:
            prompts: token ids, one list per row (lengths may differ; none empty).
            params: ``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``, ``greedy``.
            seed: seeds this call's CUDA generator: the same seed, prompts and weights give the
                same completions.

        Returns:
            ``(completion_ids, logprobs)``: per row, the generated ids ending with EOS when the
            model stopped (length <= ``max_new_tokens``), and each token's logprob (float) under
            the distribution it was drawn from (greedy: the plain log-softmax).

        Raises:
            ValueError: an empty prompt, or ``max_new_tokens`` < 1.
        """
        from megatron.core.inference.contexts import StaticInferenceContext
        from megatron.core.inference.inference_request import InferenceRequest
        from megatron.core.inference.model_inference_wrappers.gpt.gpt_inference_wrapper import GPTInferenceWrapper
        from megatron.core.inference.model_inference_wrappers.inference_wrapper_config import InferenceWrapperConfig
        from megatron.core.inference.sampling_params import SamplingParams as McoreSamplingParams

        if not prompts:
            return [], []
        if min(len(p) for p in prompts) == 0 or params.max_new_tokens < 1:
            raise ValueError(f"every prompt needs a token and max_new_tokens >= 1, got prompt lengths "
                             f"{sorted({len(p) for p in prompts})[:3]}, max_new_tokens={params.max_new_tokens}")
        batch = len(prompts)
        longest = max(len(p) for p in prompts) + params.max_new_tokens
        gpt = unwrap(self.model)
        config = InferenceWrapperConfig(
            hidden_size=gpt.config.hidden_size, params_dtype=gpt.config.params_dtype,
            inference_batch_times_seqlen_threshold=1 << 30,  # pipeline splitting: never (no PP)
            padded_vocab_size=gpt.vocab_size, inference_max_requests=batch, inference_max_seq_length=longest)
        context = StaticInferenceContext(batch, longest)  # a fresh, empty KV cache for this call
        wrapper = GPTInferenceWrapper(self.model, config, context)
        was_training = self.model.training
        generator = torch.Generator(device=torch.cuda.current_device())
        generator.manual_seed(seed)
        sampler = _StepSampler(params, self.vocab_size, generator)
        controller = self.controller_class(wrapper, _Tokenizer(self.eos_id))
        controller.step_sampler = sampler
        # megatron's own sampling fields stay at their neutral values: our sampler reads `params`.
        mparams = McoreSamplingParams(num_tokens_to_generate=params.max_new_tokens, return_log_probs=False)
        requests = OrderedDict((i, InferenceRequest(request_id=i, prompt="", prompt_tokens=list(p),
                                                    sampling_params=mparams)) for i, p in enumerate(prompts))
        try:
            controller.generate_all_output_tokens_static_batch(requests)
        finally:
            context.key_value_memory_dict.clear()  # the cache's memory goes back now, not at the next call
            self.model.train(was_training)  # megatron's loop leaves the model in eval()
        tokens = torch.stack(sampler.tokens, dim=1).tolist()  # [B, steps]
        logprobs = torch.stack(sampler.logprobs, dim=1).tolist()
        shortest = min(len(p) for p in prompts)
        completions, completion_logprobs = [], []
        for row, prompt in enumerate(prompts):
            first = len(prompt) - shortest  # the step that drew this row's first token
            ids = tokens[row][first: first + params.max_new_tokens]
            end = ids.index(self.eos_id) + 1 if self.eos_id in ids else len(ids)
            completions.append(ids[:end])
            completion_logprobs.append(logprobs[row][first: first + end])
        return completions, completion_logprobs
