"""``run_unit.sh --repeat N`` (posttrain.testing.harness.repeat): the JUnit XML read back, the
infrastructure patterns against real Ray and posttrain messages, the pass-rate table and its
exit status; end to end, the runner's ``main`` in this process on a deliberately flaky test, a
crashing one and Ctrl-C (each repetition a real pytest process), run_unit.sh on the same flaky test."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.testing.harness.configurations import PlanError, check_flags, load_table, make_plan, usage
from posttrain.testing.harness.repeat import (
    EXIT_INFRA,
    INFRA_PATTERNS,
    Row,
    Run,
    TestResult,
    describe_exit,
    infra_cause,
    main,
    node_id,
    parse_repeat,
    read_junit,
    render,
    repeat_index,
    run_problem,
    summarize,
)

REPO = Path(__file__).resolve().parents[4]
TABLE = load_table(REPO / "tests" / "configurations.toml")

# Real messages: Ray 2.60 (a task and an actor that SIGKILL themselves; tasks and actors killed by
# Ray's memory monitor, RAY_memory_usage_threshold=0.01), pytest's JUnit `message` attribute
# and its `E` lines; posttrain's own errors as init_ray and RayWorkerGroup.gather raise them.
WORKER_CRASHED = ("ray.exceptions.WorkerCrashedError: The worker died unexpectedly while executing this task. "
                  "Check python-core-worker-*.log files for more information.")
ACTOR_SIGKILLED = (
    "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
    "\tclass_name: A\n\tactor_id: 7f8eb8136ff5d7ba0182279601000000\n\tpid: 6163\n"
    "\tnamespace: c53266fc-a7ea-48cf-81e6-91ae789f10a3\n\tip: 192.0.2.2\n"
    "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
    "Worker unexpectedly exits with a connection error code 2. End of file. Some common causes include: (1) the "
    "process was killed by the OOM killer due to high memory usage, (2) ray stop --force was called, or (3) the "
    "worker crashed unexpectedly due to SIGSEGV or another unexpected error.")
RAY_OOM = ("ray.exceptions.OutOfMemoryError: 1 worker(s) were killed due to the node running low on memory. Memory "
           "on the node (IP: 192.0.2.2, ID: 0b0bed690839f5d64cd51d76cca180577a50049a95c4adfb93645859) was 3.66GB "
           "used / 23.54GB limit (0.155542)\nOOM kill reason: Memory usage 3931557888B exceeded threshold of "
           "252765104B (1.0% of 25276510208B limit)\nObject store memory usage: [- objects spillable: 0\n"
           "[+37 more lines; full report in element text]")
RAY_OOM_OLDER = ("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
                 "Memory on the node (IP: 10.0.0.1, ID: 4f1c) where the task (task ID: 1e2f, name=hog, pid=123, "
                 "memory used=1.2GB) was running was 14.8GB / 15.5GB (0.95), which exceeds the memory usage "
                 "threshold of 0.95.")
RAY_START = ("posttrain.errors.RayStartError: Ray's local node timed out during startup on all 5 attempts (the "
             "machine is busy): run again when it is quieter, set POSTTRAIN_RAY_START_ATTEMPTS higher, or start Ray "
             "yourself (`ray start --head`) and pass cluster.address=auto")
WORKER_DIED = ("posttrain.errors.WorkerDiedError: HfPolicyWorker worker 0 died during train: The actor died "
               "unexpectedly before finishing this task.")


# ---------------------------------------------------------------- the infrastructure table

@pytest.mark.parametrize(("text", "name"), [
    (WORKER_CRASHED, "worker killed"), (ACTOR_SIGKILLED, "worker killed"), (WORKER_DIED, "worker killed"),
    (RAY_OOM, "Ray out of memory"), (RAY_OOM_OLDER, "Ray out of memory"),
    ("ray.exceptions.ActorDiedError: ...\nThe actor is dead because its worker process has died. Worker exit type: "
     "NODE_OUT_OF_MEMORY Worker exit detail: ...", "Ray out of memory"),
    (RAY_START, "Ray did not start"),
    (f"tests/conftest.py:37: in ray_cluster\n    init_ray(num_cpus=2)\nE   {RAY_START}", "Ray did not start"),
], ids=["task-sigkill", "actor-sigkill", "posttrain-worker-died", "ray-oom", "ray-oom-older", "actor-oom",
        "ray-start", "ray-start-in-a-fixture"])
def test_real_infrastructure_messages_match_their_row(text, name):
    assert infra_cause(text) == name


@pytest.mark.parametrize("text", [
    "AssertionError: assert 0.12 > 0.15",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",  # the test's own model: its problem
    "ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task, "
    "ray::HfPolicyWorker.__init__() (pid=1, ip=192.0.2.2)\nValueError: bad lr",
    "posttrain.errors.WorkerDiedError: HfPolicyWorker worker 0 died during train: The actor died because of an "
    "error raised in its creation task, ray::HfPolicyWorker.__init__()",
    "ray.exceptions.RayTaskError(ZeroDivisionError): ray::f() (pid=1, ip=192.0.2.2)\nZeroDivisionError: division",
    "posttrain.errors.StaleWeightsError: engine 0 serves weight version 3, the trainer has 4",
    "Exception: The current node timed out during startup.",  # init_ray retries this; only RayStartError counts
])
def test_ordinary_failures_are_not_infrastructure(text):
    assert infra_cause(text) is None


def test_the_table_is_one_tuple_of_named_regexes():
    assert [name for name, _ in INFRA_PATTERNS] == ["Ray did not start", "Ray out of memory", "worker killed"]
    for _, pattern in INFRA_PATTERNS:
        re.compile(pattern)


# ---------------------------------------------------------------- JUnit XML

@pytest.mark.parametrize(("attrs", "expected"), [
    ({"classname": "tests.unit.test_x", "name": "test_a", "file": "tests/unit/test_x.py"},
     "tests/unit/test_x.py::test_a"),
    ({"classname": "tests.unit.test_x.TestA.TestInner", "name": "test_b[a.b-c::d]", "file": "tests/unit/test_x.py"},
     "tests/unit/test_x.py::TestA::TestInner::test_b[a.b-c::d]"),
    ({"classname": "", "name": "tests.unit.test_x", "file": "tests/unit/test_x.py"}, "tests/unit/test_x.py"),
    ({"classname": "tests.unit.test_x", "name": "test_a"}, "tests.unit.test_x::test_a"),  # xunit2: no file
], ids=["function", "nested-class-and-params", "collection-error", "no-file"])
def test_node_ids_are_rebuilt_from_the_xunit1_attributes(attrs, expected):
    assert node_id(attrs) == expected


def junit(*testcases: str) -> str:
    return ('<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest">'
            + "".join(testcases) + "</testsuite></testsuites>")


def case(name: str, body: str = "") -> str:
    return f'<testcase classname="test_t" name="{name}" file="test_t.py" line="1" time="0.1">{body}</testcase>'


def failure(message: str, tag: str = "failure") -> str:
    from xml.sax.saxutils import quoteattr

    return f"<{tag} message={quoteattr(message)}>E   {message}</{tag}>"


def test_each_testcase_gives_one_outcome():
    xml = junit(case("test_pass"), case("test_fail", failure("AssertionError: assert 1 == 2")),
                case("test_skip", '<skipped type="pytest.skip" message="no GPU">x</skipped>'),
                case("test_xfail", '<skipped type="pytest.xfail" message="" />'),
                case("test_oom", failure(RAY_OOM)), case("test_setup", failure(WORKER_CRASHED, "error")))
    assert read_junit(xml) == (
        TestResult("test_t.py::test_pass", "passed"),
        TestResult("test_t.py::test_fail", "failed", "AssertionError: assert 1 == 2"),
        TestResult("test_t.py::test_skip", "skipped"),
        TestResult("test_t.py::test_xfail", "skipped"),
        TestResult("test_t.py::test_oom", "infra", "Ray out of memory: ray.exceptions.OutOfMemoryError: 1 worker(s) "
                   "were killed due to the node running low on memory. Memory on the node (IP: 192.0.2.2, ID: "
                   "0b0bed690839f5d64cd51d76cca180577a50049a95c4adfb93645859) was 3.66GB used / 23.54GB limit "
                   "(0.155542)"),
        TestResult("test_t.py::test_setup", "infra", f"worker killed: {WORKER_CRASHED}"),
    )


def test_the_infrastructure_text_may_be_only_in_the_traceback():
    xml = junit(case("t", f'<error message="failed on setup with &quot;Exception&quot;">E   {RAY_START}</error>'))
    assert read_junit(xml)[0].outcome == "infra"


@pytest.mark.parametrize(("bodies", "expected"), [
    ([failure("assert 0"), failure("ZeroDivisionError", "error")], "failed"),  # call failed, teardown errored
    ([failure(RAY_START, "error"), failure("assert 0")], "failed"),  # a real failure beats an infra error
    (["", failure(WORKER_CRASHED, "error")], "infra"),  # passed, then a killed worker at teardown
    (['<skipped message="x">x</skipped>', ""], "passed"),
], ids=["failure-and-teardown-error", "failure-beats-infra", "infra-teardown", "skip-and-pass"])
def test_a_test_reported_twice_keeps_its_worst_outcome(bodies, expected):
    (result,) = read_junit(junit(*(case("t", body) for body in bodies)))
    assert result.outcome == expected


@pytest.mark.parametrize("text", ["", "<testsuites", "<html><body/></html>"], ids=["empty", "truncated", "html"])
def test_what_is_not_junit_xml_is_refused(text):
    with pytest.raises(ValueError, match="not JUnit XML"):
        read_junit(text)


@pytest.mark.parametrize(("attrs", "expected"), [
    ({"name": "test_a"}, "test_a"),
    ({"classname": "tests.unit.test_x", "name": "test_a"}, "tests.unit.test_x::test_a"),
    ({"file": "x.py", "classname": "x"}, "x.py::"),
    ({"file": "x.py", "classname": "other.Thing", "name": "t"}, "other.Thing::t"),  # a classname of another file
])  # fmt: skip
def test_a_testcase_missing_attributes_still_gets_a_node_id(attrs, expected):
    assert node_id(attrs) == expected


def test_a_failure_without_a_message_is_named_by_its_tag_and_the_worst_of_one_testcases_reports_counts():
    xml = junit(case("quiet", "<failure>E   boom</failure>"), case("empty", '<error message=""></error>'),
                case("both", '<skipped message="s">s</skipped><failure message="assert 0">x</failure>'))
    assert read_junit(xml) == (TestResult("test_t.py::quiet", "failed", "failure"),
                               TestResult("test_t.py::empty", "failed", "error"),
                               TestResult("test_t.py::both", "failed", "assert 0"))


def test_a_test_reported_again_keeps_its_first_report_of_the_worst_outcome():
    xml = junit(case("t", failure("first")), case("t"), case("t", failure("second")))
    assert read_junit(xml) == (TestResult("test_t.py::t", "failed", "first"),)


def test_a_bare_testsuite_root_is_junit_xml():
    assert read_junit(f'<testsuite name="pytest">{case("t")}</testsuite>') == (TestResult("test_t.py::t", "passed"),)


@pytest.mark.parametrize(("status", "text"), [(0, "status 0"), (1, "status 1"), (-9, "signal SIGKILL"),
                                              (-99, "signal 99")])
def test_an_exit_status_is_a_status_or_the_signal_that_killed_the_process(status, text):
    assert describe_exit(status) == text


def test_a_run_that_tested_nothing_or_passed_has_no_problem_of_its_own():
    assert run_problem(Run(0, 5, ())) is None and run_problem(Run(1, 0, (passed("a"),))) is None


def test_the_table_puts_never_passed_tests_before_half_passed_ones_and_only_skipped_ones_last():
    report = summarize(runs((failed("a"), failed("b"), skipped("s")), (failed("a"), passed("b"), skipped("s"))), 2)
    rows = render(report).splitlines()[1:4]
    assert [re.split(r"\s+", line) for line in rows] == [["a", "2", "0", "2", "0", "0", "0%"],
                                                          ["b", "2", "1", "1", "0", "0", "50%"],
                                                          ["s", "2", "0", "0", "0", "2", "-"]]


def test_a_runs_failures_are_listed_in_the_order_its_tests_ran():
    report = summarize(runs((failed("z.py::t"), failed("a.py::t"))), 1)
    assert [line for line in render(report).splitlines() if line.startswith("run ")] == [
        "run 0 failed: z.py::t: assert 0", "run 0 failed: a.py::t: assert 0"]


def test_failures_are_listed_by_run_number_and_cut_at_160_characters():
    per_run = [(TestResult("t", "failed", "x" * 300),) if i in (2, 10) else (passed("t"),) for i in range(11)]
    lines = render(summarize(runs(*per_run), 11)).splitlines()
    details = [line for line in lines if line.startswith("run ")]
    assert [line[:7] for line in details] == ["run 2 f", "run 10 "]
    assert [len(line) for line in details] == [160, 160]


# ---------------------------------------------------------------- the table and the exit status

def passed(nodeid: str) -> TestResult:
    return TestResult(nodeid, "passed")


def failed(nodeid: str) -> TestResult:
    return TestResult(nodeid, "failed", "assert 0")


def infra(nodeid: str) -> TestResult:
    return TestResult(nodeid, "infra", "Ray did not start: RayStartError")


def skipped(nodeid: str) -> TestResult:
    return TestResult(nodeid, "skipped")


def runs(*per_run: tuple[TestResult, ...] | None, status: int | None = None) -> list[Run]:
    def exit_of(results: tuple[TestResult, ...] | None) -> int:
        if status is not None:
            return status
        return 1 if results and any(r.outcome in ("failed", "infra") for r in results) else 0
    return [Run(i, exit_of(results), results) for i, results in enumerate(per_run)]


def test_a_flaky_test_counts_its_passes_and_failures_and_fails_the_run():
    report = summarize(runs(*((failed("f") if i % 2 else passed("f"), passed("ok")) for i in range(4))), 4)
    assert report.rows == (Row("f", passed=2, failed=2, infra=0, skipped=0), Row("ok", 4, 0, 0, 0))
    assert report.rows[0].pass_rate == 0.5 and report.rows[0].runs == 4
    assert (report.flaky, report.always_failed, report.infra_errors, report.exit_status) == (1, 0, 0, 1)


def test_a_later_pass_never_turns_an_early_failure_green():
    report = summarize(runs((failed("f"),), *([(passed("f"),)] * 9)), 10)
    assert report.exit_status == 1
    assert report.rows[0].pass_rate == 0.9


@pytest.mark.parametrize(("per_run", "status", "counts"), [
    ([(passed("a"), skipped("s"))] * 3, 0, (0, 0, 0)),  # skips allowed, as pytest allows them
    ([(passed("a"),), (infra("a"),)], EXIT_INFRA, (0, 0, 1)),
    ([(failed("a"), infra("b")), (failed("a"), passed("b"))], 1, (0, 1, 1)),  # a failure beats infra
    ([(skipped("s"),)] * 2, 5, (0, 0, 0)),  # nothing was tested
    ([(), ()], 5, (0, 0, 0)),
], ids=["passed-and-skipped", "infra-only", "failure-and-infra", "all-skipped", "none-selected"])
def test_exit_status(per_run, status, counts):
    report = summarize(runs(*per_run), len(per_run))
    assert report.exit_status == status
    assert (report.flaky, report.always_failed, report.infra_errors) == counts


def test_a_run_that_left_no_xml_is_an_infrastructure_error_naming_its_exit_status():
    report = summarize([Run(0, 0, (passed("a"),)), Run(1, -9, None), Run(2, 0, (passed("a"),))], 3)
    assert report.exit_status == EXIT_INFRA and report.infra_errors == 1
    assert report.rows == (Row("a", 2, 0, 0, 0),)
    assert "run 1 infrastructure error: pytest exited with signal SIGKILL and left no readable JUnit XML" in (
        render(report))


def test_a_failed_pytest_with_no_failing_test_in_its_xml_is_a_failure():
    report = summarize([Run(0, 1, (passed("a"),)), Run(1, 3, (passed("a"),))], 2)
    assert report.exit_status == 1
    assert "run 0 failed: pytest exited with status 1 but its JUnit XML records no failing test" in render(report)


def test_the_table_shows_each_tests_counts_and_pass_rate_worst_first():
    report = summarize(runs(*((failed("t.py::flaky") if i % 2 else passed("t.py::flaky"), passed("t.py::steady"),
                               infra("t.py::ray") if i == 2 else passed("t.py::ray")) for i in range(4))), 4)
    lines = render(report).splitlines()
    assert re.split(r"\s{2,}", lines[0]) == ["test", "runs", "passed", "failed", "infra", "skipped", "pass rate"]
    assert [re.split(r"\s+", line) for line in lines[1:4]] == [["t.py::flaky", "4", "2", "2", "0", "0", "50%"],
                                                                ["t.py::ray", "4", "3", "0", "1", "0", "100%"],
                                                                ["t.py::steady", "4", "4", "0", "0", "0", "100%"]]
    assert len({len(line) for line in lines[:4]}) == 1  # aligned
    assert lines[4:] == ["run 1 failed: t.py::flaky: assert 0",
                         "run 2 infrastructure error: t.py::ray: Ray did not start: RayStartError",
                         "run 3 failed: t.py::flaky: assert 0",
                         "4 runs of 3 tests: 1 flaky (passed and failed), 0 always failed, 1 infrastructure errors"]


# ---------------------------------------------------------------- the flag, the index

@pytest.mark.parametrize("text", ["1", "10", " 3 "])
def test_repeat_takes_a_positive_integer(text):
    assert parse_repeat(text) == int(text)


@pytest.mark.parametrize("text", ["0", "-1", "abc", "", "1.5", "+2"])
def test_a_bad_repeat_is_one_line_naming_it(text):
    with pytest.raises(ValueError) as e:
        parse_repeat(text)
    assert str(e.value) == f"--repeat needs a positive integer, got {text!r}"


def test_repeat_index_reads_the_environment():
    assert repeat_index({}) == repeat_index({"POSTTRAIN_REPEAT_INDEX": ""}) == 0
    assert repeat_index({"POSTTRAIN_REPEAT_INDEX": "3"}) == 3
    with pytest.raises(ValueError, match=r"^POSTTRAIN_REPEAT_INDEX='x': expected a non-negative integer"):
        repeat_index({"POSTTRAIN_REPEAT_INDEX": "x"})
    with pytest.raises(ValueError):
        repeat_index({"POSTTRAIN_REPEAT_INDEX": "-1"})


def everything_importable(_package: str) -> bool:
    return True


def never(_unused: object = None) -> set[str]:
    raise AssertionError("pytest was asked about a flag that is run_unit.sh's own")


@pytest.mark.parametrize("flag", [["--repeat", "4"], ["--repeat=4"]], ids=["separate", "equals"])
def test_the_plan_runs_the_repeat_runner_around_the_same_pytest_args(flag):
    argv = ["--hf-gated", "-k", "learning", "tests/integration", "-x"]
    once = make_plan(argv, num_gpus=0, table=TABLE, importable=everything_importable, known=never)
    plan = make_plan([argv[0], *flag, *argv[1:]], num_gpus=0, table=TABLE, importable=everything_importable,
                     known=never)
    assert once.command == ("python", "-m", "pytest", *once.pytest_args)
    assert plan.pytest_args == once.pytest_args and plan.repeat == 4
    assert plan.command == ("python", "-m", "posttrain.testing.harness.repeat", "4", "--", *once.pytest_args)


@pytest.mark.parametrize(("argv", "value"), [(["--repeat"], ""), (["--repeat", "0"], "0"),
                                             (["-k", "x", "--repeat", "-1"], "-1"), (["--repeat=abc"], "abc")])
def test_a_bad_repeat_is_a_plan_error(argv, value):
    with pytest.raises(PlanError) as e:
        make_plan(argv, num_gpus=0, table=TABLE, importable=everything_importable, known=never)
    assert str(e.value) == f"--repeat needs a positive integer, got {value!r}"


def test_repeat_is_run_unit_shs_own_flag_and_in_its_usage():
    check_flags(["--repeat", "3", "--repeat=2", "--vllm-only"], TABLE, known=never)
    assert "  --repeat N " in usage(TABLE) and "3 infrastructure errors" in usage(TABLE)


# ---------------------------------------------------------------- end to end: main in this process

FLAKY = """
import os
from pathlib import Path


def test_odd(repeat_index):
    assert repeat_index % 2 == 0, f"odd repetition {repeat_index}"


def test_steady():
    index = os.environ["POSTTRAIN_REPEAT_INDEX"]
    assert os.environ["POSTTRAIN_UNIT_RESULTS_DIR"].endswith(f"run-{index}")
    runner_stdout = os.environ.get("RUNNER_STDOUT")  # a file, as a CI log is: announced before it started
    assert runner_stdout is None or f"run {index} (" in Path(runner_stdout).read_text()
"""

INFRA = """
from posttrain.errors import RayStartError


def test_cluster():
    raise RayStartError("Ray's local node timed out during startup on all 5 attempts (the machine is busy)")
"""

CRASH = """
import os
import signal
from pathlib import Path


def test_dies(repeat_index):
    if repeat_index == 1:  # killed while writing its record: a junit.xml that is not XML
        (Path(os.environ["POSTTRAIN_UNIT_RESULTS_DIR"]) / "junit.xml").write_text("<testsuites")
    os.kill(os.getpid(), signal.SIGKILL)
"""

CTRL_C = """
import os
import signal
import time


def test_interrupted(repeat_index):
    if repeat_index == 1:  # Ctrl-C during the second run: SIGINT reaches the runner
        os.kill(os.getppid(), signal.SIGINT)
        time.sleep(10)  # the interrupted runner kills this run
"""


@pytest.fixture(scope="module")
def repeat_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test files above and an ini that turns the harness on, shared by the runner's tests."""
    root = tmp_path_factory.mktemp("repeat_tree")
    (root / "pytest.ini").write_text("[pytest]\nposttrain_harness = true\n")
    for name, text in {"test_flaky": FLAKY, "test_infra": INFRA, "test_crash": CRASH, "test_ctrl_c": CTRL_C}.items():
        (root / f"{name}.py").write_text(text)
    return root


HARNESS_ONLY = ("-p", "posttrain.testing.harness.plugin", "-p", "no:cacheprovider", "-q")


@pytest.fixture
def run_main(repeat_tree, tmp_path, monkeypatch, capfd):
    """``repeat.main([N, "--", *options, *args])`` in this process, from ``tmp_path`` (its records go
    to ``tmp_path/tests/unit``): ``(exit status, its stdout, stderr)``. Its stdout is a file
    (block-buffered, as a CI log is; ``$RUNNER_STDOUT`` names it); its repetitions' output goes
    to capfd. Each repetition is a pytest process with only the harness's plugin (about 1 s; the
    entry points' plugins, hypothesis's above all, would triple that)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("POSTTRAIN_UNIT_RESULTS_DIR", raising=False)
    monkeypatch.delenv("POSTTRAIN_REPEAT_INDEX", raising=False)  # this file may itself run under --repeat
    monkeypatch.setenv("POSTTRAIN_NUM_GPUS", "0")
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    path = tmp_path / "stdout.txt"
    monkeypatch.setenv("RUNNER_STDOUT", str(path))
    with path.open("w", encoding="utf-8") as stdout:
        def call(count: str, *args: str, options: tuple[str, ...] = HARNESS_ONLY) -> tuple[int, str, str]:
            monkeypatch.setattr(sys, "stdout", stdout)  # here: capture sets its own at the test's start
            code = main([count, "--", *options, *(str(repeat_tree / a) if a.endswith(".py") else a for a in args)])
            stdout.flush()
            return code, path.read_text(encoding="utf-8"), capfd.readouterr().err

        yield call


def split_rows(lines: list[str]) -> list[list[str]]:
    return [line.split() for line in lines]


@pytest.mark.parametrize("argv", [[], ["2"], ["2", "-k", "x"]], ids=["nothing", "no-dashes", "no-dashes-args"])
def test_the_runner_without_n_and_dashes_prints_its_usage_and_exits_2(argv, capsys):
    assert main(argv) == 2
    assert capsys.readouterr() == ("", "usage: python -m posttrain.testing.harness.repeat N -- PYTEST_ARGS...\n")


def test_the_runner_refuses_a_bad_n_in_one_line_before_any_run(capsys):
    assert main(["0", "--", "-k", "x"]) == 2
    assert capsys.readouterr() == ("", "run_unit.sh: --repeat needs a positive integer, got '0'\n")


def test_n_and_dashes_alone_run_pytest_on_its_own_selection(run_main):
    code, out, _ = run_main("1", options=())  # in an empty directory: nothing to collect
    assert code == 5, out
    assert out.splitlines()[-2:] == ["run_unit.sh --repeat: exit 5: nothing was tested",
                                     f"records: {Path.cwd()}/tests/unit/unit_results/repeat/run-*/ (junit.xml, "
                                     "unit_results.json)"]


def test_a_flaky_test_passes_half_of_two_runs_and_fails_them_beside_an_infrastructure_error(run_main, tmp_path):
    code, out, _ = run_main("2", "--junitxml=mine.xml", "test_flaky.py", "test_infra.py")  # ours wins: last
    assert code == 1, out
    lines = out.splitlines()
    assert [line for line in lines if line.startswith("run_unit.sh --repeat: run ")] == [
        "run_unit.sh --repeat: run 0 (1 of 2, POSTTRAIN_REPEAT_INDEX=0)",
        "run_unit.sh --repeat: run 1 (2 of 2, POSTTRAIN_REPEAT_INDEX=1)"]
    records = tmp_path / "tests" / "unit" / "unit_results" / "repeat"
    report = lines[lines.index("run_unit.sh --repeat: 2 runs, pass rate per test") + 1:]
    assert split_rows(report[:4]) == [["test", "runs", "passed", "failed", "infra", "skipped", "pass", "rate"],
                                      ["test_flaky.py::test_odd", "2", "1", "1", "0", "0", "50%"],
                                      ["test_flaky.py::test_steady", "2", "2", "0", "0", "0", "100%"],
                                      ["test_infra.py::test_cluster", "2", "0", "0", "2", "0", "-"]]
    ray_start = ("test_infra.py::test_cluster: Ray did not start: posttrain.errors.RayStartError: Ray's local node "
                 "timed out during startup on all 5 attempts (the machine is busy)")
    assert report[4:] == [
        f"run 0 infrastructure error: {ray_start}"[:160],
        "run 1 failed: test_flaky.py::test_odd: AssertionError: odd repetition 1",
        f"run 1 infrastructure error: {ray_start}"[:160],
        "2 runs of 3 tests: 1 flaky (passed and failed), 0 always failed, 2 infrastructure errors",
        "run_unit.sh --repeat: exit 1: a test failed in at least one run",
        f"records: {records}/run-*/ (junit.xml, unit_results.json)"]
    for i in range(2):  # each repetition kept its own records (test_steady checked its directory)
        assert (records / f"run-{i}" / "junit.xml").is_file() and (records / f"run-{i}" / "unit_results.json").is_file()


def test_a_pytest_killed_mid_run_is_an_infrastructure_error_for_the_whole_run(run_main, tmp_path):
    stale = tmp_path / "tests" / "unit" / "unit_results" / "repeat" / "run-0" / "junit.xml"
    stale.parent.mkdir(parents=True)
    stale.write_text(junit(case("test_dies")))  # an earlier --repeat's record must not stand in for this run's
    code, out, _ = run_main("2", "test_crash.py")
    assert code == EXIT_INFRA, out
    killed = "pytest exited with signal SIGKILL and left no readable JUnit XML (killed or crashed)"
    assert out.splitlines()[-6:] == [
        "test  runs  passed  failed  infra  skipped  pass rate",
        f"run 0 infrastructure error: {killed}", f"run 1 infrastructure error: {killed}",
        "2 runs of 0 tests: 0 flaky (passed and failed), 0 always failed, 2 infrastructure errors",
        "run_unit.sh --repeat: exit 3: infrastructure errors only, no test failure",
        f"records: {stale.parent.parent}/run-*/ (junit.xml, unit_results.json)"]


def test_pytest_refusing_the_arguments_stops_at_the_first_run_with_exit_2(run_main):
    code, out, err = run_main("3", "-Z", "test_flaky.py")
    assert code == 2, out + err
    assert err.endswith("\nrun_unit.sh: pytest refused the arguments (see above): exit 2\n"), err
    assert [line for line in out.splitlines() if line.startswith("run_unit.sh --repeat")] == [
        "run_unit.sh --repeat: run 0 (1 of 3, POSTTRAIN_REPEAT_INDEX=0)"]


def test_ctrl_c_prints_the_finished_runs_and_exits_130(run_main):
    # as in a terminal: SIGINT raises KeyboardInterrupt (mutmut's workers ignore it)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code, out, err = run_main("3", "test_ctrl_c.py")
    except KeyboardInterrupt:
        pytest.fail("the runner let Ctrl-C through")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 130, out + err
    lines = out.splitlines()
    assert [line for line in lines if line.startswith("run_unit.sh --repeat")] == [
        "run_unit.sh --repeat: run 0 (1 of 3, POSTTRAIN_REPEAT_INDEX=0)",
        "run_unit.sh --repeat: run 1 (2 of 3, POSTTRAIN_REPEAT_INDEX=1)"]
    assert split_rows(lines[-3:-1]) == [["test", "runs", "passed", "failed", "infra", "skipped", "pass", "rate"],
                                        ["test_ctrl_c.py::test_interrupted", "1", "1", "0", "0", "0", "100%"]]
    assert lines[-1] == "1 runs of 1 tests: 0 flaky (passed and failed), 0 always failed, 0 infrastructure errors"
    assert err == "run_unit.sh --repeat: interrupted after 1 of 3 runs: exit 130\n"


# ---------------------------------------------------------------- run_unit.sh and the fixture (pytester)

@pytest.fixture
def tree(pytester, monkeypatch):
    """test_flaky.py (test_odd fails on odd repetitions); harness on."""
    monkeypatch.setenv("POSTTRAIN_UNIT_RESULTS_DIR", str(pytester.path / "results"))
    monkeypatch.setenv("POSTTRAIN_NUM_GPUS", "0")
    monkeypatch.delenv("POSTTRAIN_REPEAT_INDEX", raising=False)  # this file may itself run under --repeat
    pytester.makepyfile(test_flaky=FLAKY)
    pytester.makeini("[pytest]\nposttrain_harness = true\n")
    return pytester


def test_a_bad_repeat_index_is_one_usage_error(tree, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_REPEAT_INDEX", "x")
    result = tree.runpytest_inprocess("-p", "no:cacheprovider", "test_flaky.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: POSTTRAIN_REPEAT_INDEX='x': expected a non-negative integer*"])
    off = tree.runpytest_inprocess("-p", "no:cacheprovider", "-o", "posttrain_harness=false", "test_flaky.py",
                                   "-k", "odd")
    off.assert_outcomes(errors=1)  # the harness off: the fixture itself refuses the value
    off.stdout.fnmatch_lines(["*POSTTRAIN_REPEAT_INDEX='x': expected a non-negative integer*"])


def run_unit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "POSTTRAIN_NUM_GPUS": "0", "POSTTRAIN_UNIT_RESULTS_DIR": str(tmp_path / "results"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("POSTTRAIN_REPEAT_INDEX", None)
    return subprocess.run(["bash", "tests/run_unit.sh", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def test_run_unit_sh_repeats_with_a_configuration_k_and_a_path(tree):
    proc = run_unit(tree.path, "--hf-gated", "--repeat", "2", "-p", "no:cacheprovider", "-k", "odd",
                    str(tree.path / "test_flaky.py"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ("run_unit.sh: configuration default +hf-gated, -m '(not slow and not mcore and not vllm and not "
            "nightly and not learning)', 0 GPU(s), 2 runs (--repeat)") in proc.stderr
    assert re.search(r"^test_flaky\.py::test_odd\s+2\s+1\s+1\s+0\s+0\s+50%$", proc.stdout, re.MULTILINE), proc.stdout
    assert "2 runs of 1 tests: 1 flaky (passed and failed)" in proc.stdout


@pytest.mark.parametrize(("args", "value"), [(("--repeat", "0"), "0"), (("--repeat", "-1"), "-1"),
                                             (("--repeat", "abc"), "abc"), (("--repeat",), "")],
                         ids=["zero", "negative", "word", "missing"])
def test_run_unit_sh_refuses_a_bad_repeat_in_one_line(tmp_path, args, value):
    proc = run_unit(tmp_path, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == f"run_unit.sh: --repeat needs a positive integer, got {value!r}\n"
    assert proc.stdout == ""  # pytest never started
