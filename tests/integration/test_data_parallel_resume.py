"""A data-parallel run (``policy.data_parallel_size=2``) resumed from its checkpoint takes the next
step exactly as the uninterrupted run did, and a resume with another size is one line. Real Ray,
real process group, a recorded step (``data_parallel_jobs.py``; split from
``test_data_parallel.py`` so that parallel workers can take the files apart)."""

from __future__ import annotations

from pathlib import Path

import pytest
from data_parallel_jobs import UNEVEN, replay

from posttrain.errors import ConfigError


@pytest.mark.slow(reason="a data-parallel run stopped, resumed and compared with the uninterrupted run")
def test_a_data_parallel_run_resumes_exactly_and_refuses_another_size(ray_cluster, tiny_model_path, dp_recording,
                                                                      tmp_path: Path) -> None:
    dp2 = ["policy.data_parallel_size=2", *UNEVEN]
    whole, _ = replay(tiny_model_path, dp_recording, tmp_path / "whole", "grpo.num_steps=2", *dp2,
                      f"checkpoint.dir={tmp_path / 'ckpt'}", "checkpoint.save_period=1")
    resumed, _ = replay(tiny_model_path, dp_recording, tmp_path / "resumed", "grpo.num_steps=2", *dp2,
                        f"checkpoint.resume={tmp_path / 'ckpt' / 'step_1'}")
    assert whole["train/grad_norm"]["2"] > 0 and whole["train/kl"]["2"] > 0
    for key in ("train/loss", "train/grad_norm", "train/kl", "train/entropy", "train/token_mult_prob_error"):
        assert resumed[key]["2"] == whole[key]["2"], key
    with pytest.raises(ConfigError, match=r"was written with policy.data_parallel_size=2; this run has 1 "
                                          r"\(resume with the same size\)$"):
        replay(tiny_model_path, dp_recording, tmp_path / "other", "grpo.num_steps=2", *UNEVEN,
               f"checkpoint.resume={tmp_path / 'ckpt' / 'step_1'}")
