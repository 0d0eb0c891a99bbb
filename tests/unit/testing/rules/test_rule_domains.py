"""Each metric's vacuity domain, derived from how posttrain computes it.

The vacuity check clips its stand-ins to a metric's domain (``METRIC_DOMAINS``), so a bound that
every possible run satisfies (``min(data["train/refit_token_mult_prob_error"]) >= 1``: a mean of
``exp(|Δ|) >= 1``) is VACUOUS. Here every metric a run logs gets its range from its definition
(``RANGES``); the properties check both sides of each one:

- the library's own computation (the loss, the engine/trainer disagreement, the rollout and
  staleness statistics), fed generated inputs, lands inside the range and reaches its finite
  bounds: the range is not narrower than what runs log;
- on any run inside the range, the rule that states a bound is VACUOUS and the rule one step
  tighter (``>`` for ``>=``) is not: the vacuity check knows the range, no wider and no narrower.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.algorithms.async_grpo import staleness_metrics
from posttrain.algorithms.grpo_step import Rollouts, rollout_metrics, token_mult_prob_error
from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.testing.rules.checker import CheckOptions, RuleSpec, run_checks
from posttrain.weight_sync.probe import probe_errors

INF = math.inf
# metric -> (low, high): the values its definition can take. Unbounded ones say why.
# fmt: off
RANGES: dict[str, tuple[float, float]] = {
    "train/clip_fraction": (0.0, 1.0),              # clipped tokens / tokens
    "train/accuracy": (0.0, 1.0),                   # completions with reward 1 / completions
    "train/fraction_groups_kept": (0.0, 1.0),       # groups with reward variance / groups
    "val/accuracy": (0.0, 1.0),                     # problems solved / problems
    "val/sampling_accuracy": (0.0, 1.0),            # mean of probabilities
    "async/dropped_fraction": (0.0, 1.0),           # dropped samples / claimed samples
    "train/token_mult_prob_error": (1.0, INF),      # mean of exp(|logp_engine - logp_trainer|) >= exp(0)
    "train/refit_token_mult_prob_error": (1.0, INF),  # the same over the probe's tokens
    "train/refit_logprob_error": (0.0, INF),        # mean of |logp_engine - logp_trainer|
    "train/probs_ratio_min": (0.0, INF),            # exp(logp - logp_old)
    "train/probs_ratio_max": (0.0, INF),
    "train/importance_weight": (0.0, INF),          # mean of min(exp(logp_old - logp_behaviour), C)
    "train/kl": (0.0, INF),                         # k3 = exp(r) - r - 1 >= 0
    "train/entropy": (0.0, INF),                    # -sum p log p
    "train/grad_norm": (0.0, INF),                  # an L2 norm
    "train/lr": (0.0, INF),
    "train/completion_length": (0.0, INF),          # tokens
    "train/num_optimizer_steps": (0.0, INF),        # counts
    "train/skipped_optimizer_steps": (0.0, INF),
    "val/loss": (0.0, INF),                         # NLL: -mean log p, log p <= 0
    "async/staleness_mean": (0.0, INF),             # trainer version - sample version >= 0
    "async/staleness_max": (0.0, INF),
    "async/dropped_samples": (0.0, INF),            # counts
    "async/buffer_size": (0.0, INF),
    "async/overlap_seconds": (0.0, INF),            # max(..., 0) seconds
    "timing/step": (0.0, INF),                      # every timing/* is seconds, or a ratio of two
    "timing/train_worker": (0.0, INF),
    "timing/reference_step": (0.0, INF),
    "timing/train_over_reference": (0.0, INF),
    "memory/policy_peak_rss": (0.0, INF),           # every memory/* is GiB
    "placement/engines_off_policy_node": (0.0, INF),  # every placement/* counts nodes or numbers them from 0
    "placement/num_nodes": (0.0, INF),
    "placement/policy0_node": (0.0, INF),
    "placement/engine0_node": (0.0, INF),
    # unbounded: GRPO's loss is -A * ratio + beta * k3, of either sign (SFT's NLL shares the name);
    # the reward is the environment's, and the toolkit does not assume a verifier's {0, 1}
    "train/loss": (-INF, INF),
    "train/reward_mean": (-INF, INF),
}
# fmt: on
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
FLOAT32_ROUNDING = 1e-6  # k3 in float32 dips to -6e-8 where exp(r) rounds down (r ~ 1e-4)

LOGPROB = st.floats(min_value=-30.0, max_value=0.0, allow_nan=False)


def inside(metric: str, value: float, tolerance: float = 0.0) -> bool:
    low, high = RANGES[metric]
    return low - tolerance <= value <= high + tolerance


# ------------------------------------------------------------- the ranges are the definitions'


def test_every_metric_a_run_logs_has_a_range():
    logged = set()
    for path in FIXTURES.glob("*.json"):  # real runs: GRPO (sync, async, vLLM), SFT
        logged |= set(json.loads(path.read_text()))
    logged |= {f"train/{name}" for name in loss_metrics(*torch.zeros(3, 1, 4), torch.ones(1, 4), 1.0)}
    assert logged - set(RANGES) == set()


def loss_metrics(logprobs, old, ref, mask, advantage) -> dict[str, float]:
    loss_fn = ClippedPGLoss(clip_eps=0.2, kl_coef=0.1, importance_weight_cap=2.0)
    data = {"completion_mask": mask, "advantages": torch.tensor([advantage]), "old_logprobs": old,
            "ref_logprobs": ref, "behaviour_logprobs": ref}
    return loss_fn(logprobs, data, max(mask.sum().item(), 1.0))[1]


@st.composite
def logprob_rows(draw, rows: int = 3):
    """``rows`` tensors ``[1, L]`` of logprobs, and a mask with at least one token."""
    length = draw(st.integers(1, 12))
    tensors = [torch.tensor([draw(st.lists(LOGPROB, min_size=length, max_size=length))]) for _ in range(rows)]
    mask = draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=length, max_size=length).filter(any))
    return tensors, torch.tensor([mask])


@settings(max_examples=80)
@given(rows=logprob_rows(), same=st.booleans())
def test_engine_trainer_disagreement_is_at_least_its_bound_and_exactly_it_when_they_agree(rows, same):
    (engine, trainer, _), mask = rows
    trainer = engine.clone() if same else trainer
    metrics = {"train/token_mult_prob_error": token_mult_prob_error(engine, trainer, mask),
               **probe_errors(engine, trainer, mask)}
    for metric, value in metrics.items():
        assert inside(metric, value), (metric, value)
        if same:
            assert value == RANGES[metric][0], (metric, value)


@settings(max_examples=80)
@given(rows=logprob_rows(), advantage=st.floats(-3.0, 3.0))
def test_the_losss_metrics_lie_in_their_ranges(rows, advantage):
    (logprobs, old, ref), mask = rows
    metrics = loss_metrics(logprobs, old, ref, mask, advantage)
    assert set(metrics) >= {"clip_fraction", "probs_ratio_min", "probs_ratio_max", "kl", "importance_weight"}
    for name, value in metrics.items():
        assert inside(f"train/{name}", value, FLOAT32_ROUNDING), (name, value)
    # the clip fraction reaches both ends: no token clipped at ratio 1, every token clipped far away
    assert loss_metrics(old, old, ref, mask, advantage)["clip_fraction"] == 0.0
    if advantage > 0.01:
        assert loss_metrics(old + 5.0 * mask, old, ref, mask, advantage)["clip_fraction"] == 1.0


@settings(max_examples=60)
@given(group=st.integers(1, 4), rewards=st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=16),
       lengths=st.lists(st.integers(0, 9), min_size=16, max_size=16))
def test_rollout_statistics_lie_in_their_ranges(group, rewards, lengths):
    n = len(rewards) - len(rewards) % group
    if n == 0:
        return
    rollouts = Rollouts(problems=[], prompt_ids=[[1]] * n, completion_ids=[[2] * k for k in lengths[:n]],
                        generation_logprobs=[[-1.0] * k for k in lengths[:n]],
                        rewards=torch.tensor(rewards[:n]), weight_version=0)
    metrics = rollout_metrics(rollouts, SimpleNamespace(completions_per_prompt=group))
    for metric, value in metrics.items():
        assert inside(metric, value), (metric, value)


@settings(max_examples=60)
@given(version=st.integers(0, 6), lags=st.lists(st.integers(0, 6), min_size=1, max_size=8), data=st.data())
def test_staleness_statistics_lie_in_their_ranges(version, lags, data):
    samples = [{"sample_id": i, "group_id": i, "weight_version": max(version - lag, 0), "seq_len": 1,
                "batch_index": 0} for i, lag in enumerate(lags)]
    dropped = data.draw(st.lists(st.sampled_from(samples), unique_by=lambda s: s["sample_id"]))
    for metric, value in staleness_metrics(samples, dropped, version).items():
        assert inside(metric, value), (metric, value)


# ------------------------------------------------------------- the vacuity check knows them

BOUNDED = sorted(m for m, (low, high) in RANGES.items() if math.isfinite(low) or math.isfinite(high))


def verdict(metric: str, values: list[float], rule: str) -> str:
    data = {metric: {str(s): v for s, v in enumerate(values, start=1)}}
    result = run_checks(data, [RuleSpec(rule.format(m=metric))], CheckOptions())[0]
    assert result.status in ("PASS", "VACUOUS"), (rule, values, result.message)
    return result.status


@pytest.mark.parametrize("metric", BOUNDED)
@settings(max_examples=15)
@given(fractions=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=25))
def test_a_bound_of_a_metrics_range_is_vacuous_and_a_tighter_one_is_not(metric, fractions):
    low, high = RANGES[metric]
    top = high if math.isfinite(high) else low + 50.0
    values = [low + f * (top - low) for f in fractions]  # a run inside the range, its bounds included
    strictly = [low + (0.05 + 0.9 * f) * (top - low) for f in fractions]  # and one strictly inside
    if math.isfinite(low):
        assert verdict(metric, values, f'min(data["{{m}}"]) >= {low!r}') == "VACUOUS"
        assert verdict(metric, strictly, f'min(data["{{m}}"]) > {low!r}') == "PASS"
    if math.isfinite(high):
        assert verdict(metric, values, f'max(data["{{m}}"]) <= {high!r}') == "VACUOUS"
        assert verdict(metric, strictly, f'max(data["{{m}}"]) < {high!r}') == "PASS"
