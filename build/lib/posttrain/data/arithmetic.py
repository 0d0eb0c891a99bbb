"""Procedural arithmetic: every ``a <op> b`` with d-digit operands, split into train / validation.

The universe of problems is every triple ``(a, op, b)`` with ``a, b`` in ``0 .. 10**d - 1`` and
``op`` one of the task's operators, so 2-digit addition has 100 * 100 = 10,000 problems. Each
problem has a flat index ``op_index * N**2 + a * N + b`` (``N = 10**d``); the split draws
indices with a seeded :class:`random.Random`, so it is the same on every machine and run.

Prompts are character-level friendly: ``question = "12+34="``, ``answer = solution = "46"``.
"""

import random
from dataclasses import dataclass

from posttrain.data.types import MathProblem
from posttrain.errors import ConfigError

OPERATORS = ("+", "-", "*")
MAX_DIGITS = 6
# Above this many problems the train split is a sample of this size, not the whole universe.
MAX_TRAIN_PROBLEMS = 200_000


@dataclass(frozen=True)
class ArithmeticTask:
    """Which arithmetic problems exist and how they are split.

    Attributes:
        operand_digits: operands are drawn from ``0 .. 10**operand_digits - 1`` (1 to 6).
        operators: allowed operators, a non-empty subset of ``("+", "-", "*")``.
        num_val: number of distinct validation problems (at least 1).
        seed: seed of the split; the same seed gives the same split.

    Raises:
        ConfigError: if a field is out of range or an operator is unknown.
    """

    operand_digits: int = 2
    operators: tuple[str, ...] = ("+",)
    num_val: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("operand_digits", "num_val", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be an integer, got {value!r}")
        if isinstance(self.operators, str):
            raise ConfigError(
                f"operators must be a tuple such as ('+', '-'), got {self.operators!r}"
            )
        if not 1 <= self.operand_digits <= MAX_DIGITS:
            raise ConfigError(
                f"operand_digits must be between 1 and {MAX_DIGITS}, got {self.operand_digits!r}"
            )
        if not self.operators:
            raise ConfigError(
                f"operators must name at least one of {OPERATORS}, got ()"
            )
        for op in self.operators:
            if op not in OPERATORS:
                raise ConfigError(f"unknown operator {op!r}: allowed are {OPERATORS}")
        if len(set(self.operators)) != len(self.operators):
            raise ConfigError(f"operators must not repeat, got {self.operators!r}")
        if self.num_val < 1:
            raise ConfigError(f"num_val must be at least 1, got {self.num_val!r}")

    @property
    def universe_size(self) -> int:
        """Number of distinct problems: ``len(operators) * (10**operand_digits) ** 2``."""
        return len(self.operators) * (10**self.operand_digits) ** 2


def split(task: ArithmeticTask) -> tuple[list[MathProblem], list[MathProblem]]:
    """Split the task's problems into disjoint train and validation lists, deterministically.

    Validation gets ``task.num_val`` distinct problems; train gets every other problem, or, when
    that would be more than ``MAX_TRAIN_PROBLEMS`` (200,000), a seeded sample of that many of
    them. Both lists are in random (seeded) order.

    Args:
        task: the task description.

    Returns:
        ``(train, val)``: lists of :class:`MathProblem`, no problem in both.

    Raises:
        ConfigError: if ``task.num_val`` is not smaller than the universe size (train would be
            empty).
    """
    universe = task.universe_size
    if task.num_val >= universe:
        raise ConfigError(
            f"num_val={task.num_val} leaves no training problems: the task has only "
            f"{universe} problems"
        )
    num_train = min(universe - task.num_val, MAX_TRAIN_PROBLEMS)
    # sample() on a range never materializes it, so 6-digit universes (3e12 problems) are fine.
    indices = random.Random(task.seed).sample(range(universe), task.num_val + num_train)
    problems = [_problem_at(task, index) for index in indices]
    return problems[task.num_val :], problems[: task.num_val]


def _problem_at(task: ArithmeticTask, index: int) -> MathProblem:
    """Decode a flat index ``op_index * N**2 + a * N + b`` into its problem."""
    n = 10**task.operand_digits
    op_index, rest = divmod(index, n * n)
    a, b = divmod(rest, n)
    op = task.operators[op_index]
    answer = str(_apply(a, op, b))
    return MathProblem(question=f"{a}{op}{b}=", answer=answer, solution=answer)


def _apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    return a * b
