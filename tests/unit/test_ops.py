"""Tests for posttrain.ops: completion logprobs, entropy and masked reductions.

The reference for every check is an explicit loop over (b, j): completion token j of
sequence b sits at ``prompt_lens[b] + j`` and is scored by the logits one position earlier.
An off-by-one here trains on the wrong tokens and still prints a loss, so it is pinned hard.
"""

import math

import pytest
import torch
from harness.sampling_oracle import kept_by_hand

from posttrain.ops import (
    completion_logits,
    completion_positions,
    compute_entropy,
    compute_logprobs,
    compute_logprobs_and_entropy,
    masked_mean,
    masked_sum,
    sampling_log_softmax,
    sampling_mask,
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


# --- the sampling distribution: temperature, top-k, top-p (issue 31, class 2) ---------------------


def _truncated_logprobs_by_hand(logits, input_ids, prompt_lens, completion_len, temperature, top_k, top_p):
    """``log(p_t / sum of p over the kept tokens)`` at ``logits / T``, in float64; NaN past a row."""
    batch, seq, _ = logits.shape
    out = torch.full((batch, completion_len), float("nan"))
    entropy = torch.full((batch, completion_len), float("nan"))
    for b in range(batch):
        p = int(prompt_lens[b])
        for j in range(completion_len):
            if p + j >= seq:
                continue
            scaled = logits[b, p + j - 1].double() / temperature
            kept = kept_by_hand(scaled, top_k, top_p)
            logp = torch.log_softmax(scaled[kept], -1)
            token = int(input_ids[b, p + j])
            if token in kept:
                out[b, j] = logp[kept.index(token)].float()
            entropy[b, j] = -(logp.exp() * logp).sum().float()
    return out, entropy


# (temperature, top_k, top_p): each alone, and all three (top-p after the temperature and over
# the top-k tokens only: 0.5 sharpens, so the top-p set is smaller than it would be at 1).
SAMPLING = [(0.6, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.6), (0.5, 5, 0.8), (1.7, 4, 0.9)]


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), SAMPLING)
def test_logprobs_of_the_sampling_distribution_equal_the_hand_computation(temperature, top_k, top_p) -> None:
    """Sampled tokens (drawn here from the very distribution) are scored under logits / T
    renormalised over the top-k / top-p set, and the entropy is that distribution's."""
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(4, 12, 9, generator=gen) * 2
    prompt_lens = torch.tensor([2, 4, 5, 7])
    input_ids = torch.randint(0, 9, (4, 12), generator=gen)
    for b in range(4):  # each completion token drawn from its position's truncated distribution
        for j in range(5):
            pos = int(prompt_lens[b]) + j
            scaled = logits[b, pos - 1] / temperature
            kept = kept_by_hand(scaled, top_k, top_p)
            input_ids[b, pos] = kept[int(torch.multinomial(torch.softmax(scaled[kept], -1), 1, generator=gen))]
    expected, entropy = _truncated_logprobs_by_hand(logits, input_ids, prompt_lens, 5, temperature, top_k, top_p)
    got = compute_logprobs(logits, input_ids, prompt_lens, 5, temperature, top_k, top_p)
    torch.testing.assert_close(got, expected)
    fused, fused_entropy = compute_logprobs_and_entropy(logits, input_ids, prompt_lens, 5, temperature, top_k, top_p)
    torch.testing.assert_close(fused, expected)
    torch.testing.assert_close(fused_entropy, entropy)
    torch.testing.assert_close(compute_entropy(logits, prompt_lens, 5, temperature, top_k, top_p), entropy)
    if top_k or top_p < 1.0:  # the truncation changes the numbers (the check is not vacuous)
        plain = compute_logprobs(logits, input_ids, prompt_lens, 5, temperature)
        assert (got - plain).abs().mean() > 0.05


def test_the_kept_set_is_the_one_hugging_faces_warpers_keep() -> None:
    """The same tokens as transformers' TopK / TopP warpers, on many random positions."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    from posttrain.ops import sampling_mask

    gen = torch.Generator().manual_seed(5)
    scores = torch.randn(400, 17, generator=gen) * 1.5
    for top_k, top_p in ((4, 1.0), (0, 0.7), (6, 0.85), (17, 0.5), (1, 1.0)):
        warped = scores
        if top_k:
            warped = TopKLogitsWarper(top_k)(None, warped)
        if top_p < 1.0:
            warped = TopPLogitsWarper(top_p)(None, warped)
        assert torch.equal(sampling_mask(scores, top_k, top_p), torch.isfinite(warped)), (top_k, top_p)


def test_a_sampled_token_outside_this_sides_set_keeps_a_finite_logprob() -> None:
    """A token the trainer's top-k would drop (an engine that rounded the boundary the other
    way; the reference policy) is scored over the kept set plus itself, never -inf: a -inf on
    both sides of the ratio is NaN, and a NaN step is skipped."""
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [3.0, 2.0, 1.0, 0.5], [0.0, 0.0, 0.0, 0.0]]], requires_grad=True)
    input_ids = torch.tensor([[1, 0, 3]])  # completion token 3 (logit 0.5) is outside the top 2
    got = compute_logprobs(logits, input_ids, torch.tensor([2]), 1, temperature=1.0, top_k=2)
    expected = 0.5 - torch.logsumexp(torch.tensor([3.0, 2.0, 0.5]), 0)
    torch.testing.assert_close(got, expected.reshape(1, 1))
    got.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


def test_bf16_logits_are_upcast_before_the_fused_log_softmax() -> None:
    """The train step's op (logprobs and entropy in one pass) computes in float32 on a bf16
    model's logits: the numbers of fp32 math on the bf16-rounded logits, not of bf16 math."""
    logits, input_ids = _random_case(seed=6)
    bf16 = (logits * 4).to(torch.bfloat16)
    prompt_lens = torch.tensor([2, 3, 4])
    logprobs, entropy = compute_logprobs_and_entropy(bf16, input_ids, prompt_lens, 5, temperature=0.7)
    assert logprobs.dtype == entropy.dtype == torch.float32
    torch.testing.assert_close(logprobs, _reference_logprobs(bf16.float(), input_ids, prompt_lens, 5, 0.7),
                               rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, _reference_entropy(bf16.float(), prompt_lens, 5, 0.7), rtol=0, atol=1e-5)


# --- behaviours the automatic mutation run (tests/mutation/run_auto.sh) found untested ------------


def test_the_prompt_lens_error_states_the_range_of_this_sequence_length() -> None:
    logits, _ = _random_case(batch=1, seq=5)
    with pytest.raises(ValueError, match=r"^prompt_lens must lie in \[1, 4\], got \[5\]$"):
        completion_logits(logits, torch.tensor([5]), 2)


def test_completion_positions_are_on_the_device_of_prompt_lens() -> None:
    # the meta device stands in for an accelerator: a CPU arange would not add to it
    positions = completion_positions(torch.tensor([1, 2], device="meta"), 3, 8)
    assert positions.device.type == "meta" and positions.shape == (2, 3)


def test_the_defaults_are_plain_log_softmax_at_temperature_one_over_the_whole_vocabulary() -> None:
    logits, input_ids = _random_case(seed=8)
    prompt_lens = torch.tensor([2, 3, 4])
    torch.testing.assert_close(sampling_log_softmax(logits), torch.log_softmax(logits, dim=-1))
    assert sampling_mask(logits).all()
    logprobs, entropy = compute_logprobs_and_entropy(logits, input_ids, prompt_lens, 5)
    torch.testing.assert_close(logprobs, _reference_logprobs(logits, input_ids, prompt_lens, 5))
    torch.testing.assert_close(entropy, _reference_entropy(logits, prompt_lens, 5))


def test_top_k_of_one_keeps_only_the_most_likely_token() -> None:
    logits = torch.tensor([[0.5, 2.0, -1.0, 1.0]])
    logp = sampling_log_softmax(logits, top_k=1)
    assert logp[0, 1].item() == 0.0
    assert torch.isinf(logp[0, [0, 2, 3]]).all()


def test_the_fused_op_also_keeps_a_sampled_token_outside_this_sides_set() -> None:
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [3.0, 2.0, 1.0, 0.5], [0.0, 0.0, 0.0, 0.0]]])
    input_ids = torch.tensor([[1, 0, 3]])  # completion token 3 (logit 0.5) is outside the top 2
    logprobs, _ = compute_logprobs_and_entropy(logits, input_ids, torch.tensor([2]), 1, top_k=2)
    expected = 0.5 - torch.logsumexp(torch.tensor([3.0, 2.0, 0.5]), 0)
    torch.testing.assert_close(logprobs, expected.reshape(1, 1))


def test_top_p_of_one_keeps_even_a_token_whose_probability_underflows_to_zero() -> None:
    keep = sampling_mask(torch.tensor([0.0, -1000.0]), top_p=1.0)
    assert keep.tolist() == [True, True]


def test_top_p_drops_a_token_whose_cumulative_probability_is_exactly_one_minus_top_p() -> None:
    # uniform over 4: ascending cumulative sums 0.25, 0.5, 0.75, 1.0 exactly; 1 - top_p = 0.5 drops two
    assert sampling_mask(torch.zeros(4), top_p=0.5).sum().item() == 2


def test_a_top_k_of_the_whole_vocabulary_keeps_every_token_whatever_its_logit() -> None:
    logits = torch.tensor([1.0, float("nan"), -float("inf"), 0.0])
    assert sampling_mask(logits, top_k=4).all()
