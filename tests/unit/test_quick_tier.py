"""The quick tier (tests/mutation/quick_tier.py): its choice of tests, and the check that the committed
choice is the one its inputs give, covers every default-tier mutant and keeps its budget.

The last test is the check itself on the committed files: a mutant added to the catalogue without a
record of its catching tests, or a selection not recomputed after the record or the durations moved,
fails the default tier here, in one line naming the command to run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "mutation"))
import quick_tier  # noqa: E402
from catalogue import Mutant  # noqa: E402

MUTANTS = [Mutant(n, "", "p.py", (("a", "b"),), tier=t) for n, t in
           [("m1", "default"), ("m2", "default"), ("m3", "default"), ("g1", "mcore")]]
# node ids in files that exist (the check looks for them); their costs are made up
A, B, C, Z = (f"tests/unit/test_ops.py::{n}" for n in ("cheap", "cheap_b", "mid", "z_costly"))
CATCHES = {"m1": [A, Z], "m2": [B, Z], "m3": [Z, C]}
DURATIONS = {A: 0.1, B: 0.2, C: 0.5, Z: 30.0}


def test_the_cover_takes_the_most_catches_per_second_and_every_mutant_is_caught():
    # z catches all three but costs 30 s: the three cheap ones cost 0.8 s together
    assert quick_tier.choose(CATCHES, DURATIONS) == [A, B, C]
    # a costly test that alone catches a mutant is taken, and the cheap ones it makes redundant go
    assert quick_tier.choose({**CATCHES, "m4": [Z]}, DURATIONS) == [Z]
    assert quick_tier.choose({**CATCHES, "m4": [Z], "m5": [A]}, DURATIONS) == [
        A, Z]
    # ties go to the node id; a module (a collection error caught it) costs its tests' sum
    assert quick_tier.choose({"m": ["y.py::t", "x.py::t"]}, {"x.py::t": 1.0, "y.py::t": 1.0}) == ["x.py::t"]
    assert quick_tier.cost_of("tests/unit/test_ops.py", DURATIONS, 1.0) == 30.8
    assert quick_tier.cost_of("n.py::t", DURATIONS, 0.4) == 0.4
    with pytest.raises(ValueError, match=r"^no test catches \['m9'\]$"):
        quick_tier.choose({"m9": []}, DURATIONS)


def committed(catches=CATCHES, durations=DURATIONS) -> dict[str, object]:
    return quick_tier.selection_document(quick_tier.choose(catches, durations), catches, durations, MUTANTS)


def test_a_selection_that_its_inputs_give_has_no_problem_and_says_what_it_catches():
    doc = committed()
    assert doc == {"tests": [A, B, C], "seconds": 0.8,
                   "about": "the quick tier: 3 tests (about 1 s recorded), chosen to catch 3 of the catalogue's 3 "
                            "default-tier mutants (4 mutants in all; tests/mutation/catches.json)"}
    assert quick_tier.problems(CATCHES, doc, DURATIONS, MUTANTS) == []


def test_a_new_mutant_a_gone_one_a_stale_selection_and_a_lost_catch_are_each_one_line():
    doc = committed()
    new = [*MUTANTS, Mutant("m5", "", "p.py", (("a", "b"),))]
    assert quick_tier.problems(CATCHES, doc, DURATIONS, new)[0] == (
        "mutant m5 has no record of the tests that catch it: run `uv run --group test python "
        "tests/mutation/run_mutants.py --record tests/mutation/catches.json --only m5`, then `uv run --group test "
        "python tests/mutation/quick_tier.py select`")
    gone = quick_tier.problems({**CATCHES, "g1": [A]}, doc, DURATIONS, MUTANTS)
    assert gone == ["catches.json records g1, which is not a default-tier mutant of the catalogue: remove it, then "
                    "`uv run --group test python tests/mutation/quick_tier.py select`"]
    moved = {**DURATIONS, C: 40.0}  # now Z is the cheaper way to catch m3
    assert quick_tier.problems(CATCHES, doc, moved, MUTANTS) == [
        "tests/mutation/quick_tier.json is not the selection its inputs give (the catalogue, catches.json, "
        "the durations): run `uv run --group test python tests/mutation/quick_tier.py select`"]
    fresh = {"m3": [Z], "m1": [A]}  # C no longer catches m3
    assert quick_tier.problems(CATCHES, doc, DURATIONS, MUTANTS, fresh=fresh) == [
        f"mutant m3: no test of the quick tier caught it in the fresh run (caught by ['{Z}']): update "
        "catches.json from that run, then `uv run --group test python tests/mutation/quick_tier.py select`"]
    assert quick_tier.problems({**CATCHES, "m2": ["tests/unit/no_such_file.py::t"]}, doc, DURATIONS, MUTANTS)[0] == (
        "catches.json names tests/unit/no_such_file.py::t, whose file is not in the repository: record its mutants "
        "again")


def test_a_selection_over_its_budget_is_one_line():
    slow = {**{name: 31.0 for name in DURATIONS}, Z: 100.0}  # the selection's three tests: 93 s
    lines = quick_tier.problems(CATCHES, committed(durations=slow), slow, MUTANTS)
    assert lines == ["the quick tier's tests add up to 93.0 s recorded, over its 65 s budget: give the costly "
                     "mutants a cheaper catching test"]


def committed_files() -> tuple[dict, dict, dict]:
    return (json.loads(quick_tier.RECORD.read_text()), json.loads(quick_tier.SELECTION.read_text()),
            quick_tier.read_durations())


def test_the_committed_quick_tier_is_current_and_catches_every_default_tier_mutant():
    catches, selection, durations = committed_files()
    assert quick_tier.staleness(catches, selection, durations) == []


# The quick tier, AMD EPYC, 2 idle cores, Nov 28 (its 90 s is the target it was asked for, not a spread):
# | selection                                              | tests | recorded (s) | pytest (s) | wall (s) |
# |--------------------------------------------------------|-------|--------------|------------|----------|
# | first record                                           | 172   | 252          | 281.8      | -        |
# | the death messages caught in process (not multinode)   | 172   | 164          | 220.2      | -        |
# | cheap catchers of the DP, async, run_job, node mutants | 173   | 56           | 78.0       | 85       |
# The ~22 s between recorded and measured are module set-ups charged, in the full run, to a test the
# quick tier does not take (test_runtime_refit's engines 11.7 s, the DP pair 7.7 s, test_refit_probe's
# 5.8 s) and the session's start. The GPU host's Xeon pinned to 2 CPUs ran the 164 s selection in 409 s.
def test_the_committed_quick_tier_keeps_its_budget_of_recorded_seconds():
    assert quick_tier.over_budget(committed_files()[1]) == []
