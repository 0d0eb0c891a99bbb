"""The mutant catalogue stays runnable: every anchor matches today's sources exactly once,
every named test exists, and each silent-failure class keeps at least two mutants.

The mutation check itself (tests/mutation/run_mutants.py) takes an hour; a refactor that
makes an anchor stale is caught here in a second instead.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "mutation"))
from catalogue import CLASSES, MUTANTS  # noqa: E402
from run_mutants import TIERS, MutationError, mutated_text  # noqa: E402


def test_mutant_names_are_unique() -> None:
    assert [n for n, c in Counter(m.name for m in MUTANTS).items() if c > 1] == []


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_every_anchor_occurs_exactly_once(mutant) -> None:
    original = (ROOT / mutant.path).read_text()
    assert mutated_text(original, mutant) != original


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if m.path.endswith(".py")], ids=lambda m: m.name)
def test_every_mutant_of_python_still_parses(mutant) -> None:
    """A mutant that no longer parses (an anchor that moved into a deeper block keeps matching as a
    substring, at the old indentation) stops the catalogue run with pytest's exit 4 an hour in."""
    ast.parse(mutated_text((ROOT / mutant.path).read_text(), mutant), mutant.path)


def test_a_stale_anchor_is_a_usage_error() -> None:
    with pytest.raises(MutationError, match="found 0 times"):
        mutated_text("nothing to see", MUTANTS[0])


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_class_tier_and_named_tests_exist(mutant) -> None:
    assert mutant.klass in CLASSES and mutant.tier in TIERS
    for node in mutant.first:
        path, _, name = node.partition("::")
        assert (ROOT / path).exists(), node
        if name:
            assert f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), node


def test_each_silent_failure_class_has_at_least_two_mutants() -> None:
    counts = Counter(m.klass for m in MUTANTS)
    assert {k: counts[k] for k in CLASSES if counts[k] < 2} == {}


def test_a_run_without_tier_judges_the_cpu_tiers_and_mcore_is_asked_for() -> None:
    from run_mutants import select

    tiers = {m.tier for m in select(None)}
    assert tiers == {"default", "vllm"}
    assert {m.tier for m in select(None, ["mcore"])} == {"mcore"}
    assert len(select(None, ["mcore"])) >= 2
    with pytest.raises(MutationError, match="unknown tier"):
        select(None, ["gpu"])


def test_the_copy_holds_what_tests_read_besides_the_code(tmp_path) -> None:
    """A test that reads docs/ or CI files must not fail in the copy for want of them: such a
    failure would be counted as catching whatever mutant was being judged."""
    from run_mutants import copy_repo

    copy_repo(tmp_path)
    for name in ("docs/testing.md", "README.md", ".ci/run", ".github/workflows/ci.yml", "posttrain/config.py",
                 "tests/conftest.py", "pyproject.toml"):
        assert (tmp_path / name).is_file(), name
    assert not list((tmp_path / "tests" / "unit").glob("unit_results*.json"))


def test_a_copy_of_a_copy_holds_the_same_files(tmp_path, monkeypatch) -> None:
    """The catalogue's own tests run inside a copy (the whole-tier fallback), where there is no
    git checkout to list: copying it again must still give every file, or a surviving mutant
    would end the run as an error instead of being reported."""
    import run_mutants

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    run_mutants.copy_repo(first)
    monkeypatch.setattr(run_mutants, "REPO", first)
    run_mutants.copy_repo(second)
    files = {p.relative_to(first).as_posix() for p in first.rglob("*") if p.is_file()}
    assert files and files == {p.relative_to(second).as_posix() for p in second.rglob("*") if p.is_file()}


@pytest.mark.parametrize(("unpatched_exit", "counts"), [(0, True), (1, False)])
def test_a_whole_tier_catch_counts_only_if_the_test_passes_without_the_mutant(tmp_path, monkeypatch, unpatched_exit,
                                                                              counts) -> None:
    import run_mutants

    target = tmp_path / "module.py"
    target.write_text("mutated")
    seen = []

    def fake_pytest(copy, targets, tier):  # records what the file held when the test ran
        seen.append(target.read_text())
        return unpatched_exit, "output"

    monkeypatch.setattr(run_mutants, "run_pytest", fake_pytest)
    if counts:
        run_mutants.confirm_catch(tmp_path, target, "original", MUTANTS[0], "tests/x.py::test_y")
    else:
        with pytest.raises(MutationError, match="tests/x.py::test_y failed, but it fails without the mutant too"):
            run_mutants.confirm_catch(tmp_path, target, "original", MUTANTS[0], "tests/x.py::test_y")
    assert seen == ["original"] and target.read_text() == "mutated"


def test_the_catalogues_own_check_never_counts_as_a_catch(tmp_path) -> None:
    """It fails on every mutant (the anchor is gone from the sources): in a whole-tier run it would
    report any mutant caught. The runner leaves it out; a tier of nothing else selects no test."""
    from run_mutants import CATALOGUE_CHECK, run_pytest

    (tmp_path / CATALOGUE_CHECK).parent.mkdir(parents=True)
    (tmp_path / CATALOGUE_CHECK).write_text("def test_every_anchor_occurs_exactly_once():\n    assert False\n")
    (tmp_path / "tests" / "unit" / "test_behaviour.py").write_text("def test_still_right():\n    pass\n")
    code, output = run_pytest(tmp_path, ["tests/unit"], attempts=1)
    assert code == 0, output  # the behaviour test ran and passed; the catalogue's check did not run


def test_the_record_reads_every_failed_test_of_pytests_summary_spaces_in_parameters_included() -> None:
    from run_mutants import all_failures, first_failure

    summary = ("....F\n___ test_inner ___\n--- captured stdout ---\nFAILED test_inner.py::t - an inner session's\n"
               "=== short test summary info ===\n"
               "FAILED tests/a.py::t[two optimizer steps] - AssertionError: 1 - 2\n"
               "ERROR tests/b.py - ImportError: no module\nFAILED tests/a.py::u\n")
    assert all_failures(summary) == ("tests/a.py::t[two optimizer steps]", "tests/a.py::u", "tests/b.py")
    assert first_failure(summary) == "tests/a.py::t[two optimizer steps]"
