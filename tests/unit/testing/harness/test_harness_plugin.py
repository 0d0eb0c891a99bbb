"""The harness plugin (posttrain.testing.harness.plugin) seen from an inner pytest session: its
options, ini keys and marker in ``--help`` / ``--markers``, the parts it registers under the names
``-p no:NAME`` turns off (``--trace-config`` lists them), in one process and as xdist's
controller, and what ``unit_results.json`` records of each test."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from posttrain.testing.harness.parallel import available_cpus, thread_share

REPO = Path(__file__).resolve().parents[4]

INNER = '''
import time

import pytest


def test_sleeps():
    time.sleep(0.05)


def test_tracks(tracker):
    tracker.track("answer", 42)


def test_skips():
    pytest.skip("no reason the table declares")
'''


@pytest.fixture
def inner(harness_pytester, monkeypatch):
    """A tree of three tests (one sleeps 50 ms, one tracks a metric, one skips), harness on."""
    pytester = harness_pytester
    monkeypatch.setenv("COLUMNS", "300")  # --help: one line an option
    pytester.makepyfile(test_inner=INNER)
    pytester.makeini("[pytest]\nposttrain_harness = true\n")
    return pytester


def run(inner: pytest.Pytester, *args: str) -> pytest.RunResult:
    return inner.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:randomly", *args)


def parts(result: pytest.RunResult) -> dict[str, str]:
    """``--trace-config``'s active plugins named posttrain-*: name -> the class of the object."""
    found = {}
    for line in result.outlines:
        m = re.match(r"\s+(posttrain-[\w-]+)\s*: <([\w.]+) object at ", line)
        if m:
            found[m.group(1)] = m.group(2).rsplit(".", 1)[1]
    return found


def section(lines: list[str], title: str) -> list[str]:
    """The lines of ``--help``'s section ``title`` (up to the blank line that ends it)."""
    start = lines.index(title) + 1
    return lines[start:lines.index("", start)]


def test_help_shows_the_harness_options_and_ini_keys_word_for_word(inner):
    result = run(inner, "--help")
    assert result.ret == 0
    pad = " " * 24
    assert section(result.outlines, "posttrain harness:") == [
        "  --fail-on-nothing-ran",
        f"{pad}exit 5 when no test ran (none selected, or all skipped); run_unit.sh passes it",
        "  --strict-skips        fail the run on a skip whose reason the configuration table's [[skip]] rows do not "
        "declare, or declare for other machines (on by default where $CI is true and the table declares skips)",
        "  --strict-budget       fail the run on a test over the time budget (posttrain_time_budget_s) that is not "
        "marked slow(reason=...) (on by default where $CI is true)",
        "  --durations-report    print the tests marked slow with their call times and reasons, slowest first",
        "  --no-unit-results     do not write unit_results.json",
        "  --shard=I/N           run only the I-th of N deterministic parts of the selected tests, balanced by "
        "recorded durations; a module's tests stay together",
        "  --shard-durations=PATH",
        f"{pad}durations for --shard: unit_results.json or {{nodeid: seconds}} JSON (default: tests/durations.json, "
        "else the current unit_results.json)",
        "  --no-remote-map       with --testmon: testmon's own selection only (no import map, .remote_*.json neither "
        "read nor written)"]
    ini = result.outlines
    at = ini.index("  posttrain_harness (bool):")
    assert ini[at:at + 6] == [
        "  posttrain_harness (bool):",
        f"{pad}turn on posttrain's test harness (gpu(n) skips, Ray leak check, unit_results.json)",
        "  posttrain_configurations (string):",
        f"{pad}run_unit.sh's configuration table, relative to the rootdir (for the deselection report)",
        "  posttrain_time_budget_s (string):",
        f"{pad}seconds one test's call may take unless it is marked slow(reason=...); 0: no budget"]


def test_markers_lists_gpu_n(inner):
    run(inner, "--markers").stdout.fnmatch_lines([
        "@pytest.mark.gpu(n): needs n GPUs; skipped with the reason 'needs n GPUs, found m' when fewer are present"])


def test_the_parts_are_registered_under_their_names_and_each_tests_call_time_is_recorded(inner):
    result = run(inner, "--trace-config", "--shard", "1/1")
    assert result.ret == 0, result.stdout.str()
    assert parts(result) == {"posttrain-selection": "Selection", "posttrain-skips": "SkipAccounting",
                             "posttrain-time-budget": "TimeBudget", "posttrain-ray-leaks": "RayLeakCheck",
                             "posttrain-unit-results": "UnitResults", "posttrain-shards": "Sharding"}
    metrics = json.loads((inner.path / "results" / "unit_results.json").read_text())["metrics"]
    assert metrics["test_inner.py::test_tracks"]["answer"] == 42
    elapsed = [metrics[f"test_inner.py::{name}"]["_elapsed"] for name in ("test_sleeps", "test_tracks", "test_skips")]
    assert 0.05 <= elapsed[0] < 4  # the call's 50 ms, not its set-up's or teardown's
    total = metrics["test_inner.py::test_sleeps"]["_total"]
    assert elapsed[0] < total < elapsed[0] + 1 and round(total, 4) == total  # its set-up and teardown added
    assert [round(e, 4) for e in elapsed] == elapsed  # seconds to 0.1 ms


@pytest.mark.parametrize(("name", "gone"), [
    ("posttrain-selection", "nothing was tested: *"),
    ("posttrain-skips", "*skips by reason (not strict: --strict-skips or CI=true fails on an undeclared or "
                        "unexpected skip)*"),
    ("posttrain-unit-results", "unit results: *"),
], ids=["selection", "skips", "unit-results"])
def test_p_no_name_turns_that_part_off_and_leaves_the_others(inner, name, gone):
    args = ("--fail-on-nothing-ran", "-k", "skips")  # the only test selected skips: nothing ran
    result = run(inner, *args)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines([gone])
    off = run(inner, "-p", f"no:{name}", *args)
    assert (off.ret == pytest.ExitCode.OK) is (name == "posttrain-selection")
    off.stdout.no_fnmatch_line(gone)
    assert off.stdout.str().count("\n") > 3


WORKER = '''
import os

import pytest


@pytest.fixture
def tracked_then_broken(tracker):
    tracker.track("before_the_error", 1)
    raise RuntimeError("the set-up fails after tracking")


def test_set_up_error(tracked_then_broken):
    pass


def test_in_the_worker(tracker, request):
    plugins = request.config.pluginmanager.list_name_plugin()
    tracker.track("parts", sorted(name for name, _ in plugins if name and name.startswith("posttrain-")))
    tracker.track("omp_num_threads", os.environ.get("OMP_NUM_THREADS"))
'''


def test_under_xdist_the_worker_runs_and_ships_and_the_controller_reports(inner, monkeypatch):
    inner.makepyfile(test_worker=WORKER)
    # one worker, only xdist's and the harness's plugins in it (a ~0.3 s start instead of ~3 s)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    # the controller sets RAY_AUTH_TOKEN for its workers, here in this process: set and deleted
    # through monkeypatch, so that its undo removes whatever the controller set
    monkeypatch.setenv("RAY_AUTH_TOKEN", "")
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    result = run(inner, "-p", "xdist.plugin", "-p", "posttrain.testing.harness.plugin", "-n", "1", "--trace-config",
                 "-k", "not sleeps")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()  # test_set_up_error's error
    assert parts(result) == {"posttrain-selection": "Selection", "posttrain-skips": "SkipAccounting",
                             "posttrain-time-budget": "TimeBudget", "posttrain-ray-leaks": "RayLeakCheck",
                             "posttrain-unit-results": "UnitResults", "posttrain-xdist-controller": "ControllerReport"}
    result.stdout.fnmatch_lines(["*skips by reason (not strict: *",
                                 "   1 no reason the table declares: NOT DECLARED: *",
                                 "*deselected by the configuration*", "1 deselected: other (your -m / -k)"])
    metrics = json.loads((inner.path / "results" / "unit_results.json").read_text())["metrics"]
    assert set(metrics) == {"test_inner.py::test_tracks", "test_inner.py::test_skips",
                            "test_worker.py::test_set_up_error", "test_worker.py::test_in_the_worker"}
    assert metrics["test_inner.py::test_tracks"]["answer"] == 42  # shipped from the worker
    assert metrics["test_worker.py::test_set_up_error"] == {"before_the_error": 1}  # no call: no times
    worker = metrics["test_worker.py::test_in_the_worker"]
    assert worker["parts"] == ["posttrain-ray-leaks", "posttrain-selection", "posttrain-skips",
                               "posttrain-time-budget", "posttrain-unit-results", "posttrain-xdist-threads",
                               "posttrain-xdist-worker"]
    assert worker["omp_num_threads"] == str(thread_share(available_cpus(), 1))


def test_under_ci_an_undeclared_skip_fails_the_run_against_the_default_table(inner, monkeypatch):
    (inner.path / "tests").mkdir()
    shutil.copy(REPO / "tests" / "configurations.toml", inner.path / "tests" / "configurations.toml")
    monkeypatch.setenv("CI", "true")
    result = run(inner, "-k", "skips")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*skips by reason (strict: every skip must be declared and expected here)*",
                                 "   1 no reason the table declares: NOT DECLARED: *"])


def test_with_testmon_the_remote_selection_is_registered(inner):
    result = run(inner, "--testmon", "--trace-config", "-k", "tracks")
    assert result.ret == 0, result.stdout.str()
    assert parts(result)["posttrain-remote-testmon"] == "RemoteTestmon"


def test_without_the_ini_switch_the_harness_registers_nothing_and_writes_nothing(inner):
    inner.makeini("[pytest]\n")
    result = run(inner, "--trace-config", "-k", "not tracks")  # the tracker fixture refuses: harness off
    assert result.ret == 0, result.stdout.str()
    assert parts(result) == {}
    assert not (inner.path / "results").exists()


@pytest.mark.parametrize(("env", "value", "error"), [
    ("POSTTRAIN_NUM_GPUS", "two", "POSTTRAIN_NUM_GPUS='two' is not a non-negative integer"),
    ("POSTTRAIN_REPEAT_INDEX", "-1", "POSTTRAIN_REPEAT_INDEX='-1': expected a non-negative integer (run_unit.sh "
                                     "--repeat sets it)"),
], ids=["gpus", "repeat-index"])
def test_a_bad_machine_setting_is_one_usage_error_naming_it(inner, monkeypatch, env, value, error):
    monkeypatch.setenv(env, value)
    result = run(inner)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    assert f"ERROR: {error}" in result.stderr.lines


def test_a_configuration_table_that_cannot_be_read_is_one_usage_error_naming_the_problem(inner):
    (inner.path / "tests").mkdir()
    table = (REPO / "tests" / "configurations.toml").read_text()
    (inner.path / "tests" / "configurations.toml").write_text(table + "\n[[skip]]\nreason = 'x'\nwhen = { gpus = 1 }\n")
    result = run(inner)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    assert [line for line in result.stderr.lines if line.startswith("ERROR: ")] == [
        f"ERROR: bad configuration table {inner.path / 'tests' / 'configurations.toml'}: [[skip]] reason 'x': unknown "
        "condition 'gpus'; known: gpus_below, gpus_at_least, module_missing, module_older, tool_missing, no_git, "
        "local_only"]


def test_the_machines_gpu_count_reaches_the_gpu_skips_and_the_skip_accounting(inner, monkeypatch):
    (inner.path / "tests").mkdir()
    shutil.copy(REPO / "tests" / "configurations.toml", inner.path / "tests" / "configurations.toml")
    inner.makepyfile(test_gpus="import pytest\n\n@pytest.mark.gpu(2)\ndef test_two():\n    pass\n")
    monkeypatch.setenv("POSTTRAIN_NUM_GPUS", "1")
    result = run(inner, "--strict-skips", "test_gpus.py")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["   1 needs 2 GPUs, found 1: expected: fewer than 2 GPUs (here: 1 GPUs)"])
