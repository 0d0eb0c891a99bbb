"""The README's time for its test command stays true: within 1.5x of the last recorded durations.

``tests/durations.json`` is the record of the README tier's last full run on 2 idle cores (each
test's set-up, call and teardown; refreshed with ``merge --write-durations``, docs/testing.md
"Shards"). A tier that doubled while the README still promised the old time is how users learn
to distrust the docs; this fails the first run after the record moves that far.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The README's sentence after `uv run --group test bash tests/run_unit.sh`
STATED = re.compile(r"About (\d+(?:\.\d+)?) minutes on 2 idle CPU cores")
TOLERANCE = 1.5  # stated / recorded within [1/1.5, 1.5]: the bound, not a spread
# Outside the tests' own time: uv and Python starting, torch and the plugins imported, ~3,500 tests
# collected. Measured (AMD EPYC, 2 idle cores, Nov 28): 11:37 of wall time for `uv run ... run_unit.sh`,
# 687.6 s of pytest session, 681 s of the tests' totals (durations.json): 6.6 s in the session + ~10 s
# of uv and start-up; after the slow tests moved to --slow-only, 227 s of wall time, 219.6 s of
# pytest, 213.4 s of totals: 6.2 s + 7.4 s.
SESSION_OVERHEAD_S = 17.0
#
# | README says | durations.json (+ 17 s)      | ratio | verdict                                    |
# |-------------|------------------------------|-------|--------------------------------------------|
# | 4 minutes   | 213 s + 17 s = 3.8 min       | 1.04  | pass (today: the README tier without slow) |
# | 11 minutes  | 213 s + 17 s = 3.8 min       | 2.87  | FAIL (the README before the slow tier)     |
# | 11 minutes  | 681 s + 17 s = 11.6 min      | 0.95  | pass (with the slow tests in the tier)     |
# | 7 minutes   | 681 s + 17 s = 11.6 min      | 0.60  | FAIL (the README before that record: seen) |


def stated_minutes(readme: str) -> float:
    """The minutes the README states for its test command.

    Raises:
        ValueError: the sentence is missing or there twice (the check would not know which to hold).
    """
    found = STATED.findall(readme)
    if len(found) != 1:
        raise ValueError(f"README.md: expected one 'About N minutes on 2 idle CPU cores', found {len(found)}")
    return float(found[0])


def disagreement(stated_min: float, durations: dict[str, float]) -> str | None:
    """One line when the stated minutes and the recorded tier (``durations``' sum plus the session's
    start-up) are more than ``TOLERANCE`` apart; None when they agree."""
    recorded_s = math.fsum(durations.values()) + SESSION_OVERHEAD_S
    ratio = stated_min * 60 / recorded_s
    if 1 / TOLERANCE <= ratio <= TOLERANCE:
        return None
    return (f"README.md says about {stated_min:g} minutes for the test command, tests/durations.json records "
            f"{recorded_s / 60:.1f} min ({len(durations)} tests): {ratio:.2f}x, more than {TOLERANCE}x apart: "
            "measure the tier again and state what you measured")


def test_the_readmes_time_for_the_test_command_is_within_1_5x_of_the_recorded_run():
    durations = json.loads((REPO / "tests" / "durations.json").read_text())
    assert disagreement(stated_minutes((REPO / "README.md").read_text()), durations) is None


def test_a_stated_time_far_from_the_record_is_one_line_naming_both():
    record = {f"t.py::t{i}": 1.0 for i in range(403)}  # 403 s + 17 s of start-up: 7 minutes
    assert disagreement(7, record) is None
    assert disagreement(10.4, record) is None and disagreement(4.7, record) is None
    assert disagreement(11, record) == ("README.md says about 11 minutes for the test command, tests/durations.json "
                                        "records 7.0 min (403 tests): 1.57x, more than 1.5x apart: measure the tier "
                                        "again and state what you measured")
    assert disagreement(4.6, record) is not None
    with pytest.raises(ValueError, match="found 0$"):
        stated_minutes("About 7 minutes on 2 CPU cores")
    with pytest.raises(ValueError, match="found 2$"):
        stated_minutes("About 7 minutes on 2 idle CPU cores. About 8 minutes on 2 idle CPU cores.")
    assert stated_minutes("x. About 6.5 minutes on 2 idle CPU cores (AMD EPYC, 2026-11-28).") == 6.5
