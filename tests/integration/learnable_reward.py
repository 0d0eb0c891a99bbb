"""A reward the untrained tiny model earns about half the time.

An untrained model never answers 2-digit addition right: every reward is 0, every group has
zero variance, every advantage is 0 and the weights never move, so a test of a GRPO loop
would see nothing happen. Patched over ``grpo_step.math_reward`` (where the driver scores
rollouts), this reward makes groups vary and the policy train from the first step.
"""

LOW_DIGITS = frozenset("01234")


def low_digit_reward(completion: str, answer: str) -> float:
    """1.0 when the completion starts with a digit 0-4, else 0.0 (the answer is ignored)."""
    return float(completion[:1] in LOW_DIGITS)
