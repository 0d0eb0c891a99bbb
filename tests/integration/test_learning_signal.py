"""Learning signal: GRPO really raises the held-out accuracy of the tiny model on 2-digit addition.

One SFT warm start (the shared, cached one: ``posttrain.algorithms.warm_start``), then GRPO from
it with ``SEEDS_PER_MODE`` seeds for ``GRPO_STEPS`` steps, by the synchronous loop and by the
asynchronous one (``grpo.async``, the producer one step ahead). Every model is scored on the
same 500 held-out problems, so each (seed, problem) gives a paired outcome: before, after.

The score is a problem's *sampling accuracy*: the probability that one sample at temperature 1
is exactly the reference answer (teacher-forced, exact: no sampling noise), GRPO's own
objective on problems it never trained on. Greedy accuracy is printed, not judged: a step
function of the logits, it moved the old test's verdict by more than its margin between two
CPUs (0.001 on an AMD EPYC, 0.159 on a Xeon, the same commit).

Assertion: the one-sided 99% lower bound of the pooled paired gain (a bootstrap over problems,
each problem's seeds together) is above ``MIN_GAIN`` = 0 accuracy points.

Calibration (``tests/integration/learning_signal.py``, each replicate a warm start of its own
seed, standing in for another machine; docs/testing.md, "The learning-signal test", has the
full table): the 99% lower bound of the gain, mean / sd / worst over replicates:

    machine (2 threads a replicate)           replicates   sync                      async_k1
    AMD EPYC, 2 cores (torch 2.13)            10           0.129 / 0.034 / 0.073     0.148 / 0.028 / 0.115
    Xeon (H200 host), 2 pinned cores (2.11)   10           0.124 / 0.032 / 0.070     0.148 / 0.039 / 0.080
    H200 GPU, fp32 (TF32)                     10           0.125 / 0.033 / 0.090     0.143 / 0.030 / 0.107

All 60 verdicts passed; the mean bound is 3.8-5.4 spreads above MIN_GAIN on every machine type.
This test (warm start seed 0): AMD 0.102 / 0.131, Xeon 0.138 / 0.152, GPU 0.099 / 0.117.

Under the catalogue mutant ``advantages_zeroed`` the gain is exactly 0 and the bound 0: FAIL (both
modes, on the AMD, on the Xeon's CPUs and on the H200 GPU).
"""

from __future__ import annotations

import pytest
import torch
from learning_signal import (
    MIN_GAIN,
    MODES,
    NUM_VAL,
    HeldOutScores,
    held_out_problems,
    paired_gain_lower_bound,
    run_mode,
    score_held_out,
    seeds_for,
)


def test_bootstrap_bound_separates_gain_from_noise() -> None:
    """The statistic itself: a real gain clears the bar, pure noise and a loss do not."""
    gen = torch.Generator().manual_seed(1)
    before = torch.rand(NUM_VAL, generator=gen) * 0.4
    noise = before[None, :] + 0.05 * torch.randn(2, NUM_VAL, generator=gen)
    assert paired_gain_lower_bound(before, noise) < MIN_GAIN
    gained = before[None, :] + 0.02 + 0.05 * torch.randn(2, NUM_VAL, generator=gen)
    assert paired_gain_lower_bound(before, gained) > MIN_GAIN
    assert paired_gain_lower_bound(before, before[None, :].expand(2, -1)) == 0.0  # nothing learned: not > 0
    assert paired_gain_lower_bound(before, torch.zeros(2, NUM_VAL)) < 0


def test_the_bound_resamples_problems_with_their_seeds_together() -> None:
    """One problem's seeds move together: a gain carried by a single problem is not significant,
    however many seeds agree on it."""
    before = torch.zeros(NUM_VAL)
    after = torch.zeros(8, NUM_VAL)
    after[:, 0] = 1.0  # every seed gained on problem 0 only
    assert paired_gain_lower_bound(before, after) <= MIN_GAIN


@pytest.fixture(scope="module")
def held_out(warm_start) -> tuple[HeldOutScores, list]:
    """The warm start's scores on the 500 held-out problems, and the problems."""
    problems = held_out_problems()
    return score_held_out(str(warm_start.model), problems), problems


@pytest.mark.slow(reason="GRPO runs that must really raise held-out accuracy (the learning tier)")
@pytest.mark.learning
@pytest.mark.parametrize("mode", list(MODES))
def test_grpo_raises_held_out_sampling_accuracy(warm_start, held_out, mode, repeat_index, tmp_path) -> None:
    before, problems = held_out
    verdict = run_mode(str(warm_start.model), before, problems, mode, seeds_for(repeat_index), tmp_path)
    print(verdict.report())
    assert verdict.passed, verdict.report()
