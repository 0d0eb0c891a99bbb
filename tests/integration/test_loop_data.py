"""What the GRPO and SFT loops actually feed themselves: the problems they train on, the ones
they validate on, and how the prompts change from step to step.

The loops run in this process with every worker call recorded (``in_process.py``), so the
prompts are read where they reach the engine and the trainer, not where the loop meant to
send them. Training prompts are those of the sampling ``generate`` calls (GRPO) or of the
``train`` batches (SFT); validation prompts those of the greedy ``generate`` calls and of
SFT's held-out loss batch. The data files are read here with ``json``, not with posttrain's
loader, so a loader that mixes the splits cannot vouch for itself.
"""

from __future__ import annotations

import json

import pytest
from in_process import Run

from posttrain.algorithms import grpo, sft
from posttrain.config import GSM8K_DIR, DataConfig
from posttrain.data.datasets import load_problems

GRPO_YAML = "examples/configs/grpo_arithmetic.yaml"
SFT_YAML = "examples/configs/sft_arithmetic.yaml"
# GSM8K questions run to ~800 characters: a character-level model with room for them
GSM8K_MODEL = ["model.path=null", "model.tiny.charset=ascii", "model.tiny.max_position_embeddings=1024"]


def questions_in(path) -> set[str]:
    return {json.loads(line)["question"] for line in open(path, encoding="utf-8") if line.strip()}



def sampled_prompts(run: Run, tokenizer) -> list[list[str]]:
    """Per training step, the questions of GRPO's sampling call, in order (G copies each)."""
    return [[tokenizer.decode(p) for p in c.args[0]] for c in run.calls("generation", "generate")
            if not c.kwargs["params"].greedy]


def greedy_prompts(run: Run, tokenizer) -> set[str]:
    return {tokenizer.decode(p) for c in run.calls("generation", "generate") if c.kwargs["params"].greedy
            for p in c.args[0]}


def train_batch_prompts(run: Run, tokenizer) -> list[list[str]]:
    """Per SFT step, the prompt part of each row of the training batch."""
    steps = []
    for call in run.calls("policy", "train"):
        batch = call.args[0]
        steps.append([tokenizer.decode(batch.input_ids[b, : int(batch.prompt_lens[b])].tolist())
                      for b in range(len(batch))])
    return steps


def val_loss_prompts(run: Run, tokenizer, val_loss_size: int) -> set[str]:
    """SFT's held-out loss batch (the ``get_logprobs`` calls of ``val_loss_size`` rows)."""
    out = set()
    for call in run.calls("policy", "get_logprobs"):
        batch = call.args[0]
        if len(batch) == val_loss_size:
            out |= {tokenizer.decode(batch.input_ids[b, : int(batch.prompt_lens[b])].tolist())
                    for b in range(len(batch))}
    return out


@pytest.fixture(scope="module")
def tokenizers(tiny_model_path):
    from transformers import AutoTokenizer

    from posttrain.models.tiny import TinyModelConfig, build_tiny_model

    gsm8k = build_tiny_model(TinyModelConfig(charset="ascii", max_position_embeddings=1024))
    return {"arithmetic": AutoTokenizer.from_pretrained(tiny_model_path), "gsm8k": AutoTokenizer.from_pretrained(gsm8k)}


def grpo_overrides(tmp_path, model: list[str], steps: int, prompts: int) -> list[str]:
    return [*model, f"logger.log_dir={tmp_path}", f"grpo.num_steps={steps}", f"grpo.num_prompts_per_step={prompts}",
            "grpo.completions_per_prompt=2", "generation.max_new_tokens=2", "grpo.val_period=0",
            "generation.refit_probe.num_sequences=0"]


# --- held-out leakage ------------------------------------------------------------------


def test_arithmetic_loaders_split_train_and_validation_disjointly() -> None:
    cfg = DataConfig.model_validate({"arithmetic": {"operand_digits": 1, "num_val": 20}})
    train, val = load_problems(cfg)
    assert len(val) == 20 and len(train) == 80
    assert not {p.question for p in train} & {p.question for p in val}
    assert len({p.question for p in train} | {p.question for p in val}) == 100  # the whole universe


def test_gsm8k_loaders_take_validation_from_the_test_file_only() -> None:
    train, val = load_problems(DataConfig(dataset="gsm8k", max_val=50))
    train_file, test_file = questions_in(GSM8K_DIR / "train.jsonl"), questions_in(GSM8K_DIR / "test.jsonl")
    assert not train_file & test_file  # the files themselves do not overlap
    assert {p.question for p in train} == train_file
    assert len(val) == 50 and {p.question for p in val} <= test_file


def test_grpo_on_arithmetic_trains_on_every_training_problem_and_validates_on_none(
        in_process, tiny_model_path, tokenizers, tmp_path) -> None:
    """1-digit addition has 100 problems: with 20 held out, 5 steps of 16 prompts are one epoch,
    so every training problem is sampled once and a held-out one would show up at once."""
    tok = tokenizers["arithmetic"]
    run = in_process.run(grpo, GRPO_YAML, grpo_overrides(tmp_path, [f"model.path={tiny_model_path}"], 5, 16)
                         + ["data.arithmetic.operand_digits=1", "data.arithmetic.num_val=20"])
    trained = {q for step in sampled_prompts(run, tok) for q in step}
    validated = greedy_prompts(run, tok)
    assert len(trained) == 80 and len(validated) == 20
    assert not trained & validated
    assert trained | validated == {f"{a}+{b}=" for a in range(10) for b in range(10)}


@pytest.mark.slow(reason="a GRPO run on gsm8k-format files")
def test_grpo_on_gsm8k_trains_on_the_train_file_and_validates_on_the_test_file(in_process, tokenizers,
                                                                                tmp_path) -> None:
    tok = tokenizers["gsm8k"]
    run = in_process.run(grpo, GRPO_YAML, grpo_overrides(tmp_path, GSM8K_MODEL, 2, 3)
                         + ["data.dataset=gsm8k", "data.max_val=4"])
    trained = {q for step in sampled_prompts(run, tok) for q in step}
    validated = greedy_prompts(run, tok)
    assert len(trained) == 6 and len(validated) == 4
    assert trained <= questions_in(GSM8K_DIR / "train.jsonl")
    assert validated <= questions_in(GSM8K_DIR / "test.jsonl")


def sft_overrides(tmp_path, model: list[str], steps: int, batch: int, val_loss_size: int) -> list[str]:
    return [*model, f"logger.log_dir={tmp_path}", f"sft.num_steps={steps}", f"sft.batch_size={batch}",
            "sft.val_period=0", f"sft.val_loss_size={val_loss_size}", "generation.max_new_tokens=2",
            f"policy.train_global_batch_size={batch}", f"policy.train_micro_batch_size={batch}",
            "generation.refit_probe.num_sequences=0"]


def test_sft_on_arithmetic_trains_on_every_training_problem_and_validates_on_none(
        in_process, tiny_model_path, tokenizers, tmp_path) -> None:
    tok = tokenizers["arithmetic"]
    run = in_process.run(sft, SFT_YAML, sft_overrides(tmp_path, [f"model.path={tiny_model_path}"], 5, 16, 20)
                         + ["data.arithmetic.operand_digits=1", "data.arithmetic.num_val=20"])
    trained = {q for step in train_batch_prompts(run, tok) for q in step}
    validated = greedy_prompts(run, tok) | val_loss_prompts(run, tok, 20)
    assert len(trained) == 80 and len(validated) == 20
    assert not trained & validated


def test_sft_on_gsm8k_trains_on_the_train_file_and_validates_on_the_test_file(in_process, tokenizers,
                                                                              tmp_path) -> None:
    tok = tokenizers["gsm8k"]
    run = in_process.run(sft, SFT_YAML, sft_overrides(tmp_path, GSM8K_MODEL, 2, 3, 4)
                         + ["data.dataset=gsm8k", "data.max_val=4"])
    trained = {q for step in train_batch_prompts(run, tok) for q in step}
    validated = greedy_prompts(run, tok) | val_loss_prompts(run, tok, 4)
    assert len(trained) == 6 and len(validated) == 4
    assert trained <= questions_in(GSM8K_DIR / "train.jsonl")
    assert validated <= questions_in(GSM8K_DIR / "test.jsonl")


# --- new prompts every step, epoch by epoch ------------------------------------------------


@pytest.mark.parametrize("algorithm", ["grpo", "sft"])
def test_each_step_trains_on_new_prompts_and_an_epoch_covers_the_pool_once(
        algorithm: str, in_process, tiny_model_path, tokenizers, tmp_path) -> None:
    """80 training problems, 16 per step: steps 1-5 are epoch 0 (each problem exactly once),
    step 6 opens epoch 1 in a new order."""
    tok = tokenizers["arithmetic"]
    data = ["data.arithmetic.operand_digits=1", "data.arithmetic.num_val=20"]
    if algorithm == "grpo":
        run = in_process.run(grpo, GRPO_YAML, grpo_overrides(tmp_path, [f"model.path={tiny_model_path}"], 6, 16) + data)
        steps = [step[::2] for step in sampled_prompts(run, tok)]  # G = 2 contiguous copies
    else:
        run = in_process.run(sft, SFT_YAML, sft_overrides(tmp_path, [f"model.path={tiny_model_path}"], 6, 16, 20)
                             + data)
        steps = train_batch_prompts(run, tok)
    assert [len(s) for s in steps] == [16] * 6
    assert all(len(set(s)) == 16 for s in steps)  # no repeat within a step
    epoch0 = [q for s in steps[:5] for q in s]
    assert len(set(epoch0)) == 80  # no repeat within an epoch: every problem once
    assert steps[5] != steps[0] and set(steps[5]) <= set(epoch0)


# --- SFT trains on the solution tokens of its own problem --------------------------------


def assert_rows_train_on_their_own_solution(run: Run, tok, solutions: dict[str, str]) -> None:
    """Every SFT row: the question as the prompt, then exactly its own solution and EOS as the
    trained tokens (``solutions``: question -> reference solution, read independently)."""
    for call in run.calls("policy", "train"):
        batch = call.args[0]
        for b in range(len(batch)):
            p, n = int(batch.prompt_lens[b]), int(batch.completion_lens[b])
            question = tok.decode(batch.input_ids[b, :p].tolist())
            assert batch.input_ids[b, :p].tolist() == tok.encode(question)
            assert batch.input_ids[b, p:p + n].tolist() == tok.encode(solutions[question]) + [tok.eos_token_id]
            assert batch.completion_mask[b].tolist() == [1.0] * n + [0.0] * (batch.completion_mask.shape[1] - n)
            assert batch.attention_mask[b].tolist() == [1] * (p + n) + [0] * (batch.attention_mask.shape[1] - p - n)


def test_sft_rows_train_on_each_problems_own_solution(in_process, tiny_model_path, tokenizers, tmp_path) -> None:
    run = in_process.run(sft, SFT_YAML, sft_overrides(tmp_path, [f"model.path={tiny_model_path}"], 2, 8, 8))
    sums = {f"{a}+{b}=": str(a + b) for a in range(100) for b in range(100)}
    assert_rows_train_on_their_own_solution(run, tokenizers["arithmetic"], sums)


def test_sft_on_gsm8k_trains_on_the_worked_solution_not_just_the_final_answer(in_process, tokenizers,
                                                                               tmp_path) -> None:
    run = in_process.run(sft, SFT_YAML, sft_overrides(tmp_path, GSM8K_MODEL, 1, 3, 2)
                         + ["data.dataset=gsm8k", "data.max_val=2"])
    records = [json.loads(line) for line in open(GSM8K_DIR / "train.jsonl", encoding="utf-8") if line.strip()]
    assert_rows_train_on_their_own_solution(run, tokenizers["gsm8k"], {r["question"]: r["answer"] for r in records})


# --- the engine's weight version -------------------------------------------------------


def test_rollouts_from_an_engine_on_another_weight_version_stop_the_run(in_process, tiny_model_path,
                                                                        tmp_path) -> None:
    def stale_at_step_2(call, out):
        if not call.kwargs["params"].greedy and out.weight_version == 1:
            out.weight_version = 0  # the engine says it sampled with the weights before step 1's update
        return out

    with pytest.raises(RuntimeError, match="step 2: rollouts were sampled with weight version 0, the trainer is at 1"):
        in_process.run(grpo, GRPO_YAML, grpo_overrides(tmp_path, [f"model.path={tiny_model_path}"], 3, 2),
                       {("generation", "generate"): stale_at_step_2})


def test_an_engine_reporting_a_stale_version_after_refit_stops_the_run(in_process, tiny_model_path,
                                                                       tmp_path) -> None:
    with pytest.raises(RuntimeError, match="refit failed: generation engine at weight version 0, trainer at 1"):
        in_process.run(grpo, GRPO_YAML, grpo_overrides(tmp_path, [f"model.path={tiny_model_path}"], 2, 2),
                       {("generation", "weight_version"): lambda call, version: 0})
