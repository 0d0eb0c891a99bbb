"""The GRPO and SFT loops end to end on a tiny model: every step logged, finite, refit exact."""

import json
import math

import pytest

from posttrain.algorithms import grpo, sft
from posttrain.config import load_config
from posttrain.config_reads import record_of

REQUIRED_GRPO = ["train/loss", "train/reward_mean", "train/accuracy", "train/kl", "train/grad_norm",
                 "train/entropy", "train/probs_ratio_min", "train/probs_ratio_max", "train/clip_fraction",
                 "train/token_mult_prob_error", "timing/step", "memory/policy_peak_rss"]


@pytest.fixture
def small(tmp_path, tiny_model_path):
    return [f"model.path={tiny_model_path}", "cluster.cpus_per_worker=0.5", "data.arithmetic.num_val=16",
            "generation.backend=hf",  # the default tier tests the hf backend even where vLLM is installed
            f"logger.log_dir={tmp_path / 'logs'}"]


@pytest.mark.slow(reason="a real GRPO loop of the tiny model")
def test_grpo_loop_logs_every_step(ray_cluster, small, tmp_path):
    cfg = load_config("examples/configs/grpo_arithmetic.yaml",
                      small + ["grpo.num_steps=3", "grpo.num_prompts_per_step=4", "grpo.completions_per_prompt=4",
                               "grpo.val_period=2", "policy.train_global_batch_size=8",
                               "policy.train_micro_batch_size=4", "grpo.kl_coef=0.1",
                               f"checkpoint.save_path={tmp_path / 'final'}"],
                      grpo.GRPOMasterConfig)
    metrics = grpo.train(cfg)
    on_disk = json.loads((tmp_path / "logs" / "metrics.json").read_text())
    assert on_disk == metrics
    for name in REQUIRED_GRPO:
        assert sorted(metrics[name], key=int) == ["1", "2", "3"], name
        assert all(math.isfinite(v) for v in metrics[name].values()), name
    assert sorted(metrics["val/accuracy"], key=int) == ["0", "2", "3"]
    # The engine was refit from the trainer before each step: same weights, same logprobs.
    assert max(metrics["train/token_mult_prob_error"].values()) < 1.001
    assert (tmp_path / "final" / "config.json").is_file()
    assert (tmp_path / "final" / "tokenizer.json").is_file()
    # the run checked that it read every key it was given, the actors' reads come back over Ray:
    # train_micro_batch_size is read only inside the policy actor (posttrain/config_reads.py)
    assert "policy.train_micro_batch_size" in record_of(cfg).read  # type: ignore[union-attr]


@pytest.mark.slow(reason="a real SFT loop that must learn")
def test_sft_loop_learns(ray_cluster, small, tmp_path):
    cfg = load_config("examples/configs/sft_arithmetic.yaml",
                      small + ["sft.num_steps=30", "sft.batch_size=32", "sft.val_period=10",
                               "policy.train_global_batch_size=32", "policy.train_micro_batch_size=16"],
                      sft.SFTMasterConfig)
    metrics = sft.train(cfg)
    loss = metrics["train/loss"]
    assert sorted(loss, key=int) == [str(s) for s in range(1, 31)]
    assert loss["30"] < 0.8 * loss["1"]
    assert metrics["val/loss"]["30"] < metrics["val/loss"]["0"]
    # Every validation refits the engine and probes it: the probe ran each time and agreed.
    assert sorted(metrics["train/refit_logprob_error"], key=int) == ["0", "10", "20", "30"]
    assert max(metrics["train/refit_logprob_error"].values()) < 1e-4


@pytest.mark.slow(reason="a real SFT loop run to its validation stop")
def test_sft_stop_at_val_accuracy_ends_on_the_measurement(ray_cluster, small, monkeypatch):
    # Isolate the stop rule: accuracy reads 0.0 at step 0 and 0.5 from the next validation on.
    readings = iter([0.0, 0.5, 0.5, 0.5])
    monkeypatch.setattr(sft, "greedy_accuracy", lambda *args, **kwargs: next(readings))
    cfg = load_config("examples/configs/sft_arithmetic.yaml",
                      small + ["sft.num_steps=10", "sft.val_period=2", "sft.stop_at_val_accuracy=0.4"],
                      sft.SFTMasterConfig)
    metrics = sft.train(cfg)
    assert sorted(metrics["train/loss"], key=int) == ["1", "2"]
    assert metrics["val/accuracy"] == {"0": 0.0, "2": 0.5}
