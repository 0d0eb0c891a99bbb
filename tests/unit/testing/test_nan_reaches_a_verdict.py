"""A NaN or infinity logged by a run never lets the functional checks pass (silent-failure suite).

A user's run takes this chain: the trainer's ``MetricsLogger`` writes TensorBoard event files
and ``<log_dir>/metrics.json``; the functional scripts (``check_run`` in
``tests/functional/common.sh``) dump the event files with ``json_dump_tb_logs.py`` and judge
the dump with ``check_metrics.py`` and the script's own rules. A NaN that any link drops,
turns into a number, or skips at the first step would let a diverged run pass.

Each test replays a real run (``fixtures/metrics/``) through the real logger, one ``log`` call
per step as the training loop makes, with one value replaced by NaN, +inf or -inf at the first,
a middle or the last logged step of one metric, then judges it with the script's exact
arguments (``resolved_args``) along both paths: the TensorBoard dump, and the logger's own
``metrics.json``. Every rule that reads the poisoned metric must FAIL naming the metric, the
step and the value; every other rule must still PASS. The unpoisoned replay passing through
both paths is the control: it shows the failures come from the injected value.

The logger rewrites ``metrics.json`` after every step (O(steps^2) in all), so the injections
replay the 300-step GRPO run thinned to its first step and every 25th step: real values at
their real step numbers, every evaluation (each 50 steps) included, the rules' first and last
10% windows still populated; the rules read the gaps as they read a resumed run's. Cutting the
run short instead would leave no evaluation after step 0. The full run is replayed once, as a
control.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from unit.testing.rules.test_rule_real_runs import FIXTURES, resolved_args

from posttrain.testing import check_metrics as check_metrics
from posttrain.testing import tb_to_json as json_dump_tb_logs
from posttrain.testing.rules.packs import pack_rules
from posttrain.utils.logger import MetricsLogger

Metrics = dict[str, dict[int, float]]  # metric -> step -> value

KINDS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
POSITIONS = ("first", "middle", "last")


@dataclass(frozen=True)
class Run:
    """A real run, the functional script that judges it, and how it is replayed."""

    script: str  # in tests/functional/
    fixture: str  # in fixtures/metrics/
    steps: int  # its num_steps: the script's --expect-steps
    every: int = 1  # replay the first step and every `every`-th step only

    @property
    def pack(self) -> str:
        args = resolved_args(self.script, self.steps)
        return args[args.index("--pack") + 1]


GRPO_FULL = Run("grpo.sh", "grpo_vllm_healthy.json", 300)
GRPO = Run("grpo.sh", "grpo_vllm_healthy.json", 300, every=25)
SFT = Run("sft.sh", "sft_gsm8k.json", 60)


@cache
def _fixture(name: str) -> Metrics:
    raw = json.loads((FIXTURES / name).read_text())
    return {metric: {int(step): value for step, value in series.items()} for metric, series in raw.items()}


def healthy(run: Run) -> Metrics:
    """The run's metrics, thinned as ``run.every`` says (a fresh copy)."""
    return {
        metric: {step: value for step, value in series.items() if step % run.every == 0 or step == 1}
        for metric, series in _fixture(run.fixture).items()
    }


def rules(run: Run) -> list[str]:
    """The rules the script checks: its own and its pack's."""
    own = [a for a in resolved_args(run.script, run.steps) if "data[" in a]
    return own + [spec.text for spec in pack_rules(run.pack, _fixture(run.fixture), {})]


def metrics_read(rule: str) -> set[str]:
    return set(re.findall(r'data\["([^"]+)"\]', rule))


def checked_metrics(run: Run) -> list[str]:
    """Every metric a rule of the script reads and the run logs, in a stable order (grpo.sh runs
    without a KL term, kl_coef 0, and logs no ``train/kl``: the pack's KL rules are optional and SKIP)."""
    return sorted(set().union(*map(metrics_read, rules(run))) & set(_fixture(run.fixture)))


OPTIONAL_SKIP = "not logged (optional check)"


def not_passing(rows: list[dict]) -> list[dict]:
    """The rows that neither PASS nor SKIP an optional check of a metric the run does not log."""
    return [r for r in rows if r["status"] != "PASS" and not (r["status"] == "SKIP" and OPTIONAL_SKIP in r["message"])]


def poison_step(metrics: Metrics, metric: str, position: str) -> int:
    """The first, middle or last step at which ``metric`` was logged."""
    steps = sorted(metrics[metric])
    return {"first": steps[0], "middle": steps[len(steps) // 2], "last": steps[-1]}[position]


# --------------------------------------------------------------------------- the chain


def replay(metrics: Metrics, log_dir: Path) -> Path:
    """Log ``metrics`` through the trainer's MetricsLogger: one ``log`` call per step, in order."""
    by_step: dict[int, dict[str, float]] = {}
    for name, series in metrics.items():
        for step, value in series.items():
            by_step.setdefault(step, {})[name] = value
    logger = MetricsLogger(log_dir, print_period=10**9)  # a console line at step 0 only
    try:
        for step in sorted(by_step):
            logger.log(by_step[step], step)
    finally:
        logger.close()
    return log_dir


def judge(metrics_file: Path, run: Run) -> tuple[int, list[dict]]:
    """check_metrics with the script's arguments, as ``check_run`` calls it: exit code and rows."""
    report = metrics_file.with_name(metrics_file.stem + "_report.json")
    code = check_metrics.main([str(metrics_file), *resolved_args(run.script, run.steps), "--output-json", str(report)])
    return code, json.loads(report.read_text())


def via_logger_json(log_dir: Path, run: Run) -> tuple[int, list[dict]]:
    """Path (b): the logger's own ``metrics.json`` straight into check_metrics."""
    return judge(log_dir / "metrics.json", run)


def via_tensorboard(log_dir: Path, run: Run) -> tuple[int, list[dict]]:
    """Path (a), ``check_run``'s: the event files -> json_dump_tb_logs -> check_metrics."""
    dumped = log_dir.parent / "tensorboard_metrics.json"
    assert json_dump_tb_logs.main([str(log_dir / "tensorboard"), "--output", str(dumped)]) == 0
    return judge(dumped, run)


PATHS = {"metrics.json": via_logger_json, "tensorboard": via_tensorboard}


def assert_every_rule_passes(code: int, rows: list[dict]) -> None:
    assert [(r["rule"], r["status"], r["message"]) for r in not_passing(rows)] == []
    assert code == 0


def assert_fails_on(code: int, rows: list[dict], metric: str, step: int, value: float) -> None:
    """Exit 1; each rule reading ``metric`` FAILs naming it, the step and the value; the rest PASS."""
    named = f"metric '{metric}': step '{step}' is {value}"  # "is nan", "is inf", "is -inf"
    readers = [r for r in rows if metric in metrics_read(r["rule"])]
    assert readers, f"no rule reads {metric}"
    for row in readers:
        assert row["status"] == "FAIL" and named in row["message"], (named, row)
    # the other rules still pass: the failures come from the injected value alone
    assert [(r["rule"], r["status"]) for r in not_passing(rows) if r not in readers] == []
    assert code == 1


def poisoned_replay(tmp_path: Path, run: Run, metric: str, position: str, kind: str) -> tuple[Path, int]:
    """The run replayed with ``metric`` at ``position`` replaced by ``kind``; the log dir and the step."""
    metrics = healthy(run)
    step = poison_step(metrics, metric, position)
    metrics[metric][step] = KINDS[kind]
    return replay(metrics, tmp_path / "logs"), step


# --------------------------------------------------------------------------- controls


@pytest.mark.parametrize("run", [GRPO_FULL, GRPO, SFT], ids=["grpo-300-steps", "grpo-thinned", "sft"])
def test_the_healthy_run_passes_through_the_logger_on_both_paths(tmp_path, run):
    log_dir = replay(healthy(run), tmp_path / "logs")
    for path in PATHS.values():
        assert_every_rule_passes(*path(log_dir, run))


@pytest.mark.parametrize("run", [GRPO, SFT], ids=["grpo", "sft"])
def test_thinning_keeps_the_first_and_last_step_of_every_checked_metric(run):
    """The injections poison the run's own first step (0 for an evaluation, 1 for training)."""
    full, replayed = _fixture(run.fixture), healthy(run)
    for metric in checked_metrics(run):
        assert (min(replayed[metric]), max(replayed[metric])) == (min(full[metric]), max(full[metric])), metric


def test_the_matrix_covers_every_metric_the_scripts_read():
    """Guards the parsing of the rules: a metric no injection poisons would go unchecked."""
    assert checked_metrics(GRPO) == [
        "train/clip_fraction", "train/entropy", "train/fraction_groups_kept", "train/grad_norm",
        "train/loss", "train/probs_ratio_max", "train/probs_ratio_min",
        "train/refit_logprob_error", "train/refit_token_mult_prob_error", "train/reward_mean",
        "train/token_mult_prob_error", "val/sampling_accuracy",
    ]  # fmt: skip
    assert checked_metrics(SFT) == ["train/entropy", "train/grad_norm", "train/loss", "val/loss"]


# --------------------------------------------------------------------------- injections

MATRIX = [
    pytest.param(run, metric, position, kind, id=f"{run.pack}-{metric}-{position}-{kind}")
    for run in (GRPO, SFT)
    for metric in checked_metrics(run)
    for position in POSITIONS
    for kind in KINDS
]


@pytest.mark.parametrize(("run", "metric", "position", "kind"), MATRIX)
def test_a_non_finite_value_fails_the_checks_on_the_logger_json(tmp_path, run, metric, position, kind):
    log_dir, step = poisoned_replay(tmp_path, run, metric, position, kind)
    assert_fails_on(*via_logger_json(log_dir, run), metric, step, KINDS[kind])


# The TensorBoard path adds the event files and the dumper, whose handling of a value does not
# depend on the metric: every position and kind for a training metric (from step 1) and an
# evaluation metric (from step 0), and a NaN at the first step of every metric.
TB_MATRIX = [
    p
    for p in MATRIX
    if (p.values[0] is GRPO and p.values[1] in ("train/loss", "val/sampling_accuracy"))
    or (p.values[2], p.values[3]) == ("first", "nan")
]


@pytest.mark.parametrize(("run", "metric", "position", "kind"), TB_MATRIX)
def test_a_non_finite_value_fails_the_checks_through_tensorboard(tmp_path, run, metric, position, kind):
    log_dir, step = poisoned_replay(tmp_path, run, metric, position, kind)
    assert_fails_on(*via_tensorboard(log_dir, run), metric, step, KINDS[kind])
