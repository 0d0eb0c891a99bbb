"""One metric's values by step, sorted numerically once.

A rule reads ``data[metric]`` as a :class:`Series`: a read-only mapping from the step's
string (``"1"``, as in the metrics JSON) to its value, which also keeps the steps as
sorted ints and the first non-finite value, so helpers over 10,000 steps neither re-parse
nor re-sort nor re-scan on every call.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any


def is_number(x: Any) -> bool:
    """True for an int or float that is not a bool."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class Series(Mapping[str, float]):
    """Values of one metric, ``{"<step>": value}``, steps ascending.

    Args:
        steps: step numbers, ascending and unique (not checked: use :meth:`from_mapping`
            for unsorted input).
        values: one number per step; NaN/inf allowed (helpers refuse to read them).
    """

    __slots__ = ("_steps", "_values", "_raw", "_index", "_bad")

    def __init__(self, steps: Sequence[int], values: Sequence[float]) -> None:
        self._steps: Sequence[int] | None = steps
        self._values: Sequence[float] | None = values
        self._raw: Mapping[str, float] | None = None
        self._index: Mapping[str, float] | None = None
        self._bad: tuple[int, float] | None | bool = False  # False: not scanned yet

    @classmethod
    def from_mapping(cls, mapping: Mapping[Any, Any]) -> Series:
        """A Series from ``{step: value}`` (steps: ints or strings of ints, any order).

        Raises:
            TypeError: a value is not a number (the message names its step).
            ValueError: a step is not an integer.
        """
        pairs = sorted((int(step), value) for step, value in mapping.items())
        for step, value in pairs:
            if not is_number(value):
                raise TypeError(f"step '{step}' is {value!r} ({type(value).__name__}), not a number")
        return cls([s for s, _ in pairs], [v for _, v in pairs])

    @classmethod
    def from_validated(cls, raw: Mapping[str, float]) -> Series:
        """A Series over a ``{"<step>": number}`` dict whose keys are canonical step strings.

        Steps are parsed and sorted on first use, so a metric no rule reads costs nothing.
        """
        series = cls(None, None)  # type: ignore[arg-type]
        series._raw = series._index = raw
        return series

    @property
    def steps(self) -> Sequence[int]:
        """Step numbers, ascending."""
        if self._steps is None:
            self._materialize()
        return self._steps  # type: ignore[return-value]

    @property
    def step_values(self) -> Sequence[float]:
        """Values in step order (not ``values()``: that is the Mapping's view, in the same order)."""
        if self._values is None:
            self._materialize()
        return self._values  # type: ignore[return-value]

    def _materialize(self) -> None:
        assert self._raw is not None
        steps, values = list(map(int, self._raw)), list(self._raw.values())
        order = sorted(range(len(steps)), key=steps.__getitem__)  # the logger sorts keys as strings
        if order != list(range(len(steps))):
            steps, values = [steps[i] for i in order], [values[i] for i in order]
        self._steps, self._values = steps, values

    def __getitem__(self, key: str) -> float:
        if self._index is None:
            self._index = dict(zip(map(str, self.steps), self.step_values, strict=True))
        return self._index[key]

    def __contains__(self, key: object) -> bool:
        try:
            self[key]  # type: ignore[index]
        except (KeyError, TypeError):
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(map(str, self.steps))

    def __len__(self) -> int:
        return len(self._raw) if self._raw is not None else len(self.steps)

    def __repr__(self) -> str:
        if not self.steps:
            return "Series(no steps)"
        return f"Series({len(self.steps)} steps, {self.steps[0]}..{self.steps[-1]})"

    def first_non_finite(self) -> tuple[int, float] | None:
        """``(step, value)`` of the first NaN/inf, or None; scanned once, then cached."""
        if self._bad is False:
            self._bad = None
            if not all(map(math.isfinite, self.step_values)):
                self._bad = next(
                    (s, v) for s, v in zip(self.steps, self.step_values, strict=True) if not math.isfinite(v)
                )
        return self._bad  # type: ignore[return-value]

    def window(self, start: float, end: float) -> tuple[Sequence[int], Sequence[float]]:
        """Steps and values with ``start <= step < end`` (binary search on the steps)."""
        lo = bisect.bisect_left(self.steps, start)
        hi = bisect.bisect_left(self.steps, end)
        return self.steps[lo:hi], self.step_values[lo:hi]


def as_series(values: Any) -> Series:
    """A Series from a Series, a step dict, a list (numbered from step 1) or one number (step 1).

    Raises:
        TypeError: a value is not a number, or ``values`` is none of those.
        ValueError: a step key is not an integer.
    """
    if isinstance(values, Series):
        return values
    if isinstance(values, Mapping):
        return Series.from_mapping(values)
    if isinstance(values, (list, tuple)):
        return Series.from_mapping(dict(enumerate(values, start=1)))
    if is_number(values):
        return Series([1], [values])
    raise TypeError(f"{values!r} ({type(values).__name__}) is not a metric, a list or a number")
