"""Tests for posttrain.environments.math_verifier: final-number extraction and reward."""

import random

import pytest

from posttrain.environments.math_verifier import extract_final_number, math_reward
from posttrain.errors import DataError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("46", "46"),
        ("-12", "-12"),
        ("+5", "5"),
        ("1,250", "1250"),
        ("2,520,000 dollars", "2520000"),
        ("$1,250.50", "1250.5"),
        ("-$5", "-5"),
        ("$-5", "-5"),
        ("3.50", "3.5"),
        ("4.0", "4"),
        ("-0", "0"),
        ("-0.00", "0"),
        ("007", "7"),
        ("46 apples.", "46"),
        ("46<eos>", "46"),
        ("46.", "46"),
        ("The total is 12 + 34 = 46", "46"),
        ("12+34=46", "46"),
        ("3-5", "5"),  # a binary minus is not a sign
        ("so x = -5", "-5"),
        ("(-5)", "-5"),
        ("1,2,3", "3"),  # not thousands groups: a list, last item
    ],
)
def test_extract_normalizes_the_last_number(text: str, expected: str) -> None:
    assert extract_final_number(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Half is 24.\n#### 72", "72"),
        ("#### 72\nQuestion: what is 9?", "72"),  # #### wins over a later number
        ("#### 7 is a guess\n#### 8, then 100", "8"),  # the last #### counts
        ("####72", "72"),
        ("#### $1,080.00", "1080"),
        ("I get 5.\n#### I do not know", None),  # a #### with no number after it
    ],
)
def test_extract_gives_precedence_to_the_last_marker(
    text: str, expected: str | None
) -> None:
    assert extract_final_number(text) == expected


@pytest.mark.parametrize(
    "text", ["", "   ", "no digits here", "####", "-", "$", ",", "日本語 ٣ 🙂"]
)
def test_extract_returns_none_without_a_number(text: str) -> None:
    assert extract_final_number(text) is None


@pytest.mark.parametrize(
    ("completion", "truth", "reward"),
    [
        ("46", "46", 1.0),
        ("4", "46", 0.0),
        ("460", "46", 0.0),
        ("-46", "46", 0.0),
        ("", "46", 0.0),
        ("46<eos>", "46", 1.0),
        ("-42", "-42", 1.0),
        ("1,250", "1250", 1.0),
        ("$1,250.00", "1250", 1.0),
        ("3.50", "3.5", 1.0),
        ("0.1", "0.10", 1.0),
        ("-0", "0", 1.0),
        ("so the answer is #### 72", "72", 1.0),
        ("#### 71\nactually 72", "72", 0.0),
        ("no answer", "0", 0.0),
    ],
)
def test_math_reward(completion: str, truth: str, reward: float) -> None:
    assert math_reward(completion, truth) == reward


def test_reward_is_exact_beyond_float_precision() -> None:
    # Equal as floats, different as numbers: a float comparison would pay 1.0 here.
    assert float("9007199254740993") == float("9007199254740992")
    assert math_reward("9007199254740993", "9007199254740992") == 0.0
    assert math_reward("0.30000000000000001", "0.3") == 0.0
    huge = "9" * 5000  # longer than int()'s default str limit: must not raise
    assert math_reward(huge, huge) == 1.0


def test_reward_never_raises_on_arbitrary_text() -> None:
    rng = random.Random(0)
    alphabet = "0123456789+-$,.#  \n\tx=<>()٣é🙂\x00"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert math_reward(text, "12") in (0.0, 1.0)


def test_bad_ground_truth_is_a_data_error() -> None:
    with pytest.raises(DataError, match="'twelve'"):
        math_reward("12", "twelve")


def test_a_long_bad_ground_truth_is_quoted_to_its_first_40_characters() -> None:
    with pytest.raises(DataError) as err:
        math_reward("12", "abcd" * 10 + "TAIL" * 50)
    assert str(err.value) == f"ground truth is not a number: {'abcd' * 10!r}"
