"""Two runs of one job logged the same values: the check behind every exact-resume test."""

from __future__ import annotations

import math

# wall clock and process memory differ between any two runs (async: the sampling time hidden behind training)
UNTIMED = ("timing/", "memory/", "async/overlap_seconds")


def assert_same_steps(whole: dict, resumed: dict, steps: range, at_least: int = 10) -> None:
    """Every metric ``whole`` logged at ``steps`` (timings and memory aside) is in ``resumed``
    within 1e-6, and more than ``at_least`` values were compared (a check of nothing fails)."""
    compared = 0
    for name, series in whole.items():
        if name.startswith(UNTIMED):
            continue
        for step in map(str, steps):
            if step in series:
                a, b = series[step], resumed[name][step]
                assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6), (name, step, a, b)
                compared += 1
    assert compared > at_least, f"only {compared} values compared"
