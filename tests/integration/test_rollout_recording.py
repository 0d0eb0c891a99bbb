"""Record and replay through the real GRPO loop (``grpo.save_rollouts`` / ``grpo.load_rollouts``),
run in this process with every worker call recorded (``in_process.py``): the files hold what
the engine sampled and the verifier scored, and a replay, which starts no engine, trains exactly
as the recorded run did (same batches, same weights at every step, same train metrics)."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.algorithms import grpo
from posttrain.algorithms import rollout_recording as recording
from posttrain.config import check_output_paths, load_config
from posttrain.environments.math_verifier import math_reward
from posttrain.errors import ConfigError, DataError

GRPO_YAML = "examples/configs/grpo_arithmetic.yaml"
P, G, STEPS = 4, 8, 3
# one-digit sums answered in one token: the untrained tiny model earns some rewards, groups vary,
# and the KL term acts once the weights moved, so every step trains (grad_norm > 0 checked)
JOB = [f"grpo.num_steps={STEPS}", f"grpo.num_prompts_per_step={P}", f"grpo.completions_per_prompt={G}",
       "data.arithmetic.operand_digits=1", "generation.max_new_tokens=1", "grpo.kl_coef=0.1", "policy.lr=1e-2",
       "grpo.val_period=0", "data.arithmetic.num_val=8"]


def test_a_replay_trains_exactly_as_the_recorded_run_and_starts_no_engine(in_process, tiny_model_path,
                                                                          tmp_path: Path) -> None:
    rec_dir = tmp_path / "rollouts"
    job = [f"model.path={tiny_model_path}", *JOB]
    recorded = in_process.run(grpo, GRPO_YAML, [*job, f"grpo.save_rollouts={rec_dir}", f"logger.log_dir={tmp_path}/a"])
    assert recording.recorded_steps(rec_dir) == [1, 2, 3]
    sampled = [c for c in recorded.calls("generation", "generate") if not c.kwargs["params"].greedy]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    for step, call in enumerate(sampled, start=1):
        samples = recording.load_step(rec_dir, step, P, G)
        assert [s["prompt_ids"] for s in samples] == call.args[0]  # what the engine was asked
        assert [s["completion_ids"] for s in samples] == call.result.completion_ids  # and answered
        assert [s["generation_logprobs"] for s in samples] == call.result.logprobs
        assert {s["weight_version"] for s in samples} == {call.result.weight_version}
        texts = tokenizer.batch_decode(call.result.completion_ids, skip_special_tokens=True)
        assert [s["reward"] for s in samples] == [math_reward(t, s["answer"])
                                                  for t, s in zip(texts, samples, strict=True)]
    assert sum(s["reward"] for step in (1, 2, 3) for s in recording.load_step(rec_dir, step, P, G)) > 0

    replayed = in_process.run(grpo, GRPO_YAML, [*job, f"grpo.load_rollouts={rec_dir}", f"logger.log_dir={tmp_path}/b"])
    assert replayed.workers("generation") == [] and replayed.calls("generation", "generate") == []
    assert recorded.metrics["train/grad_norm"]["3"] > 0 and recorded.metrics["train/kl"]["3"] > 0
    refit = {k for k in recorded.metrics if k.startswith("train/refit_")}  # the weight-sync probe's
    trained = [k for k in recorded.metrics if k.startswith("train/") and k not in refit]
    assert "train/token_mult_prob_error" in trained and refit and not refit & replayed.metrics.keys()
    assert "val/accuracy" not in replayed.metrics  # nothing to validate with
    for key in trained:
        assert replayed.metrics[key] == recorded.metrics[key], key
    before = [[c.weights_before for c in run.calls("policy", "train")] for run in (recorded, replayed)]
    assert len(before[0]) == STEPS
    for step, (a, b) in enumerate(zip(*before, strict=True), start=1):
        assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a), f"step {step} started from other weights"


def test_a_replay_of_a_recording_that_lacks_a_step_stops_before_anything_starts(in_process, tiny_model_path,
                                                                               tmp_path: Path) -> None:
    from unit.algorithms.test_rollout_recording_format import step_samples

    recording.save_step(tmp_path, 1, step_samples(1), 4)
    with pytest.raises(DataError, match=r"^grpo.load_rollouts='.*' has no recording of step\(s\) 2-3: it holds "
                                        r"steps 1-1 \(1 files\)$"):
        in_process.run(grpo, GRPO_YAML, [f"model.path={tiny_model_path}", *JOB, f"grpo.load_rollouts={tmp_path}"])
    assert in_process.recorder.workers == []


def test_a_replay_of_a_recording_whose_prompt_is_not_this_runs_stops_before_training(in_process, tiny_model_path,
                                                                                     tmp_path: Path) -> None:
    """A recording whose prompt tokens differ from what this run's chat template renders for the question
    (same length, other tokens: another tokenizer or template recorded it) would train on prompts this
    run never samples from."""
    from transformers import AutoTokenizer
    from unit.algorithms.test_rollout_recording_format import step_samples

    from posttrain.data.chat import ChatEncoder

    chat = ChatEncoder(AutoTokenizer.from_pretrained(tiny_model_path))
    samples = step_samples(1)
    for sample in samples:
        sample["prompt_ids"] = list(chat.prompt(sample["question"]))
        sample["seq_len"] = len(sample["prompt_ids"]) + len(sample["completion_ids"])
    sample = samples[5]
    sample["prompt_ids"] = sample["prompt_ids"][::-1]  # the same tokens, in another order
    recording.save_step(tmp_path, 1, samples, 4)
    with pytest.raises(DataError, match=r"step_000001.json, sample 5: its prompt_ids are not this run's prompt of "
                                        r"its question \(from token 0: "):
        in_process.run(grpo, GRPO_YAML, [f"model.path={tiny_model_path}", *JOB, "grpo.num_steps=1",
                                         "grpo.num_prompts_per_step=2", "grpo.completions_per_prompt=4",
                                         f"grpo.load_rollouts={tmp_path}", f"logger.log_dir={tmp_path}/log"])
    assert [c.method for c in in_process.recorder.calls if c.role == "policy" and c.method == "train"] == []


@pytest.mark.parametrize(("overrides", "message"), [
    (["grpo.save_rollouts=/tmp/a", "grpo.load_rollouts=/tmp/b"],
     r"save_rollouts='/tmp/a' and load_rollouts='/tmp/b': a replay samples nothing new to record \(set one\)"),
    (["grpo.save_rollouts=/tmp/a", "grpo.async.enabled=true"],
     r"save_rollouts records and replays the synchronous loop; with async.enabled=true"),
    (["grpo.load_rollouts=/tmp/b", "grpo.async.enabled=true"], r"load_rollouts records and replays the synchronous"),
])
def test_record_and_replay_refuse_what_they_cannot_do_in_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        load_config(GRPO_YAML, overrides, grpo.GRPOMasterConfig)
    assert "\n" not in str(err.value)


def test_an_unwritable_recording_directory_is_refused_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    cfg = load_config(GRPO_YAML, [f"grpo.save_rollouts={tmp_path}/file/rollouts", f"logger.log_dir={tmp_path}/log"],
                      grpo.GRPOMasterConfig)
    with pytest.raises(ConfigError, match=r"^grpo.save_rollouts '.*/file/rollouts' cannot be created: '.*/file' is a"):
        check_output_paths(cfg)
