"""Tests for posttrain.ops: completion logprobs, entropy and masked reductions.

The reference for every check is an explicit loop over (b, j): completion token j of
sequence b sits at ``prompt_lens[b] + j`` and is scored by the logits one position earlier.
An off-by-one here trains on the wrong tokens and still prints a loss, so it is pinned hard.
"""

import math

import pytest
import torch

from posttrain.ops import (
    completion_logits,
    compute_entropy,
    compute_logprobs,
    compute_logprobs_and_entropy,
    masked_mean,
    masked_sum,
)


def _random_case(batch: int = 3, seq: int = 10, vocab: int = 7, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, seq, vocab, generator=gen) * 3
    input_ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    return logits, input_ids


def _reference_logprobs(logits, input_ids, prompt_lens, completion_len, temperature=1.0):
    """Hand computation; positions past the sequence are left at NaN (callers avoid them)."""
    batch, seq, _ = logits.shape
    out = torch.full((batch, completion_len), float("nan"))
    for b in range(batch):
        p = int(prompt_lens[b])
        for j in range(completion_len):
            if p + j >= seq:
                continue
            dist = torch.log_softmax(logits[b, p + j - 1].double() / temperature, dim=-1)
            out[b, j] = dist[input_ids[b, p + j]].float()
    return out


def _reference_entropy(logits, prompt_lens, completion_len, temperature=1.0):
    batch = logits.shape[0]
    out = torch.empty(batch, completion_len)
    for b in range(batch):
        p = int(prompt_lens[b])
        for j in range(completion_len):
            logp = torch.log_softmax(logits[b, p + j - 1].double() / temperature, dim=-1)
            out[b, j] = -(logp.exp() * logp).sum().float()
    return out


def test_logprobs_equal_hand_computation() -> None:
    logits, input_ids = _random_case()
    prompt_lens = torch.tensor([4, 4, 4])
    got = compute_logprobs(logits, input_ids, prompt_lens, completion_len=5)
    assert got.shape == (3, 5)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, _reference_logprobs(logits, input_ids, prompt_lens, 5))


def test_mixed_prompt_lens_read_each_rows_own_positions() -> None:
    logits, input_ids = _random_case(batch=4, seq=12)
    prompt_lens = torch.tensor([1, 3, 6, 8])
    completion_len = 4  # 8 + 4 == 12 == S: every position in range
    got = compute_logprobs(logits, input_ids, prompt_lens, completion_len)
    torch.testing.assert_close(got, _reference_logprobs(logits, input_ids, prompt_lens, completion_len))
    # and a single row computed alone gives the same numbers (no cross-row leakage)
    for b in range(4):
        alone = compute_logprobs(logits[b : b + 1], input_ids[b : b + 1], prompt_lens[b : b + 1], completion_len)
        torch.testing.assert_close(alone[0], got[b])


def test_logprobs_of_a_peaked_distribution_pick_the_scored_token() -> None:
    """Logits that put all mass on the next token: logprob 0 only with the right alignment."""
    vocab, seq = 5, 6
    input_ids = torch.tensor([[0, 1, 2, 3, 4, 0]])
    logits = torch.full((1, seq, vocab), -50.0)
    for t in range(seq - 1):
        logits[0, t, input_ids[0, t + 1]] = 50.0  # position t predicts token t+1
    got = compute_logprobs(logits, input_ids, torch.tensor([2]), completion_len=4)
    torch.testing.assert_close(got, torch.zeros(1, 4), atol=1e-6, rtol=0)


@pytest.mark.parametrize("shift", [-1, 1])
def test_off_by_one_prompt_lens_give_different_logprobs(shift: int) -> None:
    logits, input_ids = _random_case(seed=1)
    prompt_lens = torch.tensor([3, 4, 5])
    right = compute_logprobs(logits, input_ids, prompt_lens, completion_len=4)
    wrong = compute_logprobs(logits, input_ids, prompt_lens + shift, completion_len=4)
    assert not torch.allclose(right, wrong)
    # every row differs, not just one
    assert ((right - wrong).abs().amax(dim=1) > 1e-3).all()


@pytest.mark.parametrize("temperature", [0.5, 0.7, 2.0])
def test_temperature_scales_the_logits(temperature: float) -> None:
    logits, input_ids = _random_case(seed=2)
    prompt_lens = torch.tensor([2, 3, 5])
    got = compute_logprobs(logits, input_ids, prompt_lens, 5, temperature=temperature)
    torch.testing.assert_close(got, _reference_logprobs(logits, input_ids, prompt_lens, 5, temperature))
    plain = compute_logprobs(logits, input_ids, prompt_lens, 5)
    assert not torch.allclose(got, plain)
    # dividing the logits by T by hand is the same thing
    torch.testing.assert_close(got, compute_logprobs(logits / temperature, input_ids, prompt_lens, 5))


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_non_positive_temperature_raises(temperature: float) -> None:
    logits, input_ids = _random_case()
    with pytest.raises(ValueError, match="temperature"):
        compute_logprobs(logits, input_ids, torch.tensor([2, 2, 2]), 3, temperature=temperature)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extreme_logits_give_finite_logprobs(dtype: torch.dtype) -> None:
    vocab, seq = 6, 8
    gen = torch.Generator().manual_seed(3)
    signs = torch.randint(0, 2, (2, seq, vocab), generator=gen).float() * 2 - 1
    logits = (signs * 1e4).to(dtype)
    input_ids = torch.randint(0, vocab, (2, seq), generator=gen)
    prompt_lens = torch.tensor([2, 4])
    got = compute_logprobs(logits, input_ids, prompt_lens, 4)
    assert got.dtype == torch.float32
    assert torch.isfinite(got).all()
    assert (got <= 0).all()
    torch.testing.assert_close(got, _reference_logprobs(logits.float(), input_ids, prompt_lens, 4))
    entropy = compute_entropy(logits, prompt_lens, 4)
    assert torch.isfinite(entropy).all()


def test_bf16_logits_are_upcast_before_log_softmax() -> None:
    logits, input_ids = _random_case(seed=4)
    bf16 = logits.to(torch.bfloat16)
    prompt_lens = torch.tensor([2, 3, 4])
    got = compute_logprobs(bf16, input_ids, prompt_lens, 5)
    assert got.dtype == torch.float32
    # the same numbers as fp32 math on the bf16-rounded logits (not bf16 math)
    torch.testing.assert_close(got, _reference_logprobs(bf16.float(), input_ids, prompt_lens, 5))


@pytest.mark.parametrize("prompt_lens", [[0, 2, 2], [2, 10, 2], [2, 11, 2], [-1, 2, 2]])
def test_prompt_lens_out_of_range_raise(prompt_lens: list[int]) -> None:
    logits, input_ids = _random_case(seq=10)
    with pytest.raises(ValueError, match="prompt_lens"):
        compute_logprobs(logits, input_ids, torch.tensor(prompt_lens), 3)
    with pytest.raises(ValueError, match="prompt_lens"):
        compute_entropy(logits, torch.tensor(prompt_lens), 3)


def test_prompt_lens_at_the_edges_are_accepted() -> None:
    logits, input_ids = _random_case(seq=10)
    prompt_lens = torch.tensor([1, 9, 5])
    got = compute_logprobs(logits, input_ids, prompt_lens, 1)
    torch.testing.assert_close(got, _reference_logprobs(logits, input_ids, prompt_lens, 1))


def test_completion_window_past_the_sequence_is_clamped_not_an_error() -> None:
    """Positions beyond S are clamped (and must be masked); in-range ones stay exact."""
    logits, input_ids = _random_case(batch=2, seq=8)
    prompt_lens = torch.tensor([3, 6])
    got = compute_logprobs(logits, input_ids, prompt_lens, 4)
    assert got.shape == (2, 4) and torch.isfinite(got).all()
    ref = _reference_logprobs(logits, input_ids, prompt_lens, 4)
    torch.testing.assert_close(got[0], ref[0])
    torch.testing.assert_close(got[1, :2], ref[1, :2])


def test_completion_logits_select_the_predicting_positions() -> None:
    logits, _ = _random_case(batch=2, seq=9)
    prompt_lens = torch.tensor([2, 5])
    got = completion_logits(logits, prompt_lens, 3)
    assert got.shape == (2, 3, 7)
    for b, p in enumerate([2, 5]):
        for j in range(3):
            assert torch.equal(got[b, j], logits[b, p + j - 1])


def test_typical_grpo_shape_runs_and_has_gradients() -> None:
    batch, seq, vocab, completion_len = 128, 16, 17, 4
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(batch, seq, vocab, generator=gen).requires_grad_()
    input_ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    prompt_lens = torch.randint(4, 8, (batch,), generator=gen)
    got = compute_logprobs(logits, input_ids, prompt_lens, completion_len)
    assert got.shape == (batch, completion_len)
    assert torch.isfinite(got).all() and (got <= 0).all()
    expected = _reference_logprobs(logits.detach(), input_ids, prompt_lens, completion_len)
    torch.testing.assert_close(got.detach(), expected)
    got.sum().backward()
    # gradient reaches exactly the predicting positions of each row
    touched = logits.grad.abs().sum(-1) > 0  # [B, S]
    expected = torch.zeros(batch, seq, dtype=torch.bool)
    for b in range(batch):
        p = int(prompt_lens[b])
        expected[b, p - 1 : p - 1 + completion_len] = True
    assert torch.equal(touched, expected)


def test_entropy_equals_hand_computation() -> None:
    logits, _ = _random_case(batch=3, seq=10)
    prompt_lens = torch.tensor([1, 4, 6])
    got = compute_entropy(logits, prompt_lens, 4)
    assert got.shape == (3, 4) and got.dtype == torch.float32
    torch.testing.assert_close(got, _reference_entropy(logits, prompt_lens, 4))


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_entropy_is_of_the_sampling_distribution_at_the_temperature(temperature: float) -> None:
    logits, _ = _random_case(batch=2, seq=8)
    prompt_lens = torch.tensor([2, 3])
    got = compute_entropy(logits, prompt_lens, 4, temperature)
    torch.testing.assert_close(got, _reference_entropy(logits, prompt_lens, 4, temperature))
    at_one = compute_entropy(logits, prompt_lens, 4)
    # a colder distribution is sharper, a warmer one flatter
    assert ((got < at_one) if temperature < 1 else (got > at_one)).all()
    with pytest.raises(ValueError, match="temperature must be > 0"):
        compute_entropy(logits, prompt_lens, 4, 0.0)


@pytest.mark.parametrize("vocab", [2, 17, 300])
def test_entropy_of_uniform_logits_is_log_vocab(vocab: int) -> None:
    logits = torch.full((2, 6, vocab), 3.25)
    got = compute_entropy(logits, torch.tensor([2, 3]), 3)
    torch.testing.assert_close(got, torch.full((2, 3), math.log(vocab)))


def test_entropy_of_a_peaked_distribution_is_near_zero() -> None:
    logits = torch.full((1, 5, 9), -1e4)
    logits[..., 3] = 1e4
    got = compute_entropy(logits, torch.tensor([2]), 3)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, torch.zeros(1, 3), atol=1e-6, rtol=0)


def test_masked_sum_and_mean_ignore_masked_entries() -> None:
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, -50.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    assert masked_sum(values, mask).item() == pytest.approx(10.0)
    assert masked_mean(values, mask).item() == pytest.approx(2.5)
    # a bool/int mask works the same
    assert masked_mean(values, mask.bool()).item() == pytest.approx(2.5)
    assert masked_mean(values, mask.long()).item() == pytest.approx(2.5)


def test_masked_mean_of_an_empty_mask_is_zero_not_nan() -> None:
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    got = masked_mean(values, torch.zeros(2, 2))
    assert not torch.isnan(got)
    assert got.item() == 0.0


def test_masked_mean_gradient_is_mask_over_count() -> None:
    values = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    masked_mean(values, mask).backward()
    torch.testing.assert_close(values.grad, mask / 3)


def test_a_grpo_batch_from_make_batch_matches_the_hand_computation() -> None:
    """16 prompts x 8 completions of 1-4 tokens, padded by ``make_batch``: every unmasked
    logprob equals the loop reference, and the mask covers exactly the completion tokens."""
    from posttrain.data.batch import make_batch

    gen = torch.Generator().manual_seed(6)
    vocab = 17
    prompts = [torch.randint(1, vocab, (int(torch.randint(4, 9, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(16) for _ in range(8)]
    completions = [torch.randint(1, vocab, (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen).tolist()
                   for _ in range(128)]
    batch = make_batch(prompts, completions, pad_id=0)
    logits = torch.randn(128, batch.input_ids.shape[1], vocab, generator=gen) * 4
    got = compute_logprobs(logits, batch.input_ids, batch.prompt_lens, batch.completion_mask.shape[1])
    ref = _reference_logprobs(logits, batch.input_ids, batch.prompt_lens, batch.completion_mask.shape[1])
    mask = batch.completion_mask.bool()
    assert mask.sum().item() == sum(len(c) for c in completions)
    torch.testing.assert_close(got[mask], ref[mask])
    for b, c in enumerate(completions):  # the scored tokens are the completion's own tokens
        p = int(batch.prompt_lens[b])
        assert batch.input_ids[b, p : p + len(c)].tolist() == c


def test_logprobs_and_entropy_from_one_pass_equal_the_hand_computations() -> None:
    """The train step's fused op: the logprobs carry the gradient, the entropies carry none."""
    logits, input_ids = _random_case(batch=4, seq=12)
    logits.requires_grad_(True)
    prompt_lens = torch.tensor([1, 3, 6, 8])
    logprobs, entropy = compute_logprobs_and_entropy(logits, input_ids, prompt_lens, 4, temperature=0.7)
    torch.testing.assert_close(logprobs, _reference_logprobs(logits.detach(), input_ids, prompt_lens, 4, 0.7))
    torch.testing.assert_close(entropy, _reference_entropy(logits.detach(), prompt_lens, 4, 0.7))
    assert logprobs.requires_grad and not entropy.requires_grad
    logprobs.sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="temperature must be > 0"):
        compute_logprobs_and_entropy(logits, input_ids, prompt_lens, 4, temperature=0.0)
