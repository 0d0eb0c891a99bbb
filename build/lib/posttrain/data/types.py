"""Typed records shared by datasets, environments and algorithms."""

from dataclasses import dataclass


@dataclass(frozen=True)
class MathProblem:
    """One math problem.

    Attributes:
        question: the prompt text the policy sees, e.g. ``"12+34="`` or a GSM8K question.
        answer: the ground-truth final answer as a plain number string, e.g. ``"46"``,
            ``"-3"``, ``"1250"`` (no thousands separators).
        solution: the full reference response used as the SFT target; for arithmetic it is
            the answer itself, for GSM8K the worked solution ending in ``#### <answer>``.
    """

    question: str
    answer: str
    solution: str
