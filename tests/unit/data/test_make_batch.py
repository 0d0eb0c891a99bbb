"""Tests for posttrain.data.batch: bucketing, padding masks and row selection.

The masks are compared with expectations built by hand from the token lists: a mask that
covers one padding token (or misses one completion token) trains on garbage or drops signal
without any visible error.
"""

import pytest
import torch

from posttrain.data.batch import DEFAULT_SEQ_LEN_BUCKETS, TokenBatch, bucket, make_batch

PAD = 0
SEQ_BUCKETS = (8, 16, 32)
COMP_BUCKETS = (2, 4, 8)


def _expected(prompts, completions, seq_len, completion_len, pad_id=PAD):
    """Hand-built input_ids / attention_mask / completion_mask for unclamped rows."""
    ids, attn, comp = [], [], []
    for p, c in zip(prompts, completions, strict=True):
        row = list(p) + list(c)
        ids.append(row + [pad_id] * (seq_len - len(row)))
        attn.append([1] * len(row) + [0] * (seq_len - len(row)))
        comp.append([1.0] * len(c) + [0.0] * (completion_len - len(c)))
    return (torch.tensor(ids), torch.tensor(attn), torch.tensor(comp))


def _check(batch: TokenBatch, prompts, completions, seq_len, completion_len, pad_id=PAD) -> None:
    ids, attn, comp = _expected(prompts, completions, seq_len, completion_len, pad_id)
    assert batch.input_ids.shape == (len(prompts), seq_len)
    assert batch.completion_mask.shape == (len(prompts), completion_len)
    assert torch.equal(batch.input_ids, ids)
    assert torch.equal(batch.attention_mask, attn)
    assert torch.equal(batch.completion_mask, comp)
    assert batch.prompt_lens.tolist() == [len(p) for p in prompts]
    assert batch.completion_lens.tolist() == [len(c) for c in completions]


def test_dtypes_and_length() -> None:
    batch = make_batch([[5, 6]], [[7]], PAD, SEQ_BUCKETS, COMP_BUCKETS)
    assert len(batch) == 1
    assert batch.input_ids.dtype == torch.long
    assert batch.attention_mask.dtype == torch.long
    assert batch.prompt_lens.dtype == torch.long
    assert batch.completion_lens.dtype == torch.long
    assert batch.completion_mask.dtype == torch.float32


@pytest.mark.parametrize(
    ("total", "expected"),
    [(2, 8), (7, 8), (8, 8), (9, 16), (16, 16), (17, 32), (31, 32)],
)
def test_sequence_length_is_the_smallest_bucket_that_fits(total: int, expected: int) -> None:
    prompt = list(range(3, 3 + total - 1))  # total - 1 prompt tokens + 1 completion token
    batch = make_batch([prompt], [[9]], PAD, SEQ_BUCKETS, COMP_BUCKETS)
    assert batch.input_ids.shape[1] == expected


@pytest.mark.parametrize(("n_completion", "expected"), [(1, 2), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8)])
def test_completion_length_is_the_smallest_bucket_that_fits(n_completion: int, expected: int) -> None:
    batch = make_batch([[3, 4]], [list(range(5, 5 + n_completion))], PAD, SEQ_BUCKETS, COMP_BUCKETS)
    assert batch.completion_mask.shape[1] == expected
    _check(batch, [[3, 4]], [list(range(5, 5 + n_completion))], 16 if 2 + n_completion > 8 else 8, expected)


def test_bucket_is_set_by_the_longest_row() -> None:
    prompts = [[3], [3, 4, 5, 6, 7, 8, 9, 10, 11]]
    completions = [[5, 6, 7, 8, 9], [12]]
    batch = make_batch(prompts, completions, PAD, SEQ_BUCKETS, COMP_BUCKETS)
    # longest sequence 10 -> 16; longest completion 5 -> 8
    _check(batch, prompts, completions, 16, 8)


def test_completion_window_longer_than_every_completion_bucket_still_fits() -> None:
    completions = [list(range(3, 15))]  # 12 completion tokens > largest completion bucket 8
    batch = make_batch([[1]], completions, PAD, SEQ_BUCKETS, COMP_BUCKETS)
    assert batch.completion_mask.shape[1] >= 12
    assert batch.completion_mask.sum().item() == 12
    assert batch.completion_lens.tolist() == [12]


def test_completion_window_never_exceeds_the_sequence() -> None:
    batch = make_batch([[3]], [[4, 5, 6]], PAD, (4, 8), (8, 16))
    assert batch.input_ids.shape[1] == 4
    assert batch.completion_mask.shape[1] <= 4
    assert batch.completion_mask.sum().item() == 3


def test_bucket_function() -> None:
    assert bucket(1, (4, 8)) == 4
    assert bucket(4, (4, 8)) == 4
    assert bucket(5, (4, 8)) == 8
    assert bucket(100, (4, 8)) == 8  # none fits: the largest


def test_overlong_sequence_clamps_the_completion_and_reports_it() -> None:
    prompts = [[3] * 10, [4, 5]]
    completions = [list(range(5, 30)), [6, 7, 8]]  # 10 + 25 = 35 > 32
    batch = make_batch(prompts, completions, PAD, SEQ_BUCKETS, COMP_BUCKETS)
    assert batch.input_ids.shape[1] == 32
    assert batch.completion_lens.tolist() == [22, 3]
    assert batch.prompt_lens.tolist() == [10, 2]
    # the whole prompt and the first 22 completion tokens are kept, no padding in row 0
    assert batch.input_ids[0].tolist() == [3] * 10 + list(range(5, 27))
    assert batch.attention_mask[0].tolist() == [1] * 32
    assert batch.completion_mask[0].sum().item() == 22
    assert batch.completion_mask[0, :22].eq(1).all()
    assert batch.completion_mask[1].tolist()[:4] == [1.0, 1.0, 1.0, 0.0]
    assert batch.completion_mask[1].sum().item() == 3


def test_mixed_prompt_lengths_place_each_completion_after_its_prompt() -> None:
    prompts = [[11], [12, 13, 14], [15, 16, 17, 18, 19]]
    completions = [[21, 22, 23], [24], [25, 26]]
    batch = make_batch(prompts, completions, PAD, SEQ_BUCKETS, COMP_BUCKETS)
    _check(batch, prompts, completions, 8, 4)
    for b in range(3):
        p, n = int(batch.prompt_lens[b]), int(batch.completion_lens[b])
        assert batch.input_ids[b, p : p + n].tolist() == completions[b]


def test_pad_id_is_written_only_into_padding() -> None:
    pad_id = 99
    prompts = [[1, 2, 3], [4]]
    completions = [[5, 6], [7, 8, 9, 10]]
    batch = make_batch(prompts, completions, pad_id, SEQ_BUCKETS, COMP_BUCKETS)
    _check(batch, prompts, completions, 8, 4, pad_id=pad_id)
    is_pad = batch.input_ids == pad_id
    assert torch.equal(is_pad, batch.attention_mask == 0)
    assert is_pad.sum().item() == 2 * 8 - 5 - 5


def test_pad_id_equal_to_a_real_token_is_masked_by_position_not_value() -> None:
    prompts, completions = [[0, 1]], [[0, 0]]  # real tokens equal to pad_id 0
    batch = make_batch(prompts, completions, 0, SEQ_BUCKETS, COMP_BUCKETS)
    assert batch.attention_mask[0].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert batch.completion_mask[0].tolist() == [1.0, 1.0]


def test_single_token_completion() -> None:
    batch = make_batch([[3, 4, 5]], [[6]], PAD, SEQ_BUCKETS, COMP_BUCKETS)
    _check(batch, [[3, 4, 5]], [[6]], 8, 2)
    assert batch.completion_mask.tolist() == [[1.0, 0.0]]


def test_empty_completion_gives_an_all_zero_mask() -> None:
    prompts, completions = [[3, 4], [5]], [[], [6, 7]]
    batch = make_batch(prompts, completions, PAD, SEQ_BUCKETS, COMP_BUCKETS)
    _check(batch, prompts, completions, 8, 2)
    assert batch.completion_mask[0].sum().item() == 0
    assert batch.completion_lens.tolist() == [0, 2]


def test_all_completions_empty_still_gives_a_window() -> None:
    batch = make_batch([[3, 4]], [[]], PAD, SEQ_BUCKETS, COMP_BUCKETS)
    assert batch.completion_mask.shape[1] >= 1
    assert batch.completion_mask.sum().item() == 0
    assert batch.attention_mask.tolist() == [[1, 1, 0, 0, 0, 0, 0, 0]]


def test_identical_completions_give_identical_rows() -> None:
    prompts, completions = [[3, 4]] * 4, [[5, 6, 1]] * 4
    batch = make_batch(prompts, completions, PAD, SEQ_BUCKETS, COMP_BUCKETS)
    _check(batch, prompts, completions, 8, 4)
    for field in ("input_ids", "attention_mask", "completion_mask"):
        rows = getattr(batch, field)
        assert (rows == rows[0]).all()


def test_inputs_are_not_mutated() -> None:
    prompts, completions = [[3, 4]], [[5, 6, 7]]
    make_batch(prompts, completions, PAD, (4,), COMP_BUCKETS)  # clamps the completion
    assert completions == [[5, 6, 7]] and prompts == [[3, 4]]


@pytest.mark.parametrize("prompt_len", [32, 40])
def test_prompt_filling_the_largest_bucket_raises(prompt_len: int) -> None:
    with pytest.raises(ValueError, match="largest sequence bucket"):
        make_batch([[3, 4], [5] * prompt_len], [[6], [7]], PAD, SEQ_BUCKETS, COMP_BUCKETS)


def test_prompt_one_short_of_the_largest_bucket_keeps_one_completion_token() -> None:
    batch = make_batch([[5] * 31], [[6, 7, 8]], PAD, SEQ_BUCKETS, COMP_BUCKETS)
    assert batch.completion_lens.tolist() == [1]
    assert batch.input_ids[0, 31].item() == 6


def test_empty_batch_raises() -> None:
    with pytest.raises(ValueError, match="at least one"):
        make_batch([], [], PAD, SEQ_BUCKETS, COMP_BUCKETS)


def test_empty_prompt_raises() -> None:
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        make_batch([[3], []], [[4], [5]], PAD, SEQ_BUCKETS, COMP_BUCKETS)


@pytest.mark.parametrize(("n_prompts", "n_completions"), [(2, 1), (1, 2), (0, 1)])
def test_mismatched_lengths_raise(n_prompts: int, n_completions: int) -> None:
    with pytest.raises(ValueError, match="prompts but"):
        make_batch([[3]] * n_prompts, [[4]] * n_completions, PAD, SEQ_BUCKETS, COMP_BUCKETS)


@pytest.mark.parametrize(
    ("seq_buckets", "comp_buckets", "name"),
    [
        ((16, 8, 32), COMP_BUCKETS, "seq_len_buckets"),
        ((8, 8, 16), COMP_BUCKETS, "seq_len_buckets"),
        ((), COMP_BUCKETS, "seq_len_buckets"),
        ((0, 8), COMP_BUCKETS, "seq_len_buckets"),
        (SEQ_BUCKETS, (4, 2), "completion_len_buckets"),
    ],
)
def test_unsorted_or_bad_buckets_raise(seq_buckets, comp_buckets, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        make_batch([[3]], [[4]], PAD, seq_buckets, comp_buckets)


def test_default_buckets() -> None:
    batch = make_batch([[3] * 6], [[4, 5, 6, 7]], PAD)
    assert batch.input_ids.shape == (1, 10)  # 10 tokens: a quarter-step bucket (not 12, not 16)
    assert batch.completion_mask.shape == (1, 4)
    batch = make_batch([[3] * 6], [[4, 5, 6, 7, 8]], PAD)
    assert batch.input_ids.shape == (1, 12)
    batch = make_batch([[3] * 700], [[4] * 100], PAD)
    assert batch.input_ids.shape == (1, 896)  # 800 tokens: padded by at most a quarter
    for small, large in zip(DEFAULT_SEQ_LEN_BUCKETS, DEFAULT_SEQ_LEN_BUCKETS[1:], strict=False):
        assert large <= small * 1.25, (small, large)  # padding <= 25% of the sequence


def test_select_returns_the_right_rows() -> None:
    prompts = [[10 + i] * (i + 1) for i in range(5)]
    completions = [[20 + i] * (5 - i) for i in range(5)]
    batch = make_batch(prompts, completions, PAD, SEQ_BUCKETS, COMP_BUCKETS)
    index = torch.tensor([3, 0, 4])
    sub = batch.select(index)
    assert isinstance(sub, TokenBatch) and len(sub) == 3
    for field in ("input_ids", "attention_mask", "prompt_lens", "completion_lens", "completion_mask"):
        assert torch.equal(getattr(sub, field), getattr(batch, field)[index]), field
    assert sub.prompt_lens.tolist() == [4, 1, 5]
    sliced = batch.select(slice(1, 3))
    assert len(sliced) == 2
    assert torch.equal(sliced.input_ids, batch.input_ids[1:3])
    assert torch.equal(sliced.completion_mask, batch.completion_mask[1:3])
    assert sliced.completion_lens.tolist() == [4, 3]


def test_empty_buckets_are_skipped() -> None:
    """Rows of 3 and 20 tokens: the 8- and 16-buckets stay empty, the batch takes 32 (not 64)."""
    prompts, completions = [[3, 4], [5] * 18], [[6], [7, 8]]
    batch = make_batch(prompts, completions, PAD, (8, 16, 32, 64), COMP_BUCKETS)
    _check(batch, prompts, completions, 32, 2)


def test_padding_mask_counts_exactly_the_real_tokens_when_clamped() -> None:
    prompts = [[3] * 30, [4] * 5, [5]]
    completions = [[6] * 7, [7] * 4, []]  # row 0 clamps to 2 completion tokens
    batch = make_batch(prompts, completions, PAD, SEQ_BUCKETS, COMP_BUCKETS)
    assert batch.completion_lens.tolist() == [2, 4, 0]
    assert batch.attention_mask.sum(1).tolist() == [32, 9, 1]
    assert batch.completion_mask.sum(1).tolist() == [2.0, 4.0, 0.0]
    # the mask is a prefix of ones: no hole, no token past the completion
    for b, n in enumerate(batch.completion_lens.tolist()):
        assert batch.completion_mask[b, :n].eq(1).all() and batch.completion_mask[b, n:].eq(0).all()


def test_a_bucket_of_one_token_is_a_valid_size() -> None:
    # "positive sizes": 1 is the smallest; a one-token completion window is a real window
    batch = make_batch([[3]], [[4]], PAD, (1, 2), (1, 2))
    _check(batch, [[3]], [[4]], 2, 1)


def test_an_all_empty_batch_gets_the_narrowest_completion_window() -> None:
    # no completion token anywhere: the window is the first completion bucket, not a wider one
    batch = make_batch([[3, 4]], [[]], PAD, SEQ_BUCKETS, (1, 2, 4))
    assert batch.completion_mask.tolist() == [[0.0]]


@pytest.mark.parametrize(
    ("seq_buckets", "comp_buckets", "name"),
    [((16, 8), COMP_BUCKETS, "seq_len_buckets"), (SEQ_BUCKETS, (4, 2), "completion_len_buckets")],
)
def test_a_bad_bucket_list_is_named_exactly_in_the_error(seq_buckets, comp_buckets, name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be ascending positive sizes, got "):
        make_batch([[3]], [[4]], PAD, seq_buckets, comp_buckets)


def test_the_empty_batch_error_says_what_make_batch_needs() -> None:
    with pytest.raises(ValueError, match=r"^make_batch needs at least one sequence$"):
        make_batch([], [], PAD, SEQ_BUCKETS, COMP_BUCKETS)


def test_a_masked_batch_keeps_every_rows_tokens_and_trains_none_of_them() -> None:
    batch = make_batch([[5, 6], [7]], [[4, 4, 4], [3]], PAD, SEQ_BUCKETS, COMP_BUCKETS)
    masked = batch.masked()
    for name in ("input_ids", "attention_mask", "prompt_lens", "completion_lens"):
        assert torch.equal(getattr(masked, name), getattr(batch, name)), name
    assert masked.completion_mask.shape == batch.completion_mask.shape
    assert masked.completion_mask.dtype == batch.completion_mask.dtype and not masked.completion_mask.any()
    assert batch.completion_mask.sum() == 4  # the original keeps its mask
