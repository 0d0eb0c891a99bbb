"""The functional scripts' rules (as written in common.sh's grpo_functional / sft.sh) against real runs.

Fixtures in ``fixtures/metrics/`` are the metrics those rules read, from real jobs of this
repository, rounded to 5 significant digits:

- ``grpo_vllm_healthy.json``: the 300-step GRPO run of grpo.sh on the vLLM CPU engine (seed 0),
  val/sampling_accuracy 0.186 -> 0.451 (val/accuracy 0.378 -> 0.626), with the weight-sync probe's
  metrics (``train/*`` and ``val/*`` only; no ``train/kl``: grpo.sh has no KL term).
- ``grpo_collapsed.json``: grpo.sh at 200 steps with policy.lr=2.5e-3 (8x its own): the reward fell
  from 0.25 to 0 within the first steps and stayed there (194 steps with zero gradient, entropy ~1e-4);
  val/sampling_accuracy 0.186 -> 3e-12, val/accuracy 0.378 -> 0.
- ``sft_gsm8k.json``: a 60-step run of sft.sh's GSM8K SFT (an earlier 60-step config).
- ``grpo_async_healthy.json``: the 300-step run of grpo_async.sh (k = 1, vLLM CPU engine, grpo.sh's
  warm start, seed 0), val/sampling_accuracy 0.186 -> 0.419 (``train/*``, ``val/*``, ``async/*``).
- ``grpo_multinode_healthy.json``: the 300-step run of grpo_multinode.sh (two Ray nodes on one
  machine, the vLLM CPU engine on the other node, seed 0), val/sampling_accuracy 0.186 -> 0.452,
  probe max 5.8e-6 (``train/*``, ``val/*``, ``placement/*``).

- ``grpo_step_time_healthy.json`` / ``grpo_step_time_slowed.json``: the step-time gate's series
  (``timing/train_over_reference`` and its two timings, every 5th step) of grpo.sh seed 4 (the
  highest healthy median of the calibration, 1.493) and of grpo.sh seed 0 under the catalogue mutant
  ``train_step_recomputes_forwards`` (a 2x train step; median 2.556), AMD EPYC, 2 cores, Nov 27.

The run killed at step 42 is the healthy run cut at step 42 (runs are deterministic given the
seed, so its log is exactly that prefix).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.testing import check_metrics as check_metrics
from posttrain.testing.rules.checker import CheckOptions, RuleSpec, normalize, run_checks
from posttrain.testing.rules.packs import pack_rules

ROOT = Path(__file__).resolve().parents[4]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"


# grpo.sh and grpo_non_colocated.sh differ only in placement: their rules live in common.sh.
RULES_IN = {"grpo.sh": "common.sh", "grpo_non_colocated.sh": "common.sh", "grpo_async.sh": "common.sh",
            "sft.sh": "sft.sh"}


def check_run_args(script: str) -> list[str]:
    """The arguments the script passes to ``check_run`` after the log dir, as bash would split them."""
    text = (ROOT / "tests" / "functional" / RULES_IN[script]).read_text()
    call = re.search(r'^\s*check_run "\$WORK/logs"(.*?)(?:\n\s*\n|\n\}|\Z)', text, re.S | re.M)
    assert call, f"no check_run call in {script}"
    args = shlex.split(call.group(1).replace("\\\n", " "))
    assert "--expect-steps" in args, f"{script} must pass --expect-steps"
    return args


def test_both_grpo_scripts_run_the_shared_rules() -> None:
    for script in ("grpo.sh", "grpo_non_colocated.sh"):
        assert "\ngrpo_functional " in (ROOT / "tests" / "functional" / script).read_text(), script


def resolved_args(script: str, expect_steps: int, env: dict[str, str] | None = None,
                  extra_rules: tuple[str, ...] = ()) -> list[str]:
    """``check_run_args`` with the shell variables replaced as the script computes them:
    ``${NAME:-default}`` is ``env[NAME]`` when given, else the default (``MIN_VAL_GAIN`` unset:
    common.sh's 0.02); the ``GRPO_EXTRA_RULES`` expansion is
    ``extra_rules``."""
    env = env or {}
    tenth = str((expect_steps + 9) // 10)  # the scripts' tenth: steps in the first / last 10%
    args: list[str] = []
    # sft.sh names it $EXPECT_STEPS (script scope), common.sh $expect_steps (a function local).
    for a in check_run_args(script):
        if a.startswith("${GRPO_EXTRA_RULES[@]"):
            args += extra_rules
            continue
        a = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1), m.group(2)), a)
        args.append(str(expect_steps) if a in ("$EXPECT_STEPS", "$expect_steps") else
                    a.replace("$((tenth + 1))", str(int(tenth) + 1)).replace("$tenth", tenth))
    return args


def run_script_rules(capsys, script: str, fixture: Path, expect_steps: int) -> tuple[int, str]:
    code = check_metrics.main([str(fixture), *resolved_args(script, expect_steps)])
    return code, capsys.readouterr().out


def truncated(tmp_path: Path, steps: int) -> Path:
    data = json.loads((FIXTURES / "grpo_vllm_healthy.json").read_text())
    cut = {m: {s: v for s, v in series.items() if int(s) <= steps} for m, series in data.items()}
    path = tmp_path / f"grpo_stopped_at_{steps}.json"
    path.write_text(json.dumps(cut))
    return path


def failing_rows(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("│ FAIL") or line.startswith("│ VACUOUS")]


class TestGrpoScript:
    def test_script_uses_the_pack_and_expected_steps(self):
        args = check_run_args("grpo.sh")
        assert args[args.index("--pack") + 1] == "grpo" and "$expect_steps" in args

    def test_healthy_run_passes_every_rule(self, capsys, monkeypatch):
        monkeypatch.setenv("COLUMNS", "250")
        code, out = run_script_rules(capsys, "grpo.sh", FIXTURES / "grpo_vllm_healthy.json", 300)
        assert code == 0, out
        assert "FAIL" not in out and "VACUOUS" not in out

    def test_collapsed_run_fails(self, capsys, monkeypatch):
        monkeypatch.setenv("COLUMNS", "250")
        code, out = run_script_rules(capsys, "grpo.sh", FIXTURES / "grpo_collapsed.json", 200)
        assert code == 1
        failed = "\n".join(failing_rows(out))
        assert 'mean(data["val/sampling_accuracy"], -1) - data["val/sampling_accuracy"]["0"] >= 0.02' in failed
        assert 'mean(data["train/reward_mean"], -20) > mean(data["train/reward_mean"], 1, 21)' in failed
        assert 'min(data["train/grad_norm"]) > 0.0' in failed  # the pack's check

    def test_run_that_stopped_at_step_42_fails_every_rule(self, capsys, tmp_path, monkeypatch):
        monkeypatch.setenv("COLUMNS", "250")
        code, out = run_script_rules(capsys, "grpo.sh", truncated(tmp_path, 42), 300)
        assert code == 1
        rows = [line for line in out.splitlines() if line.startswith("│ ")]
        statuses = [row.split("│")[1].strip() for row in rows if row.split("│")[1].strip()]
        assert set(statuses) == {"FAIL", "SKIP"} and statuses.count("SKIP") == out.count(OPTIONAL_SKIP)
        assert out.count("run stopped at step 42 of 300") == statuses.count("FAIL") >= 15

    def test_no_rule_of_the_script_is_vacuous_on_the_healthy_run(self):
        rules = [a for a in resolved_args("grpo.sh", 300) if a.startswith(("mean(", "max(", "min(", "median("))]
        data = normalize(json.loads((FIXTURES / "grpo_vllm_healthy.json").read_text()))
        results = run_checks(data, [RuleSpec(r) for r in rules], CheckOptions(expect_steps=300))
        assert [r.status for r in results] == ["PASS"] * len(rules)


def grpo_sh_gate_rule(env: dict[str, str] | None = None) -> str:
    """grpo.sh's step-time gate (its GRPO_EXTRA_RULES entry), ``${NAME:-default}`` resolved as bash would."""
    text = (ROOT / "tests" / "functional" / "grpo.sh").read_text()
    entry = re.search(r'^GRPO_EXTRA_RULES=\("(.*)"\)$', text, re.M)
    assert entry, "grpo.sh has no GRPO_EXTRA_RULES=(...) line"
    rule = entry.group(1).replace('\\"', '"')
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: (env or {}).get(m.group(1), m.group(2)), rule)


class TestGrpoStepTimeGate:
    """grpo.sh's step-time gate on real runs: the highest healthy run of its calibration passes, the
    run whose train step was made 2x slower fails, and grpo.sh turns the timing on."""

    def test_the_highest_healthy_run_passes_and_the_slowed_run_fails(self, capsys):
        rule = grpo_sh_gate_rule()
        assert rule.startswith('median(data["timing/train_over_reference"]) < ')
        assert check_metrics.main([str(FIXTURES / "grpo_step_time_healthy.json"), rule]) == 0
        assert check_metrics.main([str(FIXTURES / "grpo_step_time_slowed.json"), rule]) == 1
        capsys.readouterr()

    def test_the_bound_can_be_set_from_the_environment(self, capsys):
        rule = grpo_sh_gate_rule({"TRAIN_OVER_REFERENCE_MAX": "3"})
        assert check_metrics.main([str(FIXTURES / "grpo_step_time_slowed.json"), rule]) == 0
        capsys.readouterr()

    def test_grpo_sh_times_the_reference(self):
        assert "\ngrpo_functional grpo generation.colocated=true policy.reference_timing_period=5 " in (
            ROOT / "tests" / "functional" / "grpo.sh").read_text()


class TestSftScript:
    def test_script_uses_the_pack_and_expected_steps(self):
        args = check_run_args("sft.sh")
        assert args[args.index("--pack") + 1] == "sft" and "$EXPECT_STEPS" in args

    def test_real_run_passes(self, capsys, monkeypatch):
        monkeypatch.setenv("COLUMNS", "250")
        code, out = run_script_rules(capsys, "sft.sh", FIXTURES / "sft_gsm8k.json", 60)
        assert code == 0, out

    def test_run_expected_longer_fails(self, capsys):
        code, out = run_script_rules(capsys, "sft.sh", FIXTURES / "sft_gsm8k.json", 100)
        assert code == 1 and "run stopped at step 60 of 100" in out


@pytest.mark.parametrize("fixture", ["grpo_vllm_healthy.json", "grpo_collapsed.json"])
def test_collapse_signals_differ_between_the_fixtures(fixture):
    """Guards the fixtures themselves: the collapsed run has zero-gradient steps, the healthy one none."""
    data = json.loads((FIXTURES / fixture).read_text())
    zero_grad_steps = sum(v == 0 for v in data["train/grad_norm"].values())
    assert (zero_grad_steps > 0) == (fixture == "grpo_collapsed.json")


class TestCommonSh:
    """The helpers of tests/functional/common.sh that the scripts use to check a run."""

    @staticmethod
    def bash(script: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        return subprocess.run(
            ["bash", "-c", f"source tests/functional/common.sh; {script}"],
            cwd=ROOT,
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def test_check_run_refuses_to_run_without_expect_steps(self, tmp_path):
        proc = self.bash(f"WORK={tmp_path}; check_run {tmp_path} --pack grpo 'min(data[\"x\"]) > 0'")
        assert proc.returncode == 2 and "--expect-steps" in proc.stderr
        assert not (tmp_path / "metrics.json").exists()

    def test_check_run_checks_the_loggers_metrics_json_and_points_metrics_at_it(self, tmp_path):
        logs = tmp_path / "logs"
        logs.mkdir()
        (logs / "metrics.json").write_text(json.dumps({"train/loss": {"1": 1.0, "2": 0.5}}))
        rule = "'last(data[\"train/loss\"]) < first(data[\"train/loss\"])'"
        proc = self.bash(f"WORK={tmp_path}; check_run {logs} --expect-steps 2 {rule} && echo METRICS=$METRICS")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"METRICS={logs / 'metrics.json'}" in proc.stdout
        (logs / "metrics.json").write_text(json.dumps({"train/loss": {"1": 1.0, "2": 1.5}}))  # not falling
        assert self.bash(f"WORK={tmp_path}; check_run {logs} --expect-steps 2 {rule}").returncode == 1
        (logs / "metrics.json").unlink()  # event files alone are not what is checked
        assert self.bash(f"WORK={tmp_path}; check_run {logs} --expect-steps 2 {rule}").returncode == 2

    def test_check_run_writes_the_report_beside_check_report_json(self, tmp_path):
        pytest.importorskip("matplotlib")  # the report extra: check_run writes plots only with it
        logs = tmp_path / "logs"
        logs.mkdir()
        (logs / "metrics.json").write_text(json.dumps({"train/loss": {"1": 1.0, "2": 0.5}}))
        proc = self.bash(f"WORK={tmp_path}; check_run {logs} --expect-steps 2 'max(data[\"train/loss\"]) < 2'")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (tmp_path / "check_report.json").is_file()
        assert {p.name for p in (tmp_path / "check_report").iterdir()} == {"index.html", "summary.png", "rule-01.png"}

    def test_config_value_applies_the_overrides_like_the_entry_point(self):
        yaml = "examples/configs/grpo_arithmetic.yaml"
        proc = self.bash(
            f"config_value {yaml} grpo.num_steps; config_value {yaml} grpo.num_steps policy.lr=1e-4 grpo.num_steps=400"
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["300", "400"]

    def test_config_value_of_an_unset_key_fails(self):
        proc = self.bash("config_value examples/configs/grpo_arithmetic.yaml grpo.no_such_key")
        assert proc.returncode != 0 and "grpo.no_such_key" in proc.stderr


# --- the packs' must-move checks on the real runs ------------------------------------------

REAL_RUNS = {"grpo.sh": ("grpo_vllm_healthy.json", 300), "sft.sh": ("sft_gsm8k.json", 60)}


def script_report(script: str, data: dict, tmp_path: Path) -> tuple[int, dict[str, dict]]:
    """The script's rules on ``data`` (a metrics dict): exit code and rule -> --output-json row."""
    metrics, report = tmp_path / "metrics.json", tmp_path / "report.json"
    metrics.write_text(json.dumps(data))
    steps = REAL_RUNS[script][1]
    code = check_metrics.main([str(metrics), *resolved_args(script, steps), "--output-json", str(report)])
    return code, {row["rule"]: row for row in json.loads(report.read_text())}


def metric_of(rule: str) -> str:
    """The metric a one-metric rule reads."""
    return re.search(r'data\["([^"]+)"\]', rule).group(1)


def must_move_rules(script: str) -> list[str]:
    """The pack's checks that a metric moves, for the metrics the script's real run logs (grpo.sh
    trains without a KL term and logs no ``train/kl``: that check SKIPs, as an optional one)."""
    args = check_run_args(script)
    pack = args[args.index("--pack") + 1]
    logged = json.loads((FIXTURES / REAL_RUNS[script][0]).read_text())
    return [spec.text for spec in pack_rules(pack, {}, {})
            if spec.text.startswith("std(") and metric_of(spec.text) in logged]


OPTIONAL_SKIP = "not logged (optional check)"


@pytest.mark.parametrize("script", sorted(REAL_RUNS))
def test_every_must_move_check_runs_and_passes_on_the_real_run(script, tmp_path):
    """Each pack check that a metric moves is evaluated (not SKIP) and PASSes, not VACUOUS."""
    data = json.loads((FIXTURES / REAL_RUNS[script][0]).read_text())
    code, rows = script_report(script, data, tmp_path)
    statuses = {rule: rows[rule]["status"] for rule in must_move_rules(script)}
    assert code == 0 and len(statuses) >= 4 and set(statuses.values()) == {"PASS"}, statuses


@pytest.mark.parametrize(
    ("script", "rule"),
    [
        pytest.param(script, rule, id=f"{script}-{metric_of(rule)}")
        for script in sorted(REAL_RUNS)
        for rule in must_move_rules(script)
    ],
)
def test_a_real_run_with_one_metric_frozen_fails_its_must_move_check(script, rule, tmp_path):
    """The real run with one metric stuck at its first value on every step (a stale log)."""
    data = json.loads((FIXTURES / REAL_RUNS[script][0]).read_text())
    metric = metric_of(rule)
    first = data[metric][min(data[metric], key=int)]
    data[metric] = dict.fromkeys(data[metric], first)
    code, rows = script_report(script, data, tmp_path)
    assert code == 1 and rows[rule]["status"] == "FAIL"
    # nothing else fails for another reason (other checks of the frozen metric may fail too)
    assert [r for r, row in rows.items() if row["status"] != "PASS" and metric not in r
            and not (row["status"] == "SKIP" and OPTIONAL_SKIP in row["message"])] == []


def grpo_async_script(k: int = 1) -> tuple[dict[str, str], tuple[str, ...]]:
    """grpo_async.sh's exported bounds (their defaults) and its ``GRPO_EXTRA_RULES`` with ``$k`` and
    ``$ahead`` (k steps of the config's prompts x completions)."""
    import yaml

    text = (ROOT / "tests" / "functional" / "grpo_async.sh").read_text()
    grpo = yaml.safe_load((ROOT / "examples" / "configs" / "grpo_arithmetic.yaml").read_text())["grpo"]
    ahead = k * grpo["num_prompts_per_step"] * grpo["completions_per_prompt"]
    env = dict(re.findall(r"(\w+)=\$\{\1:-([^}]*)\}", text.split("\nexport ", 1)[1].splitlines()[0]))
    arrays = re.findall(r"GRPO_EXTRA_RULES\+?=\((.*?)\)\n", text, re.S)
    rules = [r.replace("$k", str(k)).replace("$ahead", str(ahead)) for block in arrays for r in shlex.split(block)]
    return env, tuple(rules)


class TestGrpoAsyncScript:
    def test_healthy_async_run_passes_every_rule(self, capsys, monkeypatch):
        monkeypatch.setenv("COLUMNS", "250")
        env, extra = grpo_async_script()
        assert env == {"PROBS_RATIO_MIN": "0.2", "PROBS_RATIO_MAX": "3", "CLIP_FRACTION_MEAN": "0.11"}
        assert len(extra) == 5 and any("async/staleness_max" in r for r in extra)
        args = resolved_args("grpo.sh", 300, env, extra)
        code = check_metrics.main([str(FIXTURES / "grpo_async_healthy.json"), *args])
        out = capsys.readouterr().out
        assert code == 0, out
        assert "FAIL" not in out and "VACUOUS" not in out

    def test_the_on_policy_bounds_would_fail_it(self, capsys):
        """Why grpo_async.sh loosens them: its ratios spread wider (measured)."""
        code = check_metrics.main([str(FIXTURES / "grpo_async_healthy.json"), *resolved_args("grpo.sh", 300)])
        rows = "".join(failing_rows(capsys.readouterr().out))
        assert code == 1 and 'median(data["train/probs_ratio_min"]) > 0.5' in rows

    @pytest.mark.parametrize(("metric", "value"), [("async/staleness_max", 2.0), ("async/dropped_fraction", 0.25),
                                                   ("async/buffer_size", 129.0)])
    def test_one_stale_or_dropping_step_fails(self, tmp_path, capsys, monkeypatch, metric, value):
        """(``async/buffer_size`` 129: one sample more than k = 1 steps of 16 x 8 can be held.)"""
        monkeypatch.setenv("COLUMNS", "250")
        data = json.loads((FIXTURES / "grpo_async_healthy.json").read_text())
        data[metric]["150"] = value
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(data))
        env, extra = grpo_async_script()
        assert check_metrics.main([str(path), *resolved_args("grpo.sh", 300, env, extra)]) == 1
        assert any(metric in row for row in failing_rows(capsys.readouterr().out))


def grpo_multinode_rules() -> tuple[str, ...]:
    """grpo_multinode.sh's ``GRPO_EXTRA_RULES``, as bash would split them."""
    text = (ROOT / "tests" / "functional" / "grpo_multinode.sh").read_text()
    return tuple(r for block in re.findall(r"GRPO_EXTRA_RULES=\((.*?)\)\n", text, re.S) for r in shlex.split(block))


class TestGrpoMultinodeScript:
    def test_healthy_multinode_run_passes_every_rule(self, capsys, monkeypatch):
        monkeypatch.setenv("COLUMNS", "250")
        extra = grpo_multinode_rules()
        assert len(extra) == 2 and all("placement/" in r for r in extra)
        code = check_metrics.main([str(FIXTURES / "grpo_multinode_healthy.json"),
                                   *resolved_args("grpo.sh", 300, extra_rules=extra)])
        out = capsys.readouterr().out
        assert code == 0, out
        assert "FAIL" not in out and "VACUOUS" not in out

    @pytest.mark.parametrize("metric", ["placement/engines_off_policy_node", "placement/num_nodes"])
    def test_a_step_whose_engine_ran_on_the_policys_node_fails(self, tmp_path, capsys, monkeypatch, metric):
        """What a run on one node logs (policy and engine on node 0), at one step of the 300."""
        monkeypatch.setenv("COLUMNS", "250")
        data = json.loads((FIXTURES / "grpo_multinode_healthy.json").read_text())
        data[metric]["150"] = {"placement/engines_off_policy_node": 0.0, "placement/num_nodes": 1.0}[metric]
        path = tmp_path / "one_node.json"
        path.write_text(json.dumps(data))
        code = check_metrics.main([str(path), *resolved_args("grpo.sh", 300, extra_rules=grpo_multinode_rules())])
        rows = "".join(failing_rows(capsys.readouterr().out))
        assert code == 1 and metric in rows
