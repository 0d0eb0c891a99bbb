"""Which tests run (posttrain.testing.harness.selection), in inner pytest sessions in this process
(``pytester.runpytest_inprocess``): ``gpu(n)`` skips and their refusals, the deselection report
with the flag that runs each marked test, and "nothing was tested" as exit 5."""

from __future__ import annotations

from pathlib import Path

import pytest

TABLE = Path(__file__).resolve().parents[3] / "configurations.toml"
MARKERS = "markers =\n    slow: slow\n    vllm: vllm\n    mcore: mcore\n    hf_gated: hf\n    learning: l\n"
TESTS = """
import pytest

def test_plain():
    pass

@pytest.mark.gpu(1)
def test_one_gpu():
    pass

@pytest.mark.gpu(2)
def test_two_gpus():
    pass

@pytest.mark.vllm
def test_vllm():
    pass

@pytest.mark.vllm
def test_vllm_too():
    pass

@pytest.mark.mcore
@pytest.mark.hf_gated
def test_mcore_gated():
    pass

@pytest.mark.slow
def test_slow():
    pass

@pytest.mark.learning
@pytest.mark.slow
def test_learning_slow():
    pass
"""


@pytest.fixture
def tree(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("POSTTRAIN_UNIT_RESULTS_DIR", str(pytester.path / "results"))
    pytester.makeini(f"[pytest]\nposttrain_harness = true\nposttrain_configurations = {TABLE}\n{MARKERS}")
    pytester.makepyfile(test_tree=TESTS)
    return pytester


def report(result: pytest.RunResult) -> list[str]:
    """The lines of the deselection report's section."""
    section = result.stdout.str().split("deselected by the configuration", 1)[1].splitlines()[1:]
    return [line for line in section if line.strip()][:-1]  # up to pytest's summary line


@pytest.fixture
def run(tree: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """An inner session in ``tree`` on a machine with ``gpus`` GPUs: ``run(gpus, *args)``."""
    def session(gpus: int, *args: str) -> pytest.RunResult:
        monkeypatch.setenv("POSTTRAIN_NUM_GPUS", str(gpus))
        return tree.runpytest_inprocess("-p", "no:cacheprovider", "--no-unit-results", "-rs", *args)

    return session


@pytest.mark.parametrize(("gpus", "skipped"), [(0, ["needs 1 GPUs, found 0", "needs 2 GPUs, found 0"]),
                                               (1, ["needs 2 GPUs, found 1"]), (2, [])])
def test_a_gpu_test_is_skipped_naming_what_it_needs_only_when_the_machine_has_fewer(run, gpus, skipped):
    result = run(gpus, "-k", "gpu")
    result.assert_outcomes(passed=2 - len(skipped), skipped=len(skipped))
    result.stdout.fnmatch_lines([f"SKIPPED [[]1[]] test_tree.py:*: {reason}" for reason in skipped])


@pytest.mark.parametrize("mark", ["gpu(0)", "gpu('1')", "gpu(1, 2)", "gpu(n=1)", "gpu()"])
def test_a_gpu_marker_without_one_positive_integer_is_a_usage_error_naming_the_test(tree, run, mark):
    tree.makepyfile(test_bad=f"import pytest\n\n@pytest.mark.{mark}\ndef test_bad():\n    pass\n")
    result = run(4, "test_bad.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: test_bad.py::test_bad: gpu marker needs one positive integer, e.g. gpu(1); "
                                 "got gpu(*"])


def test_the_deselection_report_counts_each_marker_set_and_names_the_flags_that_run_it(run):
    result = run(2, "-m", "not vllm and not mcore and not slow")
    result.stdout.fnmatch_lines(["*-- deselected by the configuration --*"])
    # a test of two configurations' markers is named with the first row's flag, the one that runs it
    assert report(result) == ["1 deselected: marked hf_gated, mcore (run with --hf-gated --mcore-only)",
                              "1 deselected: marked learning (run with --learning-only)",
                              "1 deselected: marked slow (run with --slow-only)",
                              "2 deselected: marked vllm (run with --vllm-only)"]


def test_without_a_configuration_table_the_report_only_counts(tree, run):
    tree.makeini(f"[pytest]\nposttrain_harness = true\nposttrain_configurations = missing.toml\n{MARKERS}")
    result = run(2, "-m", "not vllm")
    assert report(result) == ["2 deselected: other (your -m / -k)"]


def test_a_bad_configuration_table_is_one_usage_error_naming_it(tree, run):
    (tree.path / "bad.toml").write_text("[[configuration]]\nname = 1\n")
    tree.makeini(f"[pytest]\nposttrain_harness = true\nposttrain_configurations = bad.toml\n{MARKERS}")
    result = run(2, "-m", "not vllm")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: bad configuration table {tree.path / 'bad.toml'}: *"])


def test_a_table_broken_during_the_session_is_its_error_in_the_deselection_report(tree, run):
    """The report reads the table at the end: an edit that breaks it mid-run is one line, not a crash."""
    table = tree.path / "table.toml"
    table.write_text(TABLE.read_text(encoding="utf-8"), encoding="utf-8")
    tree.makeini(f"[pytest]\nposttrain_harness = true\nposttrain_configurations = table.toml\n{MARKERS}")
    tree.makepyfile(test_edit=f"from pathlib import Path\n\ndef test_edit():\n"
                              f"    Path({str(table)!r}).write_text('[[configuration]]\\nname = 1\\n')\n")
    lines = report(run(2, "-m", "not vllm"))
    assert len(lines) == 1 and lines[0].startswith(f"bad configuration table {table}: ")


def test_nothing_ran_is_exit_5_with_its_line_and_one_test_run_is_enough(run):
    result = run(0, "--fail-on-nothing-ran", "-k", "gpu")  # both skipped: nothing ran
    assert result.ret == 5
    result.stdout.fnmatch_lines(["nothing was tested: no test selected, or every selected test skipped (exit 5)"])
    result = run(0, "--fail-on-nothing-ran", "-k", "plain or gpu")
    assert result.ret == 0 and "nothing was tested" not in result.stdout.str()
    result = run(0, "-k", "gpu")  # without the flag, pytest's own status
    assert result.ret == 0 and "nothing was tested" not in result.stdout.str()


def test_a_shard_that_holds_every_test_adds_no_other_shards_line(run):
    result = run(2, "-m", "not vllm", "--shard", "1/1")
    assert report(result) == ["2 deselected: marked vllm (run with --vllm-only)"]


def test_nothing_ran_is_said_in_red(run):
    result = run(0, "--fail-on-nothing-ran", "-k", "gpu", "--color=yes")
    red = "\x1b[31m"
    assert f"{red}nothing was tested: no test selected, or every selected test skipped (exit 5)" in result.stdout.str()


# What --testmon does to the session, without testmon's database: the tests its records show unaffected by
# the edits are deselected (a whole file, never collected, among them), their ids in the UNAFFECTED stash;
# plain testmon may hand pytest_deselected stand-in objects that carry a node id and no markers.
TESTMON_STAND_IN = """
from types import SimpleNamespace

import pytest

from posttrain.testing.harness.remote_testmon import UNAFFECTED

UNAFFECTED_IDS = {unaffected!r}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    config.stash[UNAFFECTED] = frozenset(UNAFFECTED_IDS)
    dropped = [item for item in items if item.nodeid in UNAFFECTED_IDS]
    items[:] = [item for item in items if item not in dropped]
    config.hook.pytest_deselected(items=dropped + [SimpleNamespace(nodeid=n) for n in {stand_ins!r}])
"""


def with_testmon(tree: pytest.Pytester, unaffected: set[str], stand_ins: tuple[str, ...] = ()) -> None:
    tree.makeconftest(TESTMON_STAND_IN.format(unaffected=sorted(unaffected), stand_ins=stand_ins))


def test_tests_testmon_finds_unaffected_are_one_line_and_the_rest_keep_their_reasons(tree, run):
    with_testmon(tree, {"test_tree.py::test_plain", "test_tree.py::test_vllm", "test_gone.py::test_x"},
                 stand_ins=("test_tree.py::test_vllm", "test_other.py::test_y"))
    result = run(2, "-m", "not mcore")
    # unaffected: the two collected, the file never collected, the stand-in for another file (4 ids)
    assert report(result) == ["1 deselected: marked hf_gated, mcore (run with --hf-gated --mcore-only)",
                              "4 deselected: unaffected by your edits (--testmon)"]


def test_when_testmon_finds_nothing_affected_nothing_to_rerun_is_exit_0_with_its_line(tree, run):
    tree.makepyfile(test_tree="def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    with_testmon(tree, {"test_tree.py::test_a", "test_tree.py::test_b"})
    result = run(0, "--fail-on-nothing-ran")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["nothing to re-run: no selected test is affected by your edits (--testmon)"])
    assert "nothing was tested" not in result.stdout.str()
    assert report(result) == ["2 deselected: unaffected by your edits (--testmon)",  # no stand-ins this time
                              "nothing to re-run: no selected test is affected by your edits (--testmon)"]
    with_testmon(tree, set())  # nothing unaffected and nothing ran: that is nothing tested
    result = run(0, "--fail-on-nothing-ran", "-k", "nothing_matches")
    assert result.ret == 5 and "nothing to re-run" not in result.stdout.str()


class Reporter:
    """The terminal reporter's two calls the report makes, recorded."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def section(self, title: str, sep: str = "=") -> None:
        self.lines.append(f"{sep} {title} {sep}")

    def write_line(self, line: str, **markup: bool) -> None:
        self.lines.append(line)


def test_under_xdist_the_controller_prints_the_first_report_a_worker_shipped(tmp_path):
    """Workers collect alike, so their reports are alike: the controller prints one, not one per worker;
    a worker that crashed shipped nothing and is passed over."""
    from types import SimpleNamespace

    from posttrain.testing.harness.selection import Selection

    def worker(lines: list[str] | None) -> SimpleNamespace:
        return SimpleNamespace(workeroutput={} if lines is None else {"posttrain": {"deselection": lines}})

    controller = Selection(0, True, tmp_path / "none.toml", role="controller")
    for shipped in (None, ["2 deselected: marked vllm (run with --vllm-only)"], ["other worker"]):
        controller.pytest_testnodedown(worker(shipped), None)
    reporter = Reporter()
    controller.pytest_terminal_summary(reporter)
    assert reporter.lines == ["- deselected by the configuration -", "2 deselected: marked vllm (run with --vllm-only)"]
    silent = Selection(0, True, tmp_path / "none.toml", role="controller")
    silent.pytest_testnodedown(worker(None), None)  # every worker crashed: no report
    silent.pytest_terminal_summary(reporter := Reporter())
    assert reporter.lines == []
