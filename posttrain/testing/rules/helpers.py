"""The functions a rule may call: ``min``, ``max``, ``mean``, ``median``, ``ratio_above``
(NeMo-RL's ``tests/check_metrics.py`` semantics), and ``all_finite``, ``first``, ``last``,
``last_step``, ``std``, ``slope``.

Each takes a metric (``data["train/loss"]``: a step dict or :class:`~series.Series`),
a list (numbered from step 1) or a plain number (one value at step 1). A helper reads every
value of the metric it is given: one NaN/inf anywhere in it raises
:class:`~errors.NonFiniteError` naming the step, so it can never compare as a pass.
"""

from __future__ import annotations

import builtins
import math
import statistics
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

from posttrain.testing.rules.errors import FinitenessCheckFailed, NonFiniteError
from posttrain.testing.rules.series import Series, as_series, is_number


def finite_series(values: Any) -> Series:
    """``values`` as a Series whose every value is finite.

    Raises:
        NonFiniteError: a NaN/inf, naming its step.  TypeError: not a metric, list or number.
    """
    series = as_series(values)
    bad = series.first_non_finite()
    if bad is not None:
        raise NonFiniteError(f"step '{bad[0]}' is {bad[1]}; non-finite values never pass")
    return series


def _numbers(args: tuple[Any, ...]) -> Sequence[float]:
    """Values of one metric/list/number, or of several numbers (``max(a, b)``)."""
    if len(args) == 1:
        return finite_series(args[0]).step_values
    for i, arg in enumerate(args, start=1):
        if not is_number(arg):
            raise TypeError(f"argument {i} is {arg!r}, not a number")
        if not math.isfinite(arg):
            raise NonFiniteError(f"argument {i} is {arg}; non-finite values never pass")
    return args


def exact_mean(values: Sequence[float]) -> float:
    """The mean rounded once from the exact sum, as ``statistics.mean`` gives it, ~30x faster.

    ``fsum`` is the correctly rounded sum ``s``; ``fsum(values - s)`` the rounded remainder
    ``r``; ``s + r`` holds the exact sum to ~106 bits, so dividing it as a Fraction and
    rounding once matches ``statistics.mean`` (a tie closer than 2**-106 is the exception).

    Raises:
        ValueError: no values.
    """
    if not values:
        raise ValueError("no values")
    s = math.fsum(values)
    r = math.fsum([*values, -s])
    return float((Fraction(s) + Fraction(r)) / len(values))


def step_window(series: Series, range_start: float, range_end: float) -> tuple[Sequence[int], Sequence[float]]:
    """Steps/values in ``[range_start, range_end)`` with NeMo-RL's bound rules.

    Bounds are step numbers, 1-indexed. A negative bound counts back from the last
    logged step (``bound + last + 1``); ``range_end <= 0`` is taken the same way, so 0
    means "through the last step". Steps missing after a resume contribute nothing.

    Raises:
        ValueError: no logged step in the range.
    """
    if not series.steps:
        raise ValueError("no values")
    last = series.steps[-1]
    start = range_start + last + 1 if range_start < 0 else range_start
    end = range_end + last + 1 if range_end <= 0 else range_end
    steps, values = series.window(start, end)
    if not values:
        raise ValueError(f"no steps in [{start}, {end}) (logged: {series.steps[0]}..{last})")
    return steps, values


def metric_min(*values: Any) -> float:
    """Smallest value of a metric, a list, or several numbers.

    Raises:
        ValueError: no values.  NonFiniteError: a value is NaN/inf.
    """
    return builtins.min(_numbers(values))


def metric_max(*values: Any) -> float:
    """Largest value of a metric, a list, or several numbers.

    Raises:
        ValueError: no values.  NonFiniteError: a value is NaN/inf.
    """
    return builtins.max(_numbers(values))


def median(values: Any, range_start: int = 1, range_end: int = 0) -> float:
    """Median over the steps in ``[range_start, range_end)``, bounds as in ``mean``.

    ``statistics.median``: the mean of the middle two when even. The bounds are step numbers,
    1-indexed, end-exclusive, negative ones (and ``range_end <= 0``) counted back from the
    last logged step, step 0 only with ``range_start=0``. NeMo-RL's functional scripts use
    this form (``median(data["timing/train/total_step_time"], 2) < 10``).

    Raises:
        ValueError: no logged step in the range.  NonFiniteError: a value is NaN/inf.
    """
    _, vals = step_window(finite_series(values), range_start, range_end)
    return statistics.median(vals)


def ratio_above(values: Any, threshold: float) -> float:
    """Fraction of values ``>= threshold`` (inclusive, as in NeMo-RL).

    Returns:
        A float in [0, 1].

    Raises:
        ValueError: no values (NeMo-RL returns 0.0 there; a rule on an empty metric
            must not pass silently).  NonFiniteError: a value is NaN/inf.
    """
    vals = finite_series(values).step_values
    if not vals:
        raise ValueError("no values to compare with the threshold")
    return sum(v >= threshold for v in vals) / len(vals)


def mean(values: Any, range_start: int = 1, range_end: int = 0, ignore_top_p: float = 0.0) -> float:
    """Mean over the steps in ``[range_start, range_end)``, computed as NeMo-RL does.

    Bounds are step numbers, 1-indexed, not positions; negative bounds count back from
    the last logged step (-10: the last 10 steps); ``range_end <= 0`` counts back too, so
    0 is "through the last step". Steps missing after a resume simply contribute nothing.
    Step 0 (the eval before training) is outside the default range: pass ``range_start=0``.
    ``ignore_top_p`` sorts the values and keeps the first ``int(n * (1 - p))`` (at least
    one), so the largest are dropped as outliers.

    Returns:
        The mean of the kept values, rounded as ``statistics.mean`` rounds it.

    Raises:
        ValueError: ``ignore_top_p`` outside [0, 1], or no logged step in the range.
        NonFiniteError: a value is NaN/inf.
    """
    series = finite_series(values)
    if not 0.0 <= ignore_top_p <= 1.0:
        raise ValueError(f"ignore_top_p must be between 0.0 and 1.0, got {ignore_top_p}")
    _, vals = step_window(series, range_start, range_end)
    if ignore_top_p > 0.0:
        vals = sorted(vals)
        vals = vals[: int(len(vals) * (1.0 - ignore_top_p))] or vals[:1]
    return exact_mean(vals)


def std(values: Any, range_start: int = 1, range_end: int = 0) -> float:
    """Population standard deviation over the steps in ``[range_start, range_end)`` (as ``mean``).

    Returns:
        ``sqrt(sum((v - m)^2) / n)``; exactly 0.0 for a constant series or a single value.

    Raises:
        ValueError: no logged step in the range.  NonFiniteError: a value is NaN/inf.
    """
    _, vals = step_window(finite_series(values), range_start, range_end)
    # The correctly rounded mean of a constant is that constant, so `std(x) > 0` fails on a
    # frozen metric; fsum/n can be off by an ulp (0.1 x 3 steps gave std 1.4e-17).
    m = exact_mean(vals)
    return math.sqrt(math.fsum((v - m) ** 2 for v in vals) / len(vals))


def slope(values: Any, range_start: int = 1, range_end: int = 0) -> float:
    """Least-squares trend, in value per step, over the steps in ``[range_start, range_end)``.

    Ordinary least squares of value on step number: ``sum((x - x̄)(y - ȳ)) / sum((x - x̄)^2)``;
    gaps after a resume are handled by using the real step numbers as x.

    Raises:
        ValueError: fewer than two steps in the range.  NonFiniteError: a value is NaN/inf.
    """
    steps, vals = step_window(finite_series(values), range_start, range_end)
    if len(vals) < 2:
        raise ValueError(f"slope needs at least two steps, got {len(vals)}")
    x_mean = math.fsum(steps) / len(steps)
    y_mean = exact_mean(vals)  # a constant series: every y - y_mean is 0, so the slope is exactly 0
    sxy = math.fsum((x - x_mean) * (y - y_mean) for x, y in zip(steps, vals, strict=True))
    sxx = math.fsum((x - x_mean) ** 2 for x in steps)
    return sxy / sxx


def first(values: Any) -> float:
    """Value at the first logged step.  Raises: ValueError (no values), NonFiniteError."""
    series = finite_series(values)
    if not series.step_values:
        raise ValueError("no values")
    return series.step_values[0]


def last(values: Any) -> float:
    """Value at the last logged step.  Raises: ValueError (no values), NonFiniteError."""
    series = finite_series(values)
    if not series.step_values:
        raise ValueError("no values")
    return series.step_values[-1]


def last_step(values: Any) -> int:
    """The last logged step number (``last_step(data["train/loss"]) == 200``: the run finished).

    Raises:
        ValueError: no values.  NonFiniteError: a value is NaN/inf.
    """
    series = finite_series(values)
    if not series.steps:
        raise ValueError("no values")
    return series.steps[-1]


def all_finite(values: Any) -> bool:
    """True when every value is finite (``all_finite(data["train/loss"])``: no NaN/inf on any step).

    Raises:
        FinitenessCheckFailed: a NaN/inf, naming its step (a FAIL that names the metric).
        ValueError: no values.
    """
    series = as_series(values)
    if not series.step_values:
        raise ValueError("no values")
    bad = series.first_non_finite()
    if bad is not None:
        raise FinitenessCheckFailed(f"step '{bad[0]}' is {bad[1]}")
    return True


def round_(number: Any, ndigits: int | None = None) -> float:
    """``round`` that cannot hang: an int with ``ndigits`` is rounded as a float.

    ``round(5, -10**18)`` on an int computes ``10**10**18``; on a float it returns 0.0 at once.

    Raises:
        TypeError: ``number`` is not a number or ``ndigits`` not an int.
    """
    if not is_number(number):
        raise TypeError(f"round() of {number!r}, not a number")
    if ndigits is None:
        return builtins.round(number)
    if not isinstance(ndigits, int) or isinstance(ndigits, bool):
        raise TypeError(f"round() ndigits must be an int, got {ndigits!r}")
    return builtins.round(float(number), ndigits)


# fmt: off
HELPERS: dict[str, Callable[..., Any]] = {
    "min": metric_min, "max": metric_max, "mean": mean, "median": median, "ratio_above": ratio_above,
    "all_finite": all_finite, "first": first, "last": last, "last_step": last_step,
    "std": std, "slope": slope, "abs": abs, "len": len, "round": round_,
}
# fmt: on
