"""The GRPO loop keeps the generation engine on the trainer's weights, step after step.

An untrained tiny model never answers right, so every reward is 0, every advantage is 0 and
the weights never move: a skipped refit would go unnoticed. The reward is replaced (in the
driver, where rollouts are scored) by one the untrained model earns about half the time,
and the lr is high, so the trainer's weights move every step and a stale engine's logprobs
of the sampled tokens drift far from the trainer's. With LoRA the engine gets the merged
weights: an adapter that did not reach them leaves the engine on the base model.
"""

from __future__ import annotations

import pytest
from learnable_reward import low_digit_reward

from posttrain.algorithms import grpo, grpo_step
from posttrain.config import load_config

# high lr: the weights move every step, and a stale engine's logprobs drift far from the trainer's
OVERRIDES = ["data.arithmetic.num_val=8", "grpo.num_prompts_per_step=4", "grpo.completions_per_prompt=4",
             "grpo.val_period=0", "policy.lr=1e-2", "policy.train_global_batch_size=16",
             "policy.train_micro_batch_size=16"]


@pytest.mark.parametrize("lora", [[], ["policy.lora.rank=8"]], ids=["full", "lora"])
@pytest.mark.slow(reason="a GRPO run whose engine is scored against the trainer on every step")
def test_engine_scores_like_the_trainer_on_every_step(ray_cluster, tiny_model_path, tmp_path, monkeypatch, capsys,
                                                      lora) -> None:
    monkeypatch.setattr(grpo_step, "math_reward", low_digit_reward)
    cfg = load_config("examples/configs/grpo_arithmetic.yaml",
                      [f"model.path={tiny_model_path}", "generation.backend=hf", "cluster.cpus_per_worker=0.5",
                       f"logger.log_dir={tmp_path / 'logs'}", "grpo.num_steps=4", *OVERRIDES, *lora],
                      grpo.GRPOMasterConfig)
    metrics = grpo.train(cfg)
    if lora:  # 8 * (in + out) over the 7 linear layers of 4 blocks: 65,536 of 594,176 + 65,536
        line = "runtime: hf + LoRA (rank 8: 65,536 of 659,712 parameters trained, 9.93%) policy"
        assert line in capsys.readouterr().out
    assert min(metrics["train/fraction_groups_kept"].values()) > 0  # there was a signal to learn from
    error = metrics["train/token_mult_prob_error"]
    assert sorted(error, key=int) == ["1", "2", "3", "4"]
    # 1.0 is exact agreement; a stale engine reads ~1.1 or more from step 2 on at this lr
    assert max(error.values()) == pytest.approx(1.0, abs=1e-3), error


def test_in_this_process_the_engine_scores_like_the_trainer_after_each_refit(in_process, tiny_model_path, tmp_path,
                                                                            monkeypatch) -> None:
    """The same loop with its workers in this process (``in_process.py``): step 2 samples from the
    weights step 1 trained, or its tokens' engine and trainer probabilities part."""
    monkeypatch.setattr(grpo_step, "math_reward", low_digit_reward)
    run = in_process.run(grpo, "examples/configs/grpo_arithmetic.yaml",
                         [f"model.path={tiny_model_path}", f"logger.log_dir={tmp_path / 'logs'}", "grpo.num_steps=2",
                          *OVERRIDES])
    assert min(run.metrics["train/fraction_groups_kept"].values()) > 0  # step 1 had a signal to learn from
    error = run.metrics["train/token_mult_prob_error"]
    assert sorted(error, key=int) == ["1", "2"]
    assert max(error.values()) == pytest.approx(1.0, abs=1e-3), error
