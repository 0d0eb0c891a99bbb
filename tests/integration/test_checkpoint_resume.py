"""Periodic checkpoints and exact resume, in-process on CPU (the real loops, workers and files).

The equivalence: a run of 2N steps and a run of N steps resumed for N more log the same
values for steps N+1..2N (every metric but wall-clock timings and memory), and the resumed
run's metrics.json continues at N+1 with no step missing or repeated. Beyond the weights,
optimizer and sampler: the KL term's frozen reference stays the initial model after a resume
(every backend), and a run that had met its stop condition does nothing more when run again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from harness.policy_backends import BACKENDS, make_worker
from learnable_reward import low_digit_reward
from same_run import assert_same_steps

from posttrain.algorithms import grpo, grpo_step, sft
from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.data.batch import make_batch
from posttrain.errors import ConfigError
from posttrain.utils.checkpoint import COMPLETE

ROOT = Path(__file__).resolve().parents[2]
GRPO_YAML = str(ROOT / "examples" / "configs" / "grpo_arithmetic.yaml")
SFT_YAML = str(ROOT / "examples" / "configs" / "sft_arithmetic.yaml")
GRPO_BASE = ["grpo.num_prompts_per_step=4", "grpo.completions_per_prompt=4", "generation.max_new_tokens=3",
             "data.arithmetic.num_val=6", "grpo.val_period=0", "policy.train_global_batch_size=4",
             "policy.train_micro_batch_size=4", "policy.lr=3e-3", "policy.warmup_steps=5", "grpo.kl_coef=0.1"]
SFT_BASE = ["sft.batch_size=8", "sft.val_period=2", "sft.val_loss_size=6", "data.arithmetic.num_val=6",
            "generation.max_new_tokens=3", "policy.train_global_batch_size=4", "policy.train_micro_batch_size=4",
            "policy.warmup_steps=3"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture(autouse=True)
def learnable(monkeypatch):
    """A reward the untrained model earns half the time: GRPO groups vary and every step trains
    (with the real reward nothing would, and a resume that lost the optimizer would pass)."""
    monkeypatch.setattr(grpo_step, "math_reward", low_digit_reward)


def run(in_process, algorithm, yaml: str, base: list[str], steps: int, log_dir: Path, ckpt_dir: Path,
        model_path: str, *extra: str):
    key = "grpo.num_steps" if algorithm is grpo else "sft.num_steps"
    return in_process.run(algorithm, yaml, [f"model.path={model_path}", *base, f"{key}={steps}",
                                            f"logger.log_dir={log_dir}", f"checkpoint.dir={ckpt_dir}",
                                            "checkpoint.save_period=2", *extra])


@pytest.mark.parametrize(("algorithm", "lora"), [(grpo, []), (sft, []), (grpo, ["policy.lora.rank=4"])],
                         ids=["grpo", "sft", "grpo-lora"])
def test_a_resumed_run_logs_what_the_uninterrupted_run_logged(in_process, tiny_model_path, tmp_path, algorithm,
                                                              lora):
    yaml, base = (GRPO_YAML, GRPO_BASE) if algorithm is grpo else (SFT_YAML, SFT_BASE)
    base = [*base, *lora]
    whole = run(in_process, algorithm, yaml, base, 4, tmp_path / "whole", tmp_path / "whole_ckpt", tiny_model_path)
    first = run(in_process, algorithm, yaml, base, 2, tmp_path / "log", tmp_path / "ckpt", tiny_model_path)
    assert (tmp_path / "ckpt" / "step_2" / COMPLETE).is_file()
    resumed = run(in_process, algorithm, yaml, base, 4, tmp_path / "log", tmp_path / "ckpt", tiny_model_path)
    assert_same_steps(whole.metrics, resumed.metrics, range(3, 5))
    assert all(resumed.metrics["train/grad_norm"][s] > 0 for s in ("3", "4"))  # steps 3-4 really trained
    # the resumed run trained steps 3 and 4 only, and from step 2's weights
    trained = resumed.calls("policy", "train")
    assert len(trained) == 2
    assert first.calls("policy", "train")[-1].result["grad_norm"] == pytest.approx(
        whole.calls("policy", "train")[1].result["grad_norm"], rel=1e-6)
    # metrics.json continues: every train step once, 1..4; what run 1 logged for 1..2 kept
    logged = json.loads((tmp_path / "log" / "metrics.json").read_text())
    assert sorted(map(int, logged["train/loss"])) == [1, 2, 3, 4]
    assert logged["train/loss"]["1"] == first.metrics["train/loss"]["1"]
    if algorithm is grpo:  # kl_coef 0.1: the KL term's reference after the resume is the initial model
        assert all(resumed.metrics["train/kl"][s] > 1e-2 for s in ("3", "4"))  # large enough to be seen
        refs = [[c.result for c in r.calls("policy", "get_logprobs") if c.kwargs.get("reference")]
                for r in (whole, resumed)]
        assert len(refs[0]) == 4 and len(refs[1]) == 2
        for got, want in zip(refs[1], refs[0][2:], strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loaded_checkpoint_trains_on_from_its_weights_against_the_initial_reference(backend, tiny_model_path,
                                                                                     tmp_path) -> None:
    """A worker that loads a checkpoint scores as the one that saved it, and its reference (the KL
    term's) still scores as the initial model: not the checkpoint's weights, which would make the
    KL read 0 at the resume and drift from the uninterrupted run's."""
    kw = {"lr": 1e-2, "train_global_batch_size": 4, "train_micro_batch_size": 4}
    trained = make_worker(backend, tiny_model_path, **kw)
    batch = make_batch([[2, 3, 4], [5, 6], [7, 8, 9, 10], [4, 4]], [[11, 12], [13], [14, 15, 16], [12, 3]], 0)
    initial = trained.get_logprobs(batch)
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
    for _ in range(2):
        trained.train(batch, {"advantages": advantages}, ClippedPGLoss())
    trained.save_checkpoint(str(tmp_path / "ckpt"), tokenizer_path=tiny_model_path)
    resumed = make_worker(backend, tiny_model_path, **kw)
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    now = trained.get_logprobs(batch)
    assert (now - initial).abs().max() > 1e-2  # it trained: a reference taken from the checkpoint would show
    torch.testing.assert_close(resumed.get_logprobs(batch), now, rtol=0, atol=1e-6)
    torch.testing.assert_close(resumed.get_logprobs(batch, reference=True), initial, rtol=0, atol=1e-6)


@pytest.mark.slow(reason="GRPO runs stopped and resumed from their checkpoints")
def test_resume_auto_takes_the_newest_complete_checkpoint_and_never_starts_over(in_process, tiny_model_path,
                                                                                 tmp_path) -> None:
    run(in_process, grpo, GRPO_YAML, GRPO_BASE, 4, tmp_path / "log", tmp_path / "ckpt", tiny_model_path,
        "checkpoint.keep_last=3")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_2", "step_4"]
    (tmp_path / "ckpt" / "step_4" / COMPLETE).unlink()  # as if step 4 had been cut short
    resumed = run(in_process, grpo, GRPO_YAML, GRPO_BASE, 4, tmp_path / "log2", tmp_path / "ckpt", tiny_model_path)
    assert len(resumed.calls("policy", "train")) == 2  # from step 2: steps 3 and 4
    assert (tmp_path / "ckpt" / "step_4").is_dir()  # rewritten, not deleted
    fresh = run(in_process, grpo, GRPO_YAML, GRPO_BASE, 4, tmp_path / "log3", tmp_path / "ckpt", tiny_model_path,
                "checkpoint.resume=never")
    assert len(fresh.calls("policy", "train")) == 4
    by_path = run(in_process, grpo, GRPO_YAML, GRPO_BASE, 4, tmp_path / "log4", tmp_path / "other", tiny_model_path,
                  f"checkpoint.resume={tmp_path / 'ckpt' / 'step_2'}")
    assert len(by_path.calls("policy", "train")) == 2


def test_keep_last_keeps_the_newest(in_process, tiny_model_path, tmp_path) -> None:
    run(in_process, grpo, GRPO_YAML, GRPO_BASE, 6, tmp_path / "log", tmp_path / "ckpt", tiny_model_path,
        "checkpoint.keep_last=1")
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["step_6"]


def test_resume_from_a_path_that_is_not_a_checkpoint_is_one_line(in_process, tiny_model_path, tmp_path) -> None:
    with pytest.raises(ConfigError, match=f"checkpoint.resume '{tmp_path}' is not a complete checkpoint"):
        run(in_process, grpo, GRPO_YAML, GRPO_BASE, 2, tmp_path / "log", tmp_path / "ckpt", tiny_model_path,
            f"checkpoint.resume={tmp_path}")


@pytest.mark.parametrize(("written", "resumed", "message"), [
    ([], ["policy.lora.rank=4"], "holds no LoRA adapter"),
    (["policy.lora.rank=4"], [], "holds a LoRA adapter, but policy.lora.rank=0"),
    (["policy.lora.rank=4"], ["policy.lora.rank=8"], "has policy.lora.rank=4, the config says 8"),
], ids=["full-into-lora", "lora-into-full", "other-rank"])
def test_resuming_with_another_lora_setting_is_one_line(in_process, tiny_model_path, tmp_path, written, resumed,
                                                         message) -> None:
    run(in_process, grpo, GRPO_YAML, GRPO_BASE, 2, tmp_path / "log", tmp_path / "ckpt", tiny_model_path, *written)
    with pytest.raises(ConfigError, match=message):
        run(in_process, grpo, GRPO_YAML, GRPO_BASE, 4, tmp_path / "log", tmp_path / "ckpt", tiny_model_path, *resumed)


@pytest.mark.slow(reason="GRPO runs stopped and resumed from a checkpoint (7.1 s run first)")
def test_steps_logged_after_the_checkpoint_by_the_interrupted_run_are_dropped(in_process, tiny_model_path,
                                                                               tmp_path) -> None:
    """The interrupted run got to step 5 but its newest complete checkpoint is step 2: the
    resumed run (to step 3) logs 3 again and nothing of the dead run's 4 and 5 stays."""
    run(in_process, grpo, GRPO_YAML, GRPO_BASE, 5, tmp_path / "log", tmp_path / "ckpt", tiny_model_path,
        "checkpoint.keep_last=5")
    for step in (4, 5):
        (tmp_path / "ckpt" / f"step_{step}" / COMPLETE).unlink()
    resumed = run(in_process, grpo, GRPO_YAML, GRPO_BASE, 3, tmp_path / "log", tmp_path / "ckpt", tiny_model_path)
    logged = json.loads((tmp_path / "log" / "metrics.json").read_text())
    assert sorted(map(int, logged["train/loss"])) == [1, 2, 3]
    assert sorted(map(int, logged["val/accuracy"])) == [0, 3]  # the dead run's step-5 validation is gone
    assert logged["train/loss"]["3"] == resumed.metrics["train/loss"]["3"]


def test_an_sft_run_that_reaches_its_target_early_checkpoints_that_step_and_a_rerun_does_nothing_more(
        in_process, tiny_model_path, tokenizer, tmp_path) -> None:
    """Validation answers turn right from the second validation on: with a target of 0.5 the
    run ends after step 1 of 6, and its checkpoint is of step 1 (not due by save_period). The
    same command again resumes from that checkpoint, finds the target met, and does nothing
    more: no training, no validation, no new checkpoint, metrics.json as it was."""
    from posttrain.models.generation.interfaces import GenerationOutput

    seen = []

    def right_after_first(call, out):
        seen.append(1)
        if len(seen) == 1:
            return out
        answers = [str(sum(int(x) for x in tokenizer.decode(p).rstrip("=").split("+"))) for p in call.args[0]]
        ids = [tokenizer.encode(a) + [tokenizer.eos_token_id] for a in answers]
        return GenerationOutput(ids, [[-1.0] * len(i) for i in ids], out.weight_version)

    overrides = [f"model.path={tiny_model_path}", *SFT_BASE, "sft.num_steps=6", "sft.val_period=1",
                 "sft.stop_at_val_accuracy=0.5", f"logger.log_dir={tmp_path / 'log'}",
                 f"checkpoint.dir={tmp_path / 'ckpt'}", "checkpoint.save_period=4"]
    run = in_process.run(sft, SFT_YAML, overrides, {("generation", "generate"): right_after_first})
    assert sorted(run.metrics["train/loss"]) == ["1"]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_1"]
    assert (tmp_path / "ckpt" / "step_1" / COMPLETE).is_file()
    logged = (tmp_path / "log" / "metrics.json").read_text()
    again = in_process.run(sft, SFT_YAML, overrides, {("generation", "generate"): right_after_first})
    assert again.calls("policy", "train") == [] and again.calls("generation", "generate") == []
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_1"]
    assert (tmp_path / "log" / "metrics.json").read_text() == logged and again.metrics == run.metrics
