"""The policy worker's train-step metrics on hand-made, padding-heavy batches, against the replay.

A loop's batches rarely isolate a metric: its probability ratios straddle 1, so a ratio minimum
that also reads padding (where the ratio is 1 by construction) looks the same. Here the
inputs are chosen so that each metric reads differently when it touches a padding token:
completions of 1 to 6 tokens (more than half the completion window is padding), engine
logprobs that put every real ratio above 1 (or every one below), garbage under the mask
(-1e4 / +1e4), and two optimizer steps of micro-batches each.
"""

from __future__ import annotations

import pytest
import torch
from harness.policy_backends import FULL_FINETUNE_BACKENDS, make_worker
from replay import ReplayTrainer, TrainerSpec, assert_metrics_match, padded, token_logprobs

from posttrain.algorithms.loss_functions import ClippedPGLoss, NLLLoss
from posttrain.config import PolicyConfig
from posttrain.data.batch import make_batch
from posttrain.data.chat import ChatEncoder

ANSWERS = ["4", "12", "123", "1234", "12345", "6", "98", "0"]  # + EOS: 2 to 6 completion tokens


@pytest.fixture(scope="module")
def chat(tiny_model_path):
    from transformers import AutoTokenizer

    return ChatEncoder(AutoTokenizer.from_pretrained(tiny_model_path))


@pytest.fixture(scope="module")
def batch(chat):
    pairs = [chat.sft_example(f"{i}+{i}=", answer) for i, answer in enumerate(ANSWERS)]
    out = make_batch([p for p, _ in pairs], [c for _, c in pairs], chat.tokenizer.pad_token_id)
    assert out.completion_mask.mean() < 0.5  # padding-heavy: most of the window is padding
    return out


def worker_and_replay(backend: str, model_path: str, temperature: float, **policy):
    from transformers import AutoModelForCausalLM

    cfg = PolicyConfig(**policy)
    worker = make_worker(backend, model_path, temperature, **policy)
    spec = TrainerSpec(cfg.lr, cfg.weight_decay, (cfg.betas[0], cfg.betas[1]), cfg.warmup_steps, cfg.max_grad_norm,
                       cfg.train_global_batch_size, temperature, 0.2, 0.3)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    return worker, ReplayTrainer(model, spec)


@pytest.mark.parametrize("backend", FULL_FINETUNE_BACKENDS)
@pytest.mark.parametrize("shift", [0.1, -0.1, 0.4], ids=["ratios-above-1", "ratios-below-1", "clipped"])
def test_grpo_step_metrics_read_real_tokens_only(backend, tiny_model_path, batch, shift: float) -> None:
    # one optimizer step of four micro-batches: every ratio is read at the weights extra was made for
    worker, replay = worker_and_replay(backend, tiny_model_path, 0.7, lr=1e-3, train_global_batch_size=8,
                                       train_micro_batch_size=2, max_grad_norm=0.5)
    mask = batch.completion_mask.bool()
    with torch.no_grad():
        current = padded(token_logprobs(replay.model.eval(), batch, 0.7), batch.completion_mask.shape[1])
    replay.model.train()
    garbage = torch.where(mask, torch.zeros_like(current), torch.full_like(current, 1e4))
    extra = {
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1.5, -1.5]),
        # ratio exp(shift) on every real token at the first step; -1e4 under the mask
        "old_logprobs": torch.where(mask, current - shift, -garbage),
        "ref_logprobs": torch.where(mask, current + 0.3, garbage),
    }
    logged = worker.train(batch, extra, ClippedPGLoss(clip_eps=0.2, kl_coef=0.3))
    expected = replay.train(batch, extra)
    assert_metrics_match(logged, expected, f"shift {shift}")
    assert logged["num_optimizer_steps"] == 1
    if shift == 0.1:  # every real ratio is ~1.105, every padding one 1: the minimum is above 1
        assert logged["probs_ratio_min"] > 1.0
    if shift == -0.1:
        assert logged["probs_ratio_max"] < 1.0
    if shift == 0.4:
        assert logged["clip_fraction"] > 0.2


@pytest.mark.parametrize("backend", FULL_FINETUNE_BACKENDS)
def test_sft_step_metrics_read_completion_tokens_only(backend, tiny_model_path, batch) -> None:
    worker, replay = worker_and_replay(backend, tiny_model_path, 1.0, lr=1e-3, train_global_batch_size=8,
                                       train_micro_batch_size=2, warmup_steps=4)
    replay.spec = TrainerSpec(**{**replay.spec.__dict__, "clip_eps": None, "kl_coef": None})
    for call in range(2):
        logged = worker.train(batch, {}, NLLLoss())
        expected = replay.train(batch, {})
        assert_metrics_match(logged, expected, f"call {call}")
    assert logged["lr"] == pytest.approx(2e-3 / 4)  # the second optimizer step of a 4-step warmup
