"""Tests for posttrain.rollouts.filters: the staleness filter of asynchronous GRPO.

An off-by-one in the bound, a group split between kept and dropped, or a mistyped version
that compares as something (``True == 1``, ``1.5 < 2``) all still train and print a loss;
only exact keep/drop sets and raised errors tell.
"""

from __future__ import annotations

import copy

import pytest
from unit.rollouts.rollout_helpers import ids, make_group

from posttrain.errors import PosttrainError, RolloutTagError
from posttrain.rollouts.filters import RolloutFilter, StalenessFilter, describe, staleness
from posttrain.rollouts.samples import TAGS, RolloutSample


def _one_line(err: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("k", [0, 1, 3])
def test_staleness_equal_to_the_bound_is_kept_and_one_more_is_dropped(k: int) -> None:
    current = 10
    at_bound, over = make_group(0, version=current - k), make_group(1, version=current - k - 1)
    fresh = make_group(2, version=current)
    kept, dropped = StalenessFilter(k).split(at_bound + over + fresh, current)
    assert ids(kept) == ids(at_bound) + ids(fresh)
    assert ids(dropped) == ids(over)
    assert staleness(at_bound[0], current) == k and staleness(over[0], current) == k + 1


def test_zero_keeps_only_on_policy_samples() -> None:
    on, off = make_group(0, version=5), make_group(1, version=4)
    assert [ids(x) for x in StalenessFilter(0).split(off + on, 5)] == [ids(on), ids(off)]


def test_groups_go_whole_and_each_half_keeps_input_order() -> None:
    old, new = make_group(0, size=3, version=1), make_group(1, size=3, version=3)
    interleaved = [old[0], new[0], new[1], old[1], old[2], new[2]]
    kept, dropped = StalenessFilter(1).split(interleaved, 3)
    assert ids(kept) == [new[0]["sample_id"], new[1]["sample_id"], new[2]["sample_id"]]
    assert ids(dropped) == [old[0]["sample_id"], old[1]["sample_id"], old[2]["sample_id"]]
    assert StalenessFilter(1).split([], 3) == ([], [])


@pytest.mark.parametrize("bad", [None, 1.5, True, "3", "missing"])
def test_a_mistyped_or_missing_weight_version_raises(bad: object) -> None:
    samples = make_group(0, version=2) + make_group(1, version=2)
    if bad == "missing":
        del samples[5]["weight_version"]  # type: ignore[misc]
    else:
        samples[5]["weight_version"] = bad  # type: ignore[typeddict-item]
    with pytest.raises(RolloutTagError) as err:
        StalenessFilter(3).split(samples, 2)
    text = _one_line(err)
    assert "sample 5" in text and "weight_version" in text
    assert repr(bad) in text if bad != "missing" else "no 'weight_version'" in text
    assert isinstance(err.value, ValueError) and isinstance(err.value, PosttrainError)


@pytest.mark.parametrize("tag", TAGS)
def test_a_sample_missing_any_tag_raises(tag: str) -> None:
    samples = make_group(0, version=2)
    del samples[1][tag]  # type: ignore[misc]
    with pytest.raises(RolloutTagError, match=f"no '{tag}' tag") as err:
        StalenessFilter(3).split(samples, 2)
    assert ("sample 1" if tag != "sample_id" else "without a sample_id") in _one_line(err)


@pytest.mark.parametrize("bad", [None, True, 1.0, "2"])
def test_a_current_version_that_is_not_an_int_raises(bad: object) -> None:
    with pytest.raises(ValueError, match="current_version") as err:
        StalenessFilter(3).split(make_group(0, version=0), bad)  # type: ignore[arg-type]
    assert repr(bad) in _one_line(err)


def test_a_sample_from_the_future_raises() -> None:
    samples = make_group(0, version=4) + make_group(1, version=5)
    msg = "sample 4: weight_version 5 is newer than the trainer's version 4"
    with pytest.raises(RolloutTagError, match=msg) as err:
        StalenessFilter(10).split(samples, 4)
    _one_line(err)
    with pytest.raises(RolloutTagError, match="newer"):
        staleness(samples[4], 4)


def test_a_group_mixing_weight_versions_raises() -> None:
    samples = make_group(0, version=3) + make_group(1, version=3)
    samples[6]["weight_version"] = 2  # group 1: samples 4, 5, 7 on 3, sample 6 on 2
    with pytest.raises(RolloutTagError, match="group 1 mixes weight versions: sample 4 has 3, sample 6 has 2") as err:
        StalenessFilter(0).split(samples, 3)
    _one_line(err)


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2", None])
def test_max_staleness_must_be_a_non_negative_int(bad: object) -> None:
    with pytest.raises(ValueError, match="max_staleness") as err:
        StalenessFilter(bad)  # type: ignore[arg-type]
    assert repr(bad) in _one_line(err)


def _snapshot(samples: list[RolloutSample]) -> list[RolloutSample]:
    return copy.deepcopy(samples)


@pytest.mark.parametrize("mutate", ["kept", "dropped"])
def test_both_halves_are_fresh_deep_copies(mutate: str) -> None:
    samples = make_group(0, version=1) + make_group(1, version=3)
    before = _snapshot(samples)
    kept, dropped = StalenessFilter(1).split(samples, 3)
    assert kept and dropped and kept == samples[4:] and dropped == samples[:4]
    other_before = _snapshot(dropped if mutate == "kept" else kept)
    target = kept if mutate == "kept" else dropped
    for sample in target:
        sample["reward"] = 99.0
        sample["completion_ids"].append(-1)  # nested lists too
        sample["generation_logprobs"][0] = 7.0
    target.append(make_group(9)[0])
    assert samples == before
    assert (dropped if mutate == "kept" else kept) == other_before


def test_keeping_everything_still_returns_copies() -> None:
    samples = make_group(0, version=3)
    kept, dropped = StalenessFilter(5).split(samples, 3)
    assert dropped == [] and kept == samples
    kept[0]["prompt_ids"].clear()
    assert samples[0]["prompt_ids"] == [1, 2, 3]


def test_the_base_class_is_abstract_and_a_minimal_subclass_works() -> None:
    with pytest.raises(TypeError):
        RolloutFilter()  # type: ignore[abstract]

    class DropOddGroups(RolloutFilter):
        def split(self, samples: list[RolloutSample],
                  current_version: int) -> tuple[list[RolloutSample], list[RolloutSample]]:
            return ([s for s in samples if s["group_id"] % 2 == 0], [s for s in samples if s["group_id"] % 2])

    kept, dropped = DropOddGroups().split(make_group(0) + make_group(1), 0)
    assert ids(kept) == [0, 1, 2, 3] and ids(dropped) == [4, 5, 6, 7]


# --- behaviours the automatic mutation run (tests/mutation/run_auto.sh) found untested ------------


def test_a_current_version_that_is_not_an_int_is_named_with_its_type() -> None:
    with pytest.raises(ValueError, match=r"^current_version must be an int, got 1\.5 \(float\)$"):
        staleness(make_group(0)[0], 1.5)  # type: ignore[arg-type]


def test_a_sample_without_a_sample_id_is_described_by_its_repr() -> None:
    assert describe({"group_id": 1}) == "a sample without a sample_id ({'group_id': 1})"
    assert describe([1, 2]) == "a sample without a sample_id ([1, 2])"  # not even a dict
    assert describe({"sample_id": 17}) == "sample 17"


def test_a_bad_sample_is_quoted_up_to_80_characters_then_cut_to_77_and_dots() -> None:
    fits = "a" * 78  # its repr: 80 characters with the quotes
    assert describe(fits) == f"a sample without a sample_id ('{fits}')"
    longer = "a" * 79  # its repr: 81 characters
    assert describe(longer) == f"a sample without a sample_id ('{'a' * 76}...)"


def test_a_bad_sample_or_tag_is_named_with_its_type_and_value() -> None:
    from posttrain.rollouts.filters import check_tags

    with pytest.raises(RolloutTagError, match=r"^a rollout sample must be a dict, got list: \[1, 2\]$"):
        check_tags([1, 2])
    with pytest.raises(RolloutTagError, match=r"^sample 3: tag 'group_id' must be an int, got True \(bool\)$"):
        check_tags({"sample_id": 3, "group_id": True}, ("sample_id", "group_id"))
