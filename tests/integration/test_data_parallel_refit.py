"""The engine serves a data-parallel policy's weights after every refit (a broadcast between CPU
processes, or the object store), checked by the weight-sync probe in a real GRPO run (split from
``test_data_parallel.py`` so that parallel workers can take the files apart). The bound
``< 1e-6``: the probe's logprob error after a DP=2 refit was 0.0 at both steps and transports
(AMD EPYC, 2 cores)."""

from __future__ import annotations

from pathlib import Path

import pytest
from data_parallel_jobs import GRPO_YAML, JOB, UNEVEN

from posttrain.algorithms import grpo
from posttrain.config import load_config


@pytest.mark.parametrize("transport", ["auto", "object_store"])
@pytest.mark.slow(reason="two data-parallel ranks refit a real engine after every step")
def test_the_engine_serves_the_data_parallel_policys_weights_after_every_refit(ray_cluster, tiny_model_path,
                                                                               tmp_path: Path, transport: str) -> None:
    """A GRPO run with an engine: after each refit (a broadcast between CPU processes under auto,
    the object store otherwise) the weight-sync probe scores the same sequences on the engine and
    on the sharded policy and stops the run past its bound; the weights moved every step."""
    cfg = load_config(GRPO_YAML, [f"model.path={tiny_model_path}", *JOB, "grpo.num_steps=2", *UNEVEN,
                                  "policy.data_parallel_size=2", "generation.colocated=false",
                                  f"generation.refit_transport={transport}", f"logger.log_dir={tmp_path}"],
                      grpo.GRPOMasterConfig)
    metrics = grpo.train(cfg)
    assert set(metrics["train/refit_logprob_error"]) == {"1", "2"}
    assert all(v < 1e-6 for v in metrics["train/refit_logprob_error"].values()), metrics["train/refit_logprob_error"]
    assert metrics["train/kl"]["2"] > 0  # the second step's policy is not the first's
