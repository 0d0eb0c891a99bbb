"""A data-parallel HF policy (``policy.data_parallel_size=2``: two Ray workers, torch FSDP2 over
gloo) trains a recorded GRPO step as the single worker does. Real Ray, real process group; the
rollouts are a recording (``grpo.load_rollouts``, rewards rewritten so every group varies: see
``test_layout_parity.py``; the job is ``data_parallel_jobs.py``). That it resumes exactly is
``test_data_parallel_resume.py``; that its engines serve its weights after every refit,
``test_data_parallel_refit.py`` (three files, so that parallel workers can take them apart).

Calibration: DP=2 against DP=1 on the same recording, AMD EPYC, 2 cores, grpo.seed 0-5 (6
recordings a layout; Nov 26). Not calibrated on the GPU machine's CPUs or its GPU: this session
had no device time; the bounds are test_layout_parity.py's, which leave 100x over what is seen.

| layout (step 1) | grad norm, rel. | entropy, rel. | loss, abs. | weights, of the update | bound |
|---|---|---|---|---|---|
| even, 1 optimizer step (5 seeds) | 0.0 | 0.0 | 0.0 | 3.1e-6 | 1e-5 / 1e-5 / 1e-6 / 2e-3 |
| idle micro-batches, 1 step | 7.2e-8 | 0.0 | 0.0 | 4.0e-6 | the same |
| 11 optimizer steps (UNEVEN) | 1.8e-3 at seed 1 (else <= 1.6e-6) | 1.2e-4 | 7.3e-5 | 1.6e-3 | not compared |

The last row is why a call of several optimizer steps is judged only by what precedes its first
update (the old logprobs: ``token_mult_prob_error`` equal to 0.0 at every seed, bound 1e-5
relative): after 11 Adam steps at lr 1e-2 rounding differences grow, and one worker with
micro-batches of 1 against 3 differs as much (1.3e-3 at seed 1, 1.2e-5 at seed 2). Broken, the
step is off by a factor: gradients averaged instead of summed halve the grad norm, a loss over
each rank's own tokens doubles it, rank 0's metrics alone halve the loss, old logprobs stacked
in rank order move the agreement (mutants ``data_parallel_*``, all caught).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from data_parallel_jobs import EQUAL, JOB, ONE_STEP, UNEVEN, assert_same_step, replay
from recorded_rollouts import record_varied_rollouts


@pytest.mark.parametrize("layout", sorted(ONE_STEP))
def test_two_data_parallel_ranks_take_the_single_workers_step(ray_cluster, tiny_model_path, tmp_path: Path,
                                                              layout: str) -> None:
    shape, batches = ONE_STEP[layout]
    rollouts = record_varied_rollouts(tmp_path / "rec", [f"model.path={tiny_model_path}", *JOB, *shape])
    one, w_one = replay(tiny_model_path, rollouts, tmp_path / "dp1", "grpo.num_steps=1", *shape, *batches)
    two, w_two = replay(tiny_model_path, rollouts, tmp_path / "dp2", "grpo.num_steps=1", *shape, *batches,
                        "policy.data_parallel_size=2")
    assert_same_step(one, w_one, two, w_two, tiny_model_path)


def test_a_call_of_several_optimizer_steps_scores_and_returns_the_old_logprobs_in_row_order(
        ray_cluster, tiny_model_path, dp_recording, tmp_path: Path) -> None:
    """11 optimizer steps over uneven shards (``UNEVEN``): the old logprobs are scored before the
    first update, rank by rank with idle chunks, and must come back in row order, so the
    engine/trainer agreement equals the single worker's. Only what precedes the first update is
    compared: after 11 Adam steps at lr 1e-2, rounding differences of any two layouts (even two
    micro-batch sizes of one worker) grow to 1e-3 at some seeds (table above)."""
    one, _ = replay(tiny_model_path, dp_recording, tmp_path / "dp1", "grpo.num_steps=1", *UNEVEN)
    two, _ = replay(tiny_model_path, dp_recording, tmp_path / "dp2", "grpo.num_steps=1", *UNEVEN,
                    "policy.data_parallel_size=2")
    assert one["train/num_optimizer_steps"]["1"] == two["train/num_optimizer_steps"]["1"] == 11.0
    for key in EQUAL:
        assert two[key]["1"] == one[key]["1"], key
    error = one["train/token_mult_prob_error"]["1"]
    assert two["train/token_mult_prob_error"]["1"] == pytest.approx(error, rel=1e-5)
