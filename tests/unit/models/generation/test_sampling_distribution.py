"""The behaviour distribution on the Hugging Face engine, in this process (no Ray): what the engine
samples from, the logprobs it reports for it, and what the trainer's ratio divides by.

At a temperature other than 1, with top-k or top-p, the engine's logprob of each sampled token
must be the trainer's logprob of the same token under the same tempered, truncated distribution
(``logits / T`` renormalised over the kept tokens), and both must be that distribution's, checked
here by hand from the model's logits. A train call handed behaviour logprobs must divide by
exactly those, in a call of one optimizer step and of several. The vLLM engine is held to the
same in ``test_vllm_generation.py`` (vLLM tier).
"""

from __future__ import annotations

import pytest
import torch
from harness.policy_backends import make_worker
from harness.sampling_oracle import kept_by_hand

from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.data.batch import make_batch
from posttrain.models.generation.interfaces import SamplingParams

# (temperature, top_k, top_p): each alone, and together (top-p after the temperature, over the
# top-k tokens). The untrained tiny model is near uniform over its 17 symbols, so top-k 4 and
# top-p 0.6 drop most of the vocabulary: renormalising moves a logprob by ~0.5-1.5 nats.
SAMPLING = [
    pytest.param(0.6, 0, 1.0, id="temperature"),
    pytest.param(1.0, 4, 1.0, id="top_k"),
    pytest.param(1.0, 0, 0.6, id="top_p"),
    pytest.param(0.5, 6, 0.7, id="all"),
]
# fp32, same weights; the engine decodes with a KV cache, the trainer in one pass. Calibration
# (`calibrate`, the largest of |engine - trainer| and |engine - hand| per seed, 10 seeds a sampling):
#
#   machine                           temperature   top_k     top_p     all       (max; median)
#   AMD EPYC, 2 threads (Nov 26)      5.7e-07       4.2e-07   4.8e-07   8.6e-07   (max 8.6e-7; medians 3.2-5.5e-7)
#   Xeon (H200 host), taskset 2 CPUs, 5.5e-07       4.4e-07   4.8e-07   9.5e-07   (max 9.5e-7; medians 3.0-6.2e-7)
#     OMP_NUM_THREADS=2 (Nov 26)
#
# 1e-5 is 10x the largest gap on either machine, ~30 seed-to-seed spreads (max - median <= 3.3e-7).
# The tests also passed inside the default tier on the Xeon host (16 workers, 1 thread each). The
# engine runs on the CPU in this test, so
# the GPU is not a machine type of it. Broken, the gap is 0.5-1.5 nats (`hf_engine_logprobs_untruncated`,
# `trainer_ignores_top_k_top_p` caught).
TOLERANCE = 1e-5


def prompts(n: int = 24) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(2, 17, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def by_hand(model, prompt: list[int], completion: list[int], temperature: float, top_k: int,
            top_p: float) -> tuple[list[float], list[bool]]:
    """Per completion token: its logprob under the tempered, truncated distribution (float64
    from the model's own logits) and whether that distribution keeps it at all."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].double()  # [S, V]
    logprobs, inside = [], []
    for t, token in enumerate(completion):
        scaled = logits[len(prompt) + t - 1] / temperature
        kept = kept_by_hand(scaled, top_k, top_p)
        inside.append(token in kept)
        logprobs.append(float(torch.log_softmax(scaled[kept], -1)[kept.index(token)]) if token in kept else -1e9)
    return logprobs, inside


def aligned(batch, rows: list[list[float]]) -> torch.Tensor:
    """Per-row logprob lists -> ``[B, L]`` on ``batch``'s completion window (zeros after)."""
    out = torch.zeros(batch.completion_mask.shape)
    for b, row in enumerate(rows):
        out[b, : len(row)] = torch.tensor(row)
    return out


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), SAMPLING)
def test_the_engines_sampled_logprobs_are_the_trainers_of_the_same_tempered_truncated_distribution(
        engine, tiny_model_path, temperature, top_k, top_p):
    params = SamplingParams(max_new_tokens=5, temperature=temperature, top_k=top_k, top_p=top_p, seed=4)
    ps = prompts()
    out = engine.generate(ps, params)
    untruncated = []
    for p, c, reported in zip(ps, out.completion_ids, out.logprobs, strict=True):
        expected, inside = by_hand(engine.model, p, c, temperature, top_k, top_p)
        assert all(inside), "the engine sampled a token outside the top-k / top-p set"
        assert reported == pytest.approx(expected, abs=TOLERANCE)
        untruncated += by_hand(engine.model, p, c, temperature, 0, 1.0)[0]
    batch = make_batch(ps, out.completion_ids, pad_id=0)
    trainer = make_worker("hf", tiny_model_path, temperature=temperature, top_k=top_k, top_p=top_p)
    mask = batch.completion_mask.bool()
    gap = (trainer.get_logprobs(batch) - aligned(batch, out.logprobs))[mask].abs().max().item()
    assert gap < TOLERANCE, gap
    # and the ratio's numerator in a train step (its own pass: logprobs and entropy at once)
    recording = RecordingLoss()
    trainer.train(batch, {"advantages": torch.zeros(len(batch)), "old_logprobs": aligned(batch, out.logprobs)},
                  recording)
    assert (recording.logprobs[0] - aligned(batch, out.logprobs))[mask].abs().max().item() < TOLERANCE
    if top_k or top_p < 1.0:  # truncation moved the numbers: the check above could not pass by accident
        reported = torch.tensor([lp for row in out.logprobs for lp in row])
        assert (reported - torch.tensor(untruncated)).abs().mean() > 0.1


class RecordingLoss:
    """``ClippedPGLoss`` that records, per micro-batch, the logprobs it got and the denominator
    of its ratio (``data["old_logprobs"]``)."""

    uses_old_logprobs = True

    def __init__(self) -> None:
        self.logprobs: list[torch.Tensor] = []
        self.old: list[torch.Tensor] = []

    def __call__(self, logprobs, data, num_tokens):
        self.logprobs.append(logprobs.detach().clone())
        self.old.append(data["old_logprobs"].detach().clone())
        return ClippedPGLoss()(logprobs, data, num_tokens)


@pytest.mark.parametrize("optimizer_steps", [1, 2])
def test_a_train_call_divides_by_exactly_the_behaviour_logprobs_it_was_given(engine, tiny_model_path,
                                                                              optimizer_steps):
    """Sampled at T 0.7, top-k 6, top-p 0.9; the behaviour logprobs the call gets are the
    engine's, shifted per row so that no other logprobs (the trainer's own, scored in the call)
    could stand in for them. Every micro-batch's ratio divides by exactly those, and its first
    ratio is exp(shift) on every token."""
    params = SamplingParams(max_new_tokens=4, temperature=0.7, top_k=6, top_p=0.9, seed=9)
    ps = prompts(8)
    out = engine.generate(ps, params)
    batch = make_batch(ps, out.completion_ids, pad_id=0)
    shift = torch.linspace(-0.3, 0.3, len(batch))[:, None]  # [B, 1]
    behaviour = aligned(batch, out.logprobs) - shift
    worker = make_worker("hf", tiny_model_path, temperature=0.7, top_k=6, top_p=0.9, lr=1e-2,
                         train_global_batch_size=8 // optimizer_steps, train_micro_batch_size=2)
    loss = RecordingLoss()
    metrics = worker.train(batch, {"advantages": torch.linspace(-1, 1, len(batch)), "old_logprobs": behaviour}, loss)
    assert metrics["num_optimizer_steps"] == optimizer_steps
    assert torch.equal(torch.cat(loss.old), behaviour)  # every denominator is the behaviour's, bit for bit
    mask = batch.completion_mask[:2].bool()
    first_ratio = (loss.logprobs[0] - loss.old[0]).exp()  # the first micro-batch: weights not yet moved
    torch.testing.assert_close(first_ratio[mask], shift[:2].expand_as(mask).exp()[mask], rtol=0, atol=1e-4)


def calibrate(model_path: str, seeds: int) -> None:
    """Print, per sampling and seed, the largest engine-trainer and engine-hand gaps that
    :data:`TOLERANCE` bounds (the table above it)."""
    from posttrain.models.generation.hf_generation_worker import HfGenerationWorkerImpl

    engine = HfGenerationWorkerImpl(model_path)
    for param in SAMPLING:
        temperature, top_k, top_p = param.values
        trainer = make_worker("hf", model_path, temperature=temperature, top_k=top_k, top_p=top_p)
        gaps = []
        for seed in range(seeds):
            ps = prompts()
            out = engine.generate(ps, SamplingParams(max_new_tokens=5, temperature=temperature, top_k=top_k,
                                                     top_p=top_p, seed=seed))
            batch = make_batch(ps, out.completion_ids, pad_id=0)
            mask = batch.completion_mask.bool()
            to_trainer = (trainer.get_logprobs(batch) - aligned(batch, out.logprobs))[mask].abs().max().item()
            to_hand = max(abs(a - b) for p, c, r in zip(ps, out.completion_ids, out.logprobs, strict=True)
                          for a, b in zip(r, by_hand(engine.model, p, c, temperature, top_k, top_p)[0], strict=True))
            gaps.append(max(to_trainer, to_hand))
        print(f"{param.id:12s} seeds {seeds}: max gap {max(gaps):.2e}, median {sorted(gaps)[len(gaps) // 2]:.2e}")


if __name__ == "__main__":  # PYTHONPATH=tests uv run --group test python <this file> [SEEDS]
    import sys

    from unit.prepare_unit_test_assets import tiny_model_path as prepared

    calibrate(prepared(), int(sys.argv[1]) if len(sys.argv) > 1 else 10)
