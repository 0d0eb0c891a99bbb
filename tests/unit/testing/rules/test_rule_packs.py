"""Tests for posttrain/testing/rules/packs.py: the grpo and sft rule packs."""

from __future__ import annotations

import math

import pytest

from posttrain.testing.rules.checker import CheckOptions, normalize, run_checks
from posttrain.testing.rules.interpreter import compile_rule
from posttrain.testing.rules.packs import PACK_BOUNDS, PACKS, PackCheck, _moves, pack_rules


def grpo_run(steps: int = 20, **overrides: dict[str, float]) -> dict:
    """A healthy GRPO log; ``overrides`` replace whole metrics.

    As in a real run, loss, grad norm, entropy, KL (from 0 at the first update, away from the
    reference) and mean reward move; the logprob error is exactly 1.0 (engine and trainer agree).
    """
    data = {
        "train/loss": {str(s): 0.01 * (-1) ** s for s in range(1, steps + 1)},
        "train/grad_norm": {str(s): 1.5 + 0.01 * s for s in range(1, steps + 1)},
        "train/fraction_groups_kept": {str(s): 0.8 for s in range(1, steps + 1)},
        "train/entropy": {str(s): 0.4 - 0.005 * s for s in range(1, steps + 1)},
        "train/kl": {str(s): 0.004 * (s - 1) for s in range(1, steps + 1)},
        "train/reward_mean": {str(s): 0.2 + 0.01 * s for s in range(1, steps + 1)},
        "train/token_mult_prob_error": {str(s): 1.0 for s in range(1, steps + 1)},
    }
    return normalize({**data, **overrides})


def sft_run(**overrides: dict[str, float]) -> dict:
    """A healthy 20-step SFT log (val/loss before training and at the last step); ``overrides``
    replace whole metrics."""
    data = {
        "train/loss": {str(s): 3.0 - 0.1 * s for s in range(1, 21)},
        "train/grad_norm": {str(s): 2.0 - 0.05 * s for s in range(1, 21)},
        "train/entropy": {str(s): 3.0 - 0.08 * s for s in range(1, 21)},
        "val/loss": {"0": 3.0, "20": 1.2},
    }
    return normalize({**data, **overrides})


def statuses(data: dict, pack: str = "grpo", **bounds: float) -> dict[str, str]:
    results = run_checks(data, pack_rules(pack, data, bounds), CheckOptions(expect_steps=20))
    return {r.rule: r.status for r in results}


def test_every_pack_rule_compiles_with_its_defaults():
    for pack in PACKS:
        for spec in pack_rules(pack, {}, {}):
            compile_rule(spec.text)


def test_every_bound_has_a_flag_and_a_default_in_each_pack_that_uses_it():
    for pack, checks in PACKS.items():
        for check in checks:
            if check.bound is not None:
                assert pack in PACK_BOUNDS[check.bound].defaults
                assert PACK_BOUNDS[check.bound].flag.startswith("--")


def test_healthy_grpo_run_passes_and_no_pack_rule_is_vacuous():
    assert set(statuses(grpo_run()).values()) == {"PASS"}


@pytest.mark.parametrize(
    ("metric", "values", "failing_rule"),
    [
        ("train/loss", {"1": 0.1, "2": math.nan}, 'all_finite(data["train/loss"])'),
        ("train/grad_norm", {"1": 1.0, "2": math.inf}, 'all_finite(data["train/grad_norm"])'),
        ("train/grad_norm", {"1": 1.0, "2": 0.0}, 'min(data["train/grad_norm"]) > 0.0'),
        ("train/fraction_groups_kept", {"1": 0.5, "2": 0.0}, 'min(data["train/fraction_groups_kept"]) > 0.0'),
        ("train/entropy", {"1": 0.3, "2": 0.01}, 'min(data["train/entropy"]) > 0.05'),
        ("train/kl", {"1": 0.1, "2": math.nan}, 'all_finite(data["train/kl"])'),
        ("train/token_mult_prob_error", {"1": 1.0, "2": 1.2}, 'max(data["train/token_mult_prob_error"]) < 1.05'),
    ],
)
def test_each_grpo_check_catches_its_failure(metric, values, failing_rule):
    values = {**{str(s): v for s, v in zip(range(3, 21), [values["1"]] * 18, strict=True)}, **values}
    result = statuses(grpo_run(**{metric: values}))
    assert result[failing_rule] == "FAIL"
    # only checks of that metric fail (an inf grad norm also fails `min(...) > 0`: NaN/inf never pass)
    assert all(metric in rule for rule, status in result.items() if status != "PASS")


def test_logprob_check_is_skipped_when_the_metric_is_not_logged():
    data = grpo_run()
    del data["train/token_mult_prob_error"]
    result = statuses(data)
    assert result['max(data["train/token_mult_prob_error"]) < 1.05'] == "SKIP"


def test_a_required_metric_that_is_missing_fails():
    data = grpo_run()
    del data["train/entropy"]
    assert statuses(data)['min(data["train/entropy"]) > 0.05'] == "FAIL"


def test_bounds_are_overridable():
    specs = pack_rules("grpo", grpo_run(), {"min_entropy": 0.35, "max_logprob_error": 1.5})
    rules = [s.text for s in specs]
    assert 'min(data["train/entropy"]) > 0.35' in rules
    assert 'max(data["train/token_mult_prob_error"]) < 1.5' in rules
    assert statuses(grpo_run(), min_entropy=0.35)['min(data["train/entropy"]) > 0.35'] == "FAIL"


def test_sft_pack():
    data = sft_run()
    # every check passes and none is vacuous; val/loss moves from step 0 to the last step
    assert set(statuses(data, "sft").values()) == {"PASS"}
    data["val/loss"] = normalize({"v": {"0": 3.0, "20": math.nan}})["v"]
    assert statuses(data, "sft")['all_finite(data["val/loss"])'] == "FAIL"


# --- metrics that must move: a constant one fails -----------------------------------------

MUST_MOVE = [
    ("grpo", "train/loss", 'std(data["train/loss"]) > 0'),
    ("grpo", "train/grad_norm", 'std(data["train/grad_norm"]) > 0'),
    ("grpo", "train/entropy", 'std(data["train/entropy"]) > 0'),
    ("grpo", "train/kl", 'std(data["train/kl"]) > 0'),
    ("grpo", "train/reward_mean", 'std(data["train/reward_mean"]) > 0'),
    ("sft", "train/loss", 'std(data["train/loss"]) > 0'),
    ("sft", "train/grad_norm", 'std(data["train/grad_norm"]) > 0'),
    ("sft", "train/entropy", 'std(data["train/entropy"]) > 0'),
    ("sft", "val/loss", 'std(data["val/loss"], 0) > 0'),
]
RUNS = {"grpo": grpo_run, "sft": sft_run}


def constant_like(data: dict, metric: str, value: float) -> dict:
    """``metric`` with ``value`` on every step it was logged at."""
    return {step: value for step in data[metric]}


MUST_MOVE_IDS = [f"{pack}-{metric}" for pack, metric, _ in MUST_MOVE]


@pytest.mark.parametrize(("pack", "metric", "rule"), MUST_MOVE, ids=MUST_MOVE_IDS)
def test_each_must_move_check_passes_on_a_moving_metric_and_is_not_vacuous(pack, metric, rule):
    assert statuses(RUNS[pack](), pack)[rule] == "PASS"


# 0.5 sums exactly; 0.058 and 0.23 over 20 steps do not (sum/20 is an ulp off the value),
# which gave a frozen metric a std of ~1e-17 > 0 before std took the exact mean. All three
# are above the entropy floors, so only the must-move check can see the frozen metric.
@pytest.mark.parametrize("value", [0.5, 0.058, 0.23])
@pytest.mark.parametrize(("pack", "metric", "rule"), MUST_MOVE, ids=MUST_MOVE_IDS)
def test_each_must_move_check_fails_on_a_constant_metric(pack, metric, rule, value):
    healthy = RUNS[pack]()
    result = statuses(RUNS[pack](**{metric: constant_like(healthy, metric, value)}), pack)
    assert result[rule] == "FAIL"
    # a frozen metric fails only its must-move check (a constant grad norm or entropy is still
    # finite and above its floor)
    assert [r for r, status in result.items() if status != "PASS"] == [rule]


@pytest.mark.parametrize("metric", ["train/entropy", "val/loss"])
def test_must_move_checks_of_optional_sft_metrics_are_skipped_when_not_logged(metric):
    data = sft_run()
    del data[metric]
    rule = next(r for p, m, r in MUST_MOVE if p == "sft" and m == metric)
    assert statuses(data, "sft")[rule] == "SKIP"


def test_metrics_that_are_legitimately_constant_have_no_must_move_check():
    """Exactly 1.0 / 0.0 on the Hugging Face engine, a constant lr, no clipping in a short run."""
    for pack in PACKS:
        rules = " ".join(spec.text for spec in pack_rules(pack, {}, {}) if spec.text.startswith("std("))
        for metric in ("train/token_mult_prob_error", "train/refit_", "train/lr", "train/clip_fraction"):
            assert metric not in rules, (pack, metric)


def test_a_must_move_check_is_std_above_zero_from_step_1_or_from_the_evaluation_before_training():
    # PACKS is built once at import; the builder itself, as a pack author calls it
    assert _moves("train/loss") == PackCheck("train/loss", 'std(data["train/loss"]) > 0')
    assert _moves("train/kl", optional=True) == PackCheck("train/kl", 'std(data["train/kl"]) > 0', optional=True)
    assert _moves("val/loss", optional=True, from_step_0=True) == PackCheck(
        "val/loss", 'std(data["val/loss"], 0) > 0', optional=True
    )
    assert _moves("val/loss", from_step_0=True) == PackCheck("val/loss", 'std(data["val/loss"], 0) > 0')
    assert {c for pack in PACKS.values() for c in pack if c.template.startswith("std(")} == {
        _moves(m, optional=o, from_step_0=z)
        for m, o, z in [("train/loss", False, False), ("train/grad_norm", False, False),
                        ("train/entropy", False, False), ("train/entropy", True, False), ("train/kl", True, False),
                        ("train/reward_mean", False, False), ("val/loss", True, True)]
    }
