"""Reward for math completions: does the completion's final number equal the ground truth?

Pure Python (no torch), so it runs anywhere and unit tests call it directly. Extraction follows
the GSM8K convention: a completion that writes ``#### <answer>`` is graded on the number after
the last ``####`` (like the "strict match" of common GSM8K evaluations); otherwise on the last
number in the text (the "flexible extract"). For the character-level arithmetic task a
completion is just ``"46"`` (maybe followed by an end-of-sequence marker).
"""

import re
from decimal import Decimal

from posttrain.errors import DataError

FINAL_ANSWER_MARKER = "####"

# A number: optional sign, optional "$", digits with commas only between digits, optional
# decimals. The sign counts only where it cannot be a binary operator: in "3-5" the number is 5.
# Every quantifier is followed by nothing it could trade characters with, so matching is linear.
_NUMBER = re.compile(
    r"(?:(?<![0-9A-Za-z_)\]])(?P<sign>[-+]))?"
    r"\$?"
    r"(?P<int>[0-9](?:[0-9]|,(?=[0-9]))*)"
    r"(?:\.(?P<frac>[0-9]+))?",
    re.ASCII,
)
_THOUSANDS = re.compile(r"[0-9]{1,3}(?:,[0-9]{3})*", re.ASCII)


def extract_final_number(text: str) -> str | None:
    """Return the completion's final numeric answer in canonical form, or None.

    Rules: if ``text`` contains ``####``, the first number after the last ``####`` (None if
    there is none there); otherwise the last number in the text. Text after the number is
    ignored (``"46 apples."``, ``"46<eos>"``). Canonical form: no ``+``, ``$`` or thousands
    commas, no trailing decimal zeros or leading integer zeros, ``-0`` is ``0``
    (``"$1,250.50"`` -> ``"1250.5"``, ``"+4.0"`` -> ``"4"``). Digits that are not grouped in
    threes are read as a list and the last item is taken (``"1,2,3"`` -> ``"3"``).

    Args:
        text: a completion (any string; never raises).

    Returns:
        The canonical number string, or None when there is no number to grade.
    """
    marker = text.rfind(FINAL_ANSWER_MARKER)
    if marker >= 0:
        match = _NUMBER.search(text, marker + len(FINAL_ANSWER_MARKER))
    else:
        matches = list(_NUMBER.finditer(text))
        match = matches[-1] if matches else None
    if match is None:
        return None
    return _canonical(match["sign"] or "", match["int"], match["frac"] or "")


def math_reward(completion: str, ground_truth: str) -> float:
    """Return 1.0 if the completion's final number equals the ground truth, else 0.0.

    Numbers are compared exactly as decimals (``"3.50"`` equals ``"3.5"``, ``"1,250"`` equals
    ``"1250"``; no float rounding). A completion with no number scores 0.0.

    Args:
        completion: the generated text (any string; never raises on it).
        ground_truth: the reference answer, a number string such as ``"46"``, ``"-3"`` or
            ``"1250"`` (:attr:`MathProblem.answer`).

    Returns:
        1.0 or 0.0.

    Raises:
        DataError: if ``ground_truth`` is not a number (a data bug, not a wrong completion).
    """
    truth = _NUMBER.fullmatch(ground_truth.strip())
    if truth is None:
        raise DataError(f"ground truth is not a number: {ground_truth[:40]!r}")
    expected = _canonical(truth["sign"] or "", truth["int"], truth["frac"] or "")
    answer = extract_final_number(completion)
    if answer is None:
        return 0.0
    return 1.0 if Decimal(answer) == Decimal(expected) else 0.0


def _canonical(sign: str, integer: str, fraction: str) -> str:
    """Canonical decimal string from a match's parts; string work, so no size limits."""
    if not _THOUSANDS.fullmatch(integer):
        # "-1,2,3" is a list, not a number: grade its last item, 3.
        sign, integer = "", integer.rpartition(",")[2]
    integer = integer.replace(",", "").lstrip("0") or "0"
    fraction = fraction.rstrip("0")
    body = f"{integer}.{fraction}" if fraction else integer
    return f"-{body}" if sign == "-" and body != "0" else body
