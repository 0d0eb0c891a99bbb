"""SFT trains on exactly the response tokens: the solution and the EOS after it.

The loss of ``evaluation.reference_batch`` (SFT's batches) through the policy worker equals a negative log-likelihood
computed here problem by problem, with no batching, padding or chat template: the question's
characters as the prompt, the solution's characters and EOS as the scored tokens. And the
loss does not depend on the model's predictions of prompt or padding tokens: their logits
get exactly zero gradient.
"""

from __future__ import annotations

import pytest
import torch
from harness.policy_backends import BACKENDS, make_worker

from posttrain.algorithms.evaluation import reference_batch
from posttrain.algorithms.loss_functions import NLLLoss
from posttrain.data.chat import ChatEncoder
from posttrain.data.types import MathProblem

# prompts of 4 to 6 characters, solutions of 1 to 4: mixed lengths, padding on both sides of the window
PROBLEMS = [MathProblem(q, s, s) for q, s in [("1+1=", "2"), ("12+34=", "46"), ("99+9=", "108"), ("7+993=", "1000")]]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def independent_nll(model: torch.nn.Module, tokenizer, problems: list[MathProblem]) -> float:
    """Token-mean NLL of solution + EOS given the question, one unpadded sequence at a time."""
    total, count = 0.0, 0
    with torch.no_grad():
        for problem in problems:
            prompt = tokenizer.encode(problem.question)
            response = tokenizer.encode(problem.solution) + [tokenizer.eos_token_id]
            ids = torch.tensor([prompt + response])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)  # [S, V]
            for j, token in enumerate(response):
                total -= float(logp[len(prompt) + j - 1, token])  # predicted from the position before
                count += 1
    return total / count


@pytest.mark.parametrize("backend", BACKENDS)
def test_sft_loss_is_the_nll_of_exactly_the_solution_tokens(backend, tiny_model_path, tokenizer) -> None:
    from transformers import AutoModelForCausalLM

    policy = make_worker(backend, tiny_model_path, lr=1e-3, train_global_batch_size=4, train_micro_batch_size=2)
    start = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()  # the policy's start
    expected = independent_nll(start, tokenizer, PROBLEMS)
    batch = reference_batch(ChatEncoder(tokenizer), PROBLEMS)
    metrics = policy.train(batch, {}, NLLLoss())  # the loss is measured before the update
    assert metrics["loss"] == pytest.approx(expected, rel=1e-5)


def test_prompt_and_padding_positions_get_no_gradient(tiny_model_path, tokenizer) -> None:
    policy = make_worker("hf", tiny_model_path, lr=1e-3, train_global_batch_size=4, train_micro_batch_size=4)
    batch = reference_batch(ChatEncoder(tokenizer), PROBLEMS)
    captured = []

    def keep_logits(module, args, output):
        output.logits.retain_grad()
        captured.append(output.logits)

    handle = policy.model.register_forward_hook(keep_logits)
    try:
        policy.train(batch, {}, NLLLoss())
    finally:
        handle.remove()
    grad = captured[0].grad  # [B, S, V]: d loss / d logits
    for b, problem in enumerate(PROBLEMS):
        p = len(tokenizer.encode(problem.question))
        n = len(tokenizer.encode(problem.solution)) + 1  # + EOS
        # logits at position t predict token t + 1: only p - 1 .. p + n - 2 predict response tokens
        scored = set(range(p - 1, p + n - 1))
        for t in range(grad.shape[1]):
            row = grad[b, t].abs().max().item()
            assert (row > 0) == (t in scored), (problem.question, t, row)
