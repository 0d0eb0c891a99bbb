"""Tests for the flags issue 3 added to posttrain/testing/check_metrics.py, and every exit code.

Exit codes: 0 every rule passed (WARN/SKIP allowed), 1 a rule failed or is vacuous, 2 usage
error. ``check_metrics.main`` is called in-process; a few tests run the script as CI does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.testing import check_metrics as check_metrics

CLI = Path(__file__).resolve().parents[2] / "check_metrics.py"
LOSS_FALLS = 'mean(data["train/loss"], -3) < mean(data["train/loss"], 1, 4)'
DATA = {
    "train/loss": {str(s): 2.0 - 0.1 * s for s in range(1, 11)},
    "train/grad_norm": {str(s): 1.0 + 0.05 * s for s in range(1, 11)},
    "train/clip_fraction": {str(s): 0.0 if s % 2 else 0.29 for s in range(1, 11)},
    "train/entropy": {str(s): 0.5 - 0.01 * s for s in range(1, 11)},
    "train/kl": {str(s): 0.01 * s for s in range(1, 11)},
    "train/reward_mean": {str(s): 0.2 + 0.02 * s for s in range(1, 11)},
    "train/fraction_groups_kept": {str(s): 0.9 for s in range(1, 11)},
    "val/accuracy": {"0": 0.3, "10": 0.5},
    "eval/score": 0.7,
}


@pytest.fixture
def metrics(tmp_path: Path) -> Path:
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(DATA))
    return path


def main(capsys, *args: str) -> tuple[int, str, str]:
    code = check_metrics.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


class TestExpectSteps:
    def test_complete_run_passes(self, metrics, capsys):
        assert main(capsys, metrics, LOSS_FALLS, "--expect-steps", "10")[0] == 0

    def test_run_that_ended_early_fails_every_rule(self, metrics, capsys):
        code, out, _ = main(capsys, metrics, LOSS_FALLS, 'data["eval/score"] > 0.5', "--expect-steps", "200")
        assert code == 1
        assert out.count("run stopped at step 10 of 200") == 2 and "2 checks: 2 FAIL" in out

    @pytest.mark.parametrize("bad", ["0", "-5", "ten"])
    def test_bad_value_is_a_usage_error(self, metrics, capsys, bad):
        with pytest.raises(SystemExit) as info:
            check_metrics.main([str(metrics), LOSS_FALLS, "--expect-steps", bad])
        assert info.value.code == 2
        assert "--expect-steps" in capsys.readouterr().err


class TestPacks:
    def test_pack_without_explicit_rules(self, metrics, capsys):
        code, out, _ = main(capsys, metrics, "--pack", "grpo", "--expect-steps", "10")
        assert code == 0
        assert "all_finite(data" in out and "SKIP" in out  # no train/token_mult_prob_error logged

    def test_bound_flag_overrides_the_pack_default(self, metrics, capsys):
        code, out, _ = main(capsys, metrics, "--pack", "grpo", "--min-entropy", "0.6")
        assert code == 1 and 'min(data["train/entropy"]) > 0.6' in out

    @pytest.mark.parametrize("args", [["--pack", "dpo"], ["--pack", "grpo", "--min-entropy", "nan"]])
    def test_unknown_pack_or_bad_bound_is_a_usage_error(self, metrics, args):
        with pytest.raises(SystemExit) as info:
            check_metrics.main([str(metrics), *args])
        assert info.value.code == 2


class TestVacuityAndMargins:
    def test_vacuous_rule_exits_1(self, metrics, capsys):
        code, out, _ = main(capsys, metrics, 'min(data["train/clip_fraction"]) >= 0')
        assert code == 1 and "VACUOUS" in out

    def test_no_vacuity_check(self, metrics, capsys):
        assert main(capsys, metrics, 'min(data["train/clip_fraction"]) >= 0', "--no-vacuity-check")[0] == 0

    def test_thin_margin_is_a_warn_row_with_exit_0(self, metrics, capsys):
        code, out, _ = main(capsys, metrics, 'max(data["train/clip_fraction"]) < 0.3', "--min-margin", "0.05")
        assert code == 0 and "WARN" in out and "3.3%" in out

    def test_negative_min_margin_is_a_usage_error(self, metrics):
        with pytest.raises(SystemExit) as info:
            check_metrics.main([str(metrics), LOSS_FALLS, "--min-margin", "-0.1"])
        assert info.value.code == 2


class TestOutputs:
    def test_output_json_rows(self, metrics, tmp_path, capsys):
        report = tmp_path / "out" / "report.json"
        main(capsys, metrics, LOSS_FALLS, 'max(data["train/loss"]) < 1', "--output-json", report)
        rows = json.loads(report.read_text())
        assert [r["status"] for r in rows] == ["PASS", "FAIL"]
        assert all(set(r) == {"rule", "status", "value", "bound", "margin", "message"} for r in rows)
        assert rows[1]["value"] == pytest.approx(1.9) and rows[1]["bound"] == 1

    def test_github_summary_appends_when_the_variable_is_set(self, metrics, tmp_path, capsys, monkeypatch):
        summary = tmp_path / "summary.md"
        summary.write_text("earlier step\n")
        monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
        main(capsys, metrics, LOSS_FALLS, "--github-summary")
        text = summary.read_text()
        assert text.startswith("earlier step\n### Metric Checks") and "| PASS |" in text

    def test_github_summary_without_the_variable_writes_nothing(self, metrics, capsys, monkeypatch):
        monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
        assert main(capsys, metrics, LOSS_FALLS, "--github-summary")[0] == 0

    def test_unwritable_output_is_a_usage_error(self, metrics, tmp_path, capsys):
        blocker = tmp_path / "file"
        blocker.write_text("")
        code, _, err = main(capsys, metrics, LOSS_FALLS, "--output-json", blocker / "report.json")
        assert code == 2 and "cannot write" in err


class TestInputs:
    def test_tb_dir(self, tmp_path, capsys):
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
        for step in range(1, 11):
            writer.add_scalar("train/loss", 2.0 - 0.1 * step, global_step=step)
        writer.close()
        code, out, _ = main(capsys, "--tb-dir", tmp_path / "tb", LOSS_FALLS, "--expect-steps", "10")
        assert code == 0 and "1 checks: 1 PASS" in out

    def test_tb_dir_without_events_is_a_usage_error(self, tmp_path, capsys):
        code, _, err = main(capsys, "--tb-dir", tmp_path, LOSS_FALLS)
        assert code == 2 and "no TensorBoard event files" in err

    def test_file_and_tb_dir_together_is_a_usage_error(self, metrics, tmp_path, capsys):
        code, _, err = main(capsys, metrics, "--tb-dir", tmp_path, LOSS_FALLS)
        assert code == 2 and "not both" in err

    @pytest.mark.parametrize(("args", "message"), [([], "no metrics file"), (["--pack", "grpo"], "no metrics file")])
    def test_no_metrics_file(self, capsys, args, message):
        code, _, err = main(capsys, *args)
        assert code == 2 and message in err

    def test_no_rules_is_a_usage_error(self, metrics, capsys):
        code, _, err = main(capsys, metrics)
        assert code == 2 and "no rules given" in err

    def test_options_may_follow_the_rules(self, metrics, capsys):
        assert main(capsys, metrics, LOSS_FALLS, "--expect-steps", "10", LOSS_FALLS)[0] == 0


class TestNothingRuns:
    """A forbidden construct is a usage error before anything is read or run."""

    @pytest.mark.parametrize(
        "rule",
        [
            "__import__('os').system('touch {marker}')",
            "data.__class__.__init__.__globals__['os'].system('touch {marker}')",
            "(lambda: __import__('os').system('touch {marker}'))()",
            "[__import__('os').system('touch {marker}') for _ in [1]]",
            "open('{marker}', 'w')",
            "min(data['train/loss']) if __import__('os').system('touch {marker}') else 1",
        ],
    )
    def test_rule_that_tries_to_run_code_is_rejected_and_does_nothing(self, metrics, tmp_path, rule):
        marker = tmp_path / "pwned"
        proc = subprocess.run(
            [sys.executable, str(CLI), str(metrics), LOSS_FALLS, rule.format(marker=marker)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "not allowed" in proc.stderr and "Traceback" not in proc.stderr
        assert "Metric Checks" not in proc.stdout
        assert not marker.exists()


@pytest.mark.parametrize(
    ("rule", "says"),
    [
        ("(" * 3000 + "1" + ")" * 3000 + " < 2", "6005 characters, more than the 2000 allowed"),
        ("-" * 1500 + "1 < 2", "nested more than 64 levels deep"),  # the parser alone copes
        ("1" + "+1" * 200 + " < 2", "nested more than 64 levels deep"),
        ("(" * 250 + "1" + ")" * 250 + " < 2", "too many nested parentheses"),
    ],
    ids=["too-long", "deep-unary", "deep-sum", "parser-limit"],
)
def test_pathological_rules_are_one_line_exit_2(metrics, rule, says) -> None:
    proc = subprocess.run([sys.executable, str(CLI), str(metrics), rule], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr and "Error:" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and len(proc.stderr) < 300


def test_a_rule_that_is_not_utf8_is_one_line_exit_2(metrics) -> None:
    # bytes a shell passes through undecoded reach Python as lone surrogates
    rule = b'max(data["train/loss"]) < 2 \xff'
    proc = subprocess.run([sys.executable.encode(), str(CLI).encode(), str(metrics).encode(), rule],
                          capture_output=True, timeout=60)
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, stderr
    assert "not UTF-8 text (byte 0xff at character 28)" in stderr and "Traceback" not in stderr


def test_help_lists_every_helper_the_packs_and_the_exit_codes() -> None:
    from posttrain.testing.rules.helpers import HELPERS

    proc = subprocess.run([sys.executable, str(CLI), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    for name in HELPERS:  # from the code, so a new helper shows up by itself
        assert any(line.startswith(f"  {name}(") for line in lines), name
    assert "  median(values, range_start=1, range_end=0): Median over the steps" in proc.stdout
    assert "--pack grpo:" in proc.stdout and "--pack sft:" in proc.stdout
    assert "exit status: 0 every rule passed" in proc.stdout and "2 usage error" in proc.stdout
