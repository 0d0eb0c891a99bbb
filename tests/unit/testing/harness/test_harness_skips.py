"""A selection that ran nothing is never green, and every skip is declared (posttrain.testing.harness.skips).

"Nothing ran" means no test ran its body to a verdict: skips at collection (a module's importorskip),
at set-up (a ``gpu(n)`` marker, a fixture that skips) and at run time (``pytest.skip`` in the body)
all leave a selection untested, so ``--fail-on-nothing-ran`` exits 5 for each. Skip accounting: the
configuration table's ``[[skip]]`` rows declare each reason with the machines where it is expected;
the harness prints the skips by row and, where skips are strict (``--strict-skips``, ``CI=true``),
fails on an undeclared skip or one whose conditions do not hold here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from posttrain.testing.harness.configurations import PlanError, load_table
from posttrain.testing.harness.selection import gpu_skip_reason
from posttrain.testing.harness.skips import (
    Machine,
    Skip,
    SkipRule,
    SkipTableError,
    account,
    is_importable,
    load_skip_rules,
    render_markdown,
    skip_reason,
    strict_from,
)

REPO = Path(__file__).resolve().parents[4]

# ---------------------------------------------------------------- the decisions (pure)

GPUS = SkipRule(r"needs (?P<n>\d+) GPUs?, found \d+", {"gpus_below": "{n}"})
VLLM = SkipRule(r"needs vLLM", {"module_missing": "vllm"})
IMPORT = SkipRule(r"could not import '(?P<module>[\w.]+)': .*", {"module_missing": "{module}"})


def machine(gpus: int = 0, strict: bool = True, importable=frozenset(), tools=frozenset(), versions=None,
            rootdir: Path = REPO) -> Machine:
    return Machine(gpus, rootdir, strict, importable=lambda m: m in importable,
                   which=lambda t: f"/usr/bin/{t}" if t in tools else None,
                   version=lambda m: (versions or {}).get(m))


def test_a_skip_declared_for_this_machine_is_expected_and_one_for_another_machine_is_not():
    skips = [Skip("t.py::a", "needs 2 GPUs, found 0"), Skip("t.py::b", "needs 1 GPU, found 0")]
    on_cpu = account(skips, [GPUS], machine(gpus=0))
    assert on_cpu.violations() == []
    assert [(g.expected, g.nodeids) for g in on_cpu.groups] == [(True, ["t.py::a"]), (True, ["t.py::b"])]
    # the same skips where the GPUs are present: the test should have run
    on_two_gpus = account(skips, [GPUS], machine(gpus=2))
    assert on_two_gpus.violations() == [
        "unexpected skip: t.py::a: 'needs 2 GPUs, found 0' is declared for fewer than 2 GPUs (here: 2 GPUs)",
        "unexpected skip: t.py::b: 'needs 1 GPU, found 0' is declared for fewer than 1 GPUs (here: 2 GPUs)",
    ]
    # one GPU: the 2-GPU skip is expected, the 1-GPU one is not
    assert [line.split(":")[1].strip() for line in account(skips, [GPUS], machine(gpus=1)).violations()] == ["t.py"]
    assert "t.py::b" in account(skips, [GPUS], machine(gpus=1)).violations()[0]


def test_a_reason_no_row_declares_is_a_violation_naming_the_test_and_the_reason():
    got = account([Skip("t.py::c", "no backend here")], [GPUS, VLLM], machine())
    assert got.violations() == ["undeclared skip: t.py::c: 'no backend here' matches no [[skip]] row of the "
                                "configuration table: declare it with the machines where it is expected"]
    assert got.groups[0].rule is None


def test_the_whole_reason_must_match_not_a_part_of_it():
    assert account([Skip("t.py::d", "needs 2 GPUs, found 0 and a kernel")], [GPUS], machine()).violations()


def test_a_group_of_the_reason_fills_the_condition():
    skips = [Skip("m.py", "could not import 'matplotlib': No module named 'matplotlib'")]
    assert account(skips, [IMPORT], machine(importable={"torch"})).violations() == []
    assert account(skips, [IMPORT], machine(importable={"matplotlib"})).violations() == [
        "unexpected skip: m.py: \"could not import 'matplotlib': No module named 'matplotlib'\" is declared for "
        "matplotlib not importable (here: importable)"]


@pytest.mark.parametrize(("when", "expected_on", "not_on"), [
    ({"gpus_at_least": 1}, machine(gpus=1), machine(gpus=0)),
    ({"tool_missing": "script"}, machine(), machine(tools={"script"})),
    ({"module_older": ["torch", "2.9"]}, machine(versions={"torch": "2.8.1"}), machine(versions={"torch": "2.9.0"})),
    ({"module_older": ["torch", "2.9"]}, machine(versions={"torch": "2.8.1"}), machine(versions={})),
    ({"local_only": True}, machine(strict=False), machine(strict=True)),
    ({"gpus_below": 2, "module_missing": "vllm"}, machine(gpus=0), machine(gpus=0, importable={"vllm"})),
])
def test_each_condition_holds_on_its_machine_only(when, expected_on, not_on):
    rule = SkipRule("r", when)
    assert account([Skip("t.py::x", "r")], [rule], expected_on).violations() == []
    assert len(account([Skip("t.py::x", "r")], [rule], not_on).violations()) == 1


def test_no_git_holds_where_the_rootdir_has_no_git_file_or_folder(tmp_path):
    """A checkout's ``.git`` is a folder, a worktree's a file; the container image has neither."""
    (tmp_path / "checkout" / ".git").mkdir(parents=True)
    (tmp_path / "worktree").mkdir()
    (tmp_path / "worktree" / ".git").write_text("gitdir: /elsewhere\n")
    (tmp_path / "image").mkdir()
    rule, skip = SkipRule("r", {"no_git": True}), [Skip("t.py::x", "r")]
    assert account(skip, [rule], machine(rootdir=tmp_path / "image")).violations() == []
    for checkout in ("checkout", "worktree"):
        assert account(skip, [rule], machine(rootdir=tmp_path / checkout)).violations() == [
            "unexpected skip: t.py::x: 'r' is declared for not a git checkout (here: a git checkout)"]


@pytest.mark.parametrize(("row", "message"), [
    ({"reason": "(", "when": {"gpus_below": 1}}, "is not a regular expression"),
    ({"reason": "r", "when": {"gpu_count": 1}}, "unknown condition 'gpu_count'"),
    ({"reason": "r", "when": {}}, "`when` is empty"),
    ({"reason": "r"}, "needs `reason` and `when`"),
    ({"reason": "r", "when": {"no_git": True}, "because": "x"}, "not 'because'"),
])
def test_an_unusable_row_is_one_error_naming_it(row, message):
    with pytest.raises(SkipTableError, match=message):
        load_skip_rules([row])


def test_the_unusable_rows_messages_word_for_word():
    with pytest.raises(SkipTableError) as err:
        load_skip_rules([{"reason": "r"}])
    assert str(err.value) == "[[skip]] row {'reason': 'r'}: needs `reason` and `when` (and optionally `about`)"
    with pytest.raises(SkipTableError) as err:
        SkipRule("r", {"gpu_count": 1})
    assert str(err.value) == ("[[skip]] reason 'r': unknown condition 'gpu_count'; known: gpus_below, gpus_at_least, "
                              "module_missing, module_older, tool_missing, no_git, local_only")


def test_the_docs_table_escapes_pipes_quotes_backticks_and_leaves_a_missing_about_empty():
    rules = load_skip_rules([
        {"reason": "a|b", "when": {"gpus_below": "{n}", "module_missing": "vllm"}},
        {"reason": "needs `script`", "when": {"tool_missing": "script"}, "about": "the terminal test"},
    ])
    assert render_markdown(rules).splitlines() == [
        "| skip reason (regular expression) | expected where | who skips so |",
        "|---|---|---|",
        "| `a\\|b` | fewer than {n} GPUs; vllm not importable |  |",
        "| `` needs `script` `` | no `script` on PATH | the terminal test |",
    ]


def test_every_condition_of_a_row_is_said_with_what_this_machine_has():
    rule = SkipRule(r"needs (?P<n>\d+) GPUs and vLLM", {"gpus_below": "{n}", "module_missing": "vllm"})
    got = account([Skip("t.py::v", "needs 2 GPUs and vLLM")], [rule], machine(gpus=4, importable={"vllm"}))
    assert got.violations() == ["unexpected skip: t.py::v: 'needs 2 GPUs and vLLM' is declared for fewer than 2 GPUs "
                                "(here: 4 GPUs); vllm not importable (here: importable)"]


def test_a_group_fills_a_list_of_values_and_a_version_that_is_no_version_is_not_older():
    rule = SkipRule(r"(?P<module>\w+) is too old", {"module_older": ["{module}", "2.9"]})
    skip = [Skip("t.py::k", "torch is too old")]
    assert account(skip, [rule], machine(versions={"torch": "2.8.1"})).violations() == []
    assert account(skip, [rule], machine(versions={"torch": "nightly-build"})).violations() == [
        "unexpected skip: t.py::k: 'torch is too old' is declared for torch older than 2.9 (here: torch nightly-build)"]


@pytest.mark.parametrize(("name", "importable"), [("json", True), ("no_such_package_here", False),
                                                  ("no_such_package_here.sub", False), ("", False)])
def test_a_package_is_importable_only_where_import_would_find_it(name, importable):
    """A dotted name whose parent is missing, or no name at all, is not importable (not an error)."""
    assert is_importable(name) is importable


def test_a_machine_reads_installed_versions_from_the_package_metadata():
    here = Machine(0, REPO, strict=False)
    assert here.version("pytest") == pytest.__version__
    assert here.version("no-such-distribution-here") is None


def report_of(outcome: str, longrepr: object, **attrs: object) -> pytest.TestReport:
    report = pytest.TestReport("t.py::x", ("t.py", 0, "x"), {}, outcome, longrepr, "call")  # type: ignore[arg-type]
    for name, value in attrs.items():
        setattr(report, name, value)
    return report


def test_a_skip_reports_reason_is_its_message_and_an_xfail_or_a_pass_has_none():
    assert skip_reason(report_of("skipped", ("t.py", 3, "Skipped: no GPU here"))) == "no GPU here"
    assert skip_reason(report_of("skipped", "odd")) == "odd"  # a plugin's plain-text reason, as it is
    assert skip_reason(report_of("skipped", ("t.py", 3, "Skipped: known"), wasxfail="known")) is None
    assert skip_reason(report_of("passed", None)) is None


def test_accounting_is_on_unless_the_plugin_switches_it_off_in_a_worker():
    """The plugin switches it off in workers (the controller sees their reports); by default it accounts."""
    from types import SimpleNamespace

    from posttrain.testing.harness.skips import SkipAccounting

    skipped = report_of("skipped", ("t.py", 3, "Skipped: needs 2 GPUs, found 0"))
    for active, nodeids in ((None, [["t.py::x"]]), (False, None)):
        plugin = SkipAccounting((GPUS,), machine()) if active is None else SkipAccounting((GPUS,), machine(), active)
        plugin.pytest_runtest_logreport(skipped)
        plugin.pytest_sessionfinish(SimpleNamespace(exitstatus=pytest.ExitCode.OK))  # type: ignore[arg-type]
        assert (plugin.accounting and [g.nodeids for g in plugin.accounting.groups]) == nodeids


def test_a_bad_row_makes_the_table_a_usage_error(tmp_path):
    table = (REPO / "tests" / "configurations.toml").read_text() + '\n[[skip]]\nreason = "x"\nwhen = { gpu = 1 }\n'
    (tmp_path / "t.toml").write_text(table)
    with pytest.raises(PlanError, match="unknown condition 'gpu'"):
        load_table(tmp_path / "t.toml")


@pytest.mark.parametrize(("option", "env", "rules", "strict"), [
    (True, {}, (), True),
    (False, {"CI": "true"}, (GPUS,), True),
    (False, {"CI": "1"}, (GPUS,), True),
    (False, {"CI": " Yes\n"}, (GPUS,), True),
    (False, {"CI": "false"}, (GPUS,), False),
    (False, {}, (GPUS,), False),
    (False, {"CI": "true"}, (), False),  # a table without [[skip]] rows has not opted in
])
def test_skips_are_strict_with_the_flag_or_under_ci_where_the_table_declares_skips(option, env, rules, strict):
    assert strict_from(option, env, rules) is strict


def _literal(node: ast.expr) -> str | None:
    """A reason argument as the test gives it: a string, or an f-string with 0 for each field."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "0" for v in node.values)
    return None


def suite_skip_reasons(root: Path) -> list[tuple[str, str]]:
    """(where, reason) of every ``pytest.skip(...)``, ``skipif(..., reason=...)`` and
    ``importorskip(..., reason=...)`` in the test sources under ``root`` (an importorskip without
    a reason gives pytest's "could not import 'M': ..."). Calls inside pytester's inner sources
    are strings, not calls, and are not read."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            name = node.func.attr
            reason = next((k.value for k in node.keywords if k.arg == "reason"), None)
            if name == "skip" and reason is None and node.args:
                reason = node.args[0]
            if name == "importorskip" and reason is None and node.args:
                module = _literal(node.args[0])
                found.append((f"{path.relative_to(root)}:{node.lineno}", f"could not import '{module}': x"))
            elif name in ("skip", "skipif", "importorskip") and reason is not None:
                text = _literal(reason)
                assert text is not None, f"{path}:{node.lineno}: a skip reason that is not a literal"
                found.append((f"{path.relative_to(root)}:{node.lineno}", text))
    return found


def test_every_skip_reason_the_suite_gives_is_declared_by_its_table():
    """Read from the sources, not listed by hand: a new skip reason without a row fails here on any
    machine, not only in CI where it would skip."""
    table = load_table(REPO / "tests" / "configurations.toml")
    reasons = suite_skip_reasons(REPO / "tests")
    assert len(reasons) >= 20  # the walk finds the suite's skips (23 when this was written)
    undeclared = [(where, reason) for where, reason in reasons
                  if not any(rule.pattern.fullmatch(reason) for rule in table.skips)]
    assert undeclared == []
    # and the harness's own gpu(n) reason
    assert any(rule.pattern.fullmatch(gpu_skip_reason_for(2, 0)) for rule in table.skips)


def gpu_skip_reason_for(needed: int, found: int) -> str:
    class Item:
        nodeid = "t.py::t"

        def get_closest_marker(self, name):
            return pytest.mark.gpu(needed).mark

    return gpu_skip_reason(Item(), found) or ""


# ---------------------------------------------------------------- pytest runs

INNER = '''
import pytest

@pytest.fixture
def backend():
    pytest.skip("no backend here")

def test_runtime_skip():
    pytest.skip("no backend here")

def test_setup_skip(backend):
    pass

@pytest.mark.gpu(2)
def test_gpu():
    pass

@pytest.mark.xfail(reason="known")
def test_xfail():
    assert False

def test_runs():
    pass
'''
TABLE = '''
[[configuration]]
name = "default"
flag = ""
select = "not nothing"
extra = ""
package = ""
help = "all"

[[skip]]
reason = 'needs (?P<n>\\d+) GPUs?, found \\d+'
when = { gpus_below = "{n}" }
'''


@pytest.fixture
def inner(harness_pytester):
    pytester = harness_pytester
    pytester.makepyfile(test_inner=INNER)
    pytester.makepyfile(test_module_skip="import pytest\npytest.importorskip('no_such_module_here')\n\n"
                                         "def test_never():\n    pass\n")
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "configurations.toml").write_text(TABLE)
    pytester.makeini("[pytest]\nposttrain_harness = true\n")
    return pytester


def run(pytester, *args: str, ret: int) -> pytest.RunResult:
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:randomly", "--fail-on-nothing-ran",
                                          *args)
    assert result.ret == ret, result.stdout.str()
    return result


@pytest.mark.parametrize("kind", ["test_runtime_skip", "test_setup_skip", "test_gpu", "test_module_skip.py"])
def test_a_selection_whose_tests_all_skipped_exits_5_whenever_they_skipped(inner, kind):
    """Run time (the body skips), set-up (a fixture skips; a gpu(n) marker), collection (importorskip)."""
    target = kind if kind.endswith(".py") else f"test_inner.py::{kind}"
    result = run(inner, target, ret=5)
    result.stdout.fnmatch_lines(["nothing was tested: no test selected, or every selected test skipped (exit 5)"])


def test_an_xfail_ran_its_body_and_one_test_that_ran_is_enough(inner):
    run(inner, "test_inner.py::test_xfail", ret=0)
    run(inner, "test_inner.py::test_runtime_skip", "test_inner.py::test_runs", ret=0)


def test_all_skipped_under_two_xdist_workers_exits_5(inner):
    result = inner.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--fail-on-nothing-ran",
                                        "-k", "runtime_skip or setup_skip or gpu", timeout=120)
    assert result.ret == 5, result.stdout.str()


def test_the_skips_are_printed_by_reason_and_strict_skips_fail_on_an_undeclared_one(inner):
    lenient = run(inner, ret=0)
    lenient.stdout.fnmatch_lines([
        "-* skips by reason (not strict: --strict-skips or CI=true fails on an undeclared or unexpected skip) -*",
        "   1 needs 2 GPUs, found 0: expected: fewer than 2 GPUs (here: 0 GPUs)",
        "   1 could not import 'no_such_module_here'*: NOT DECLARED: not declared",  # collected first
        "   2 no backend here: NOT DECLARED: not declared",
    ])
    strict = run(inner, "--strict-skips", ret=1)
    strict.stdout.fnmatch_lines([
        "-* skips by reason (strict: every skip must be declared and expected here) -*",
        "undeclared skip: test_module_skip.py: \"could not import 'no_such_module_here'*",
        "undeclared skip: test_inner.py::test_runtime_skip: 'no backend here' matches no ??skip?? row*",
        "undeclared skip: test_inner.py::test_setup_skip: 'no backend here' matches no ??skip?? row*",
    ])
    assert "undeclared skip: test_inner.py::test_gpu" not in strict.stdout.str()
    assert strict.stdout.str().count("undeclared skip: ") == 3  # the xfail ran: not a skip


def test_a_session_without_skips_prints_no_skips_section(inner):
    assert "skips by reason" not in run(inner, "test_inner.py::test_runs", "--strict-skips", ret=0).stdout.str()


def test_no_git_is_judged_on_the_sessions_rootdir(inner):
    (inner.path / "tests" / "configurations.toml").write_text(TABLE + "\n[[skip]]\nreason = 'no git here'\n"
                                                             "when = { no_git = true }\n")
    inner.makepyfile(test_git="import pytest\n\ndef test_git():\n    pytest.skip('no git here')\n")
    run(inner, "test_git.py", "test_inner.py::test_runs", "--strict-skips", ret=0)
    (inner.path / ".git").mkdir()
    result = run(inner, "test_git.py", "test_inner.py::test_runs", "--strict-skips", ret=1)
    result.stdout.fnmatch_lines(["*unexpected skip: test_git.py::test_git: 'no git here' is declared for "
                                 "not a git checkout (here: a git checkout)*"])


def test_ci_makes_skips_strict_and_a_declared_skip_on_the_wrong_machine_fails(inner, monkeypatch):
    monkeypatch.setenv("CI", "true")
    run(inner, "test_inner.py", "-k", "gpu or runs", ret=0)  # the GPU skip is declared for this 0-GPU machine
    # a machine that says it has 2 GPUs, where the test skipped all the same (here: the table's
    # condition is judged against POSTTRAIN_NUM_GPUS, the marker's reason was written for 0)
    inner.makepyfile(test_lying="import pytest\n\ndef test_two():\n    pytest.skip('needs 2 GPUs, found 0')\n")
    monkeypatch.setenv("POSTTRAIN_NUM_GPUS", "2")
    result = run(inner, "test_lying.py", "test_inner.py::test_runs", "--color=yes", ret=1)
    result.stdout.fnmatch_lines(["   1 needs 2 GPUs, found 0: NOT EXPECTED: fewer than 2 GPUs (here: 2 GPUs)",
                                 "\x1b[[]31m*unexpected skip: test_lying.py::test_two: 'needs 2 GPUs, found 0' "
                                 "is declared for fewer than 2 GPUs (here: 2 GPUs)*"])  # in red


def test_under_xdist_the_controller_accounts_for_every_workers_skips(inner):
    result = inner.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--strict-skips", timeout=120)
    assert result.ret == 1, result.stdout.str()
    result.stdout.fnmatch_lines(["*2 no backend here: NOT DECLARED*"])
    assert result.stdout.str().count("undeclared skip: ") == 3
