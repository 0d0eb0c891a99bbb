"""The quick tier: few tests, chosen by the catalogue's own record to catch what the default tier catches.

    uv run --group test python tests/mutation/quick_tier.py select           # rewrite tests/mutation/quick_tier.json
    uv run --group test python tests/mutation/quick_tier.py check [--record PATH]

``run_unit.sh --quick`` runs the tests of ``quick_tier.json``. They are chosen from three inputs:
the catalogue's default-tier mutants (``catalogue.py``), the record of every test that catches each
of them (``catches.json``, written by ``run_mutants.py --record``), and each test's recorded seconds
(``tests/durations.json`` and, for the tests marked slow, ``tests/durations_slow.json``; a test
without a record weighs the median). The choice is the greedy
weighted set cover (Chvatal, "A greedy heuristic for the set-covering problem", 1979): take the test
that catches the most mutants not yet caught per second, ties by node id, until every recorded
mutant is caught; then drop, costliest first, each test whose mutants the others catch. It is a pure
function of its inputs, so ``check`` can recompute it.

``check`` exits 1 with one line per problem: a default-tier mutant without a record (a new mutant
not yet placed), a record of a mutant the catalogue no longer has, a selection that is not the one
the inputs give (stale), a selection over its budget of recorded seconds, and, given the record of a
fresh catalogue run (``--record``; CI:L1 writes one), a mutant that none of the selected tests
catches any more.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from catalogue import MUTANTS, Mutant  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "tests" / "mutation" / "catches.json"
SELECTION = REPO / "tests" / "mutation" / "quick_tier.json"
# each test's recorded seconds: the README tier's, and its slow tests' (run_unit.sh --slow-only)
DURATIONS = (REPO / "tests" / "durations.json", REPO / "tests" / "durations_slow.json")
TIER = "default"  # the catalogue tier whose catches the quick tier keeps
# Of recorded seconds on 2 idle cores. The tier's target is 90 s of pytest; a run costs ~22 s more than
# its tests' record (module set-ups the full run charged to tests the tier does not take, and the
# session's start: the table in tests/unit/test_quick_tier.py), so the record may hold 65.
BUDGET_S = 65.0
SELECT_CMD = "uv run --group test python tests/mutation/quick_tier.py select"
RECORD_CMD = "uv run --group test python tests/mutation/run_mutants.py --record tests/mutation/catches.json"


def cost_of(catcher: str, durations: Mapping[str, float], fallback: float) -> float:
    """Seconds of ``catcher``: a node id's recorded seconds, a module's (a collection error caught the
    mutant) the sum of its tests', else ``fallback``."""
    if catcher in durations:
        return durations[catcher]
    in_module = [s for nodeid, s in durations.items() if nodeid.startswith(catcher + "::")]
    return math.fsum(in_module) if in_module else fallback


def choose(catches: Mapping[str, Sequence[str]], durations: Mapping[str, float]) -> list[str]:
    """The greedy weighted set cover of ``catches`` ({mutant: its catching tests}): sorted node ids.

    Raises:
        ValueError: a mutant with no catching test (it cannot be covered).
    """
    empty = sorted(m for m, tests in catches.items() if not tests)
    if empty:
        raise ValueError(f"no test catches {empty}")
    fallback = statistics.median(durations.values()) if durations else 1.0
    by_test: dict[str, set[str]] = {}
    for mutant, tests in catches.items():
        for test in tests:
            by_test.setdefault(test, set()).add(mutant)
    cost = {t: max(cost_of(t, durations, fallback), 1e-3) for t in by_test}  # no test is free
    uncovered, chosen = set(catches), []
    while uncovered:
        best = min(by_test, key=lambda t: (-len(by_test[t] & uncovered) / cost[t], t))  # most new catches a second
        chosen.append(best)
        uncovered -= by_test[best]
    # reverse delete, costliest first: a test whose mutants the others all catch goes (greedy alone
    # keeps cheap early picks that a costly later pick made redundant)
    for test in sorted(chosen, key=lambda t: (-cost[t], t)):
        others = set().union(*(by_test[t] for t in chosen if t != test))
        if by_test[test] <= others:
            chosen.remove(test)
    return sorted(chosen)


def default_tier(mutants: Sequence[Mutant] = MUTANTS) -> list[str]:
    return [m.name for m in mutants if m.tier == TIER]


def selection_document(tests: list[str], catches: Mapping[str, Sequence[str]], durations: Mapping[str, float],
                       mutants: Sequence[Mutant] = MUTANTS) -> dict[str, object]:
    """``quick_tier.json``: the tests, and the line ``run_unit.sh --quick`` prints about them."""
    fallback = statistics.median(durations.values()) if durations else 1.0
    seconds = math.fsum(cost_of(t, durations, fallback) for t in tests)
    caught = sum(1 for m in default_tier(mutants) if set(catches.get(m, ())) & set(tests))
    return {"tests": tests, "seconds": round(seconds, 1),
            "about": f"the quick tier: {len(tests)} tests (about {seconds:.0f} s recorded), chosen to catch "
                     f"{caught} of the catalogue's {len(default_tier(mutants))} default-tier mutants "
                     f"({len(mutants)} mutants in all; tests/mutation/catches.json)"}


def problems(catches: Mapping[str, Sequence[str]], selection: Mapping[str, object], durations: Mapping[str, float],
             mutants: Sequence[Mutant] = MUTANTS, fresh: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    """One line per reason the committed quick tier cannot be trusted or is over its budget (see the
    module doc): :func:`staleness`, then :func:`over_budget`."""
    return [*staleness(catches, selection, durations, mutants, fresh), *over_budget(selection)]


def over_budget(selection: Mapping[str, object]) -> list[str]:
    """One line when the selection's recorded seconds exceed ``BUDGET_S``."""
    seconds = selection.get("seconds", 0.0)
    if not isinstance(seconds, int | float) or seconds <= BUDGET_S:
        return []
    return [f"the quick tier's tests add up to {seconds} s recorded, over its {BUDGET_S:g} s budget: give the "
            "costly mutants a cheaper catching test"]


def staleness(catches: Mapping[str, Sequence[str]], selection: Mapping[str, object], durations: Mapping[str, float],
              mutants: Sequence[Mutant] = MUTANTS, fresh: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    """One line per reason the committed selection is not the one its inputs give, or misses a mutant."""
    lines = []
    wanted = default_tier(mutants)
    for name in wanted:
        if name not in catches:
            lines.append(f"mutant {name} has no record of the tests that catch it: run `{RECORD_CMD} --only {name}`, "
                         f"then `{SELECT_CMD}`")
    for name in sorted(set(catches) - set(wanted)):
        lines.append(f"catches.json records {name}, which is not a default-tier mutant of the catalogue: remove it, "
                     f"then `{SELECT_CMD}`")
    for test in sorted({t for tests in catches.values() for t in tests}):
        if not (REPO / test.split("::")[0]).is_file():
            lines.append(f"catches.json names {test}, whose file is not in the repository: record its mutants again")
    placed = {name: catches[name] for name in wanted if name in catches}
    try:
        expected = selection_document(choose(placed, durations), placed, durations, mutants)
    except ValueError as e:
        return [*lines, f"catches.json: {e}"]
    if dict(selection) != expected:
        lines.append("tests/mutation/quick_tier.json is not the selection its inputs give (the catalogue, "
                     f"catches.json, the durations): run `{SELECT_CMD}`")
    tests = set(selection.get("tests", ()))  # type: ignore[arg-type]
    for name, catchers in sorted((fresh or {}).items()):
        if name in placed and not tests & set(catchers):
            lines.append(f"mutant {name}: no test of the quick tier caught it in the fresh run (caught by "
                         f"{sorted(catchers)[:3]}): update catches.json from that run, then `{SELECT_CMD}`")
    return lines


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def read_durations() -> dict[str, float]:
    """Every recorded test's seconds: the README tier's and the slow tests' (``DURATIONS``)."""
    return {nodeid: seconds for path in DURATIONS for nodeid, seconds in _read(path).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="choose or check the quick tier (run_unit.sh --quick)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("select", help=f"rewrite {SELECTION.relative_to(REPO)} from the catalogue, its record and the "
                                  "durations")
    check = sub.add_parser("check", help="exit 1 on a stale or insufficient quick tier (one line per problem)")
    check.add_argument("--record", type=Path, metavar="PATH", help="a fresh run_mutants.py --record to check against")
    args = parser.parse_args(argv)
    catches, durations = _read(RECORD), read_durations()
    placed = {name: catches[name] for name in default_tier() if name in catches}
    if args.command == "select":
        doc = selection_document(choose(placed, durations), placed, durations)
        SELECTION.write_text(json.dumps(doc, indent=1) + "\n")
        print(doc["about"])
        return 0
    fresh = json.loads(args.record.read_text()) if args.record else None
    lines = problems(catches, _read(SELECTION), durations, fresh=fresh)
    for line in lines:
        print(f"quick_tier: {line}", file=sys.stderr)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
