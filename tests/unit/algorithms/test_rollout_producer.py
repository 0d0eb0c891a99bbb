"""Tests for posttrain.algorithms.rollout_producer: the producer of asynchronous GRPO, in process.

The real ``RolloutProducer`` and ``RolloutBuffer`` run through the in-process transport (the
clients of ``async_actors``; the producer's own sampling thread, the buffer's event loop); only
the engine is a stand-in that answers at once, so what holds the producer back is its allowance
alone. The same pipeline with real Ray actors and the real engine is
``tests/integration/test_async_grpo.py``.
"""

from __future__ import annotations

import pytest

from posttrain.algorithms.async_actors import RolloutBufferClient, RolloutProducerClient
from posttrain.algorithms.grpo_config import GRPOMasterConfig
from posttrain.config import load_config
from posttrain.data.datasets import load_problems
from posttrain.distributed.transport import InProcessTransport, use_transport
from posttrain.errors import BufferTimeoutError
from posttrain.models.generation.interfaces import GenerationOutput, SamplingParams

P, G, K = 2, 2, 2  # prompts and completions per step, max_staleness
N = P * G
# How long the producer gets to show a step beyond its allowance. The stand-in engine answers at
# once, so a producer allowed one step further puts it within milliseconds; a correct one never does,
# so the wait bounds only how surely the wrong allowance is seen, never the correct one's verdict.
BEYOND_S = 0.3


class InstantEngine:
    """An engine that answers every sampling call at once with a one-token completion (a test
    double: the producer's allowance is under test, not sampling), and notes which step asked."""

    def __init__(self, seed: int):
        self.seed = seed
        self.steps: list[int] = []

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        self.steps.append(params.seed - self.seed * 100_003)  # the loop's per-step seed (grpo_step)
        return GenerationOutput([[5] for _ in prompts], [[-1.0] for _ in prompts], weight_version=0)


def config(model_path: str) -> GRPOMasterConfig:
    return load_config("examples/configs/grpo_arithmetic.yaml",
                       [f"model.path={model_path}", "grpo.num_steps=10", f"grpo.num_prompts_per_step={P}",
                        f"grpo.completions_per_prompt={G}", "data.arithmetic.num_val=8",
                        "grpo.async.enabled=true", f"grpo.async.max_staleness={K}"],
                       GRPOMasterConfig)


def steps_of(samples: list) -> list[int]:
    return sorted({s["batch_index"] for s in samples})


def test_the_producer_samples_at_most_max_staleness_steps_past_the_trained_one(tiny_model_path) -> None:
    """With k = 2 and 10 steps to go, the producer samples steps 1..k + 1 before the trainer has
    finished one, and after the trainer resumes it at ``trained = 1`` one more (step k + 2), never
    the step after: a sample of it could be drawn by weights more than k versions behind the
    trainer that trains on it. The buffer has room for every step, so only the allowance stops it."""
    cfg = config(tiny_model_path)
    train_problems, _ = load_problems(cfg.data)
    engine = InstantEngine(cfg.grpo.seed)
    with use_transport(InProcessTransport()):
        buffer = RolloutBufferClient(10 * N)
        producer = RolloutProducerClient(engine, buffer, tiny_model_path, train_problems, cfg, 1)
        try:
            before = buffer.claim((K + 1) * N, timeout_s=30)
            with pytest.raises(BufferTimeoutError):
                buffer.claim(N, timeout_s=BEYOND_S)
            producer.pause()
            producer.resume(1)
            after = buffer.claim(N, timeout_s=30)
            with pytest.raises(BufferTimeoutError):
                buffer.claim(N, timeout_s=BEYOND_S)
            producer.check()  # the sampling thread raised nothing
        finally:
            producer.kill()
            buffer.kill()
    assert steps_of(before) == [1, 2, 3] and steps_of(after) == [4]
    assert engine.steps == [1, 2, 3, 4]
