"""Every metric the GRPO and SFT loops log equals an independent recomputation.

The loops run in this process (``in_process.py``) with every worker call recorded; the
recomputation (``replay.py`` for the train step, the formulas below for the rest) starts from
the recorded inputs: the prompts, the engine's completions and logprobs, the weights each
step started from. A metric computed over the wrong tokens (padding, prompt tokens), from the
wrong tensors (the trainer compared with itself), or frozen at one value, no longer matches.

To make such bugs visible the runs are built so each metric has something to show: an
engine whose logprobs are off by a known amount (so the engine/trainer disagreement metrics
cannot read 1.0 by accident), completions of mixed length (padding in every batch), several
optimizer steps per train call (probability ratios away from 1, clipping, a non-zero KL),
and validation answers that are right for a known subset of problems.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from learnable_reward import low_digit_reward
from replay import ReplayTrainer, TrainerSpec, assert_metrics_match, max_weight_gap, padded, token_logprobs
from step_timing import DELAY_S, assert_each_step_timed_alone, at, hold_first

from posttrain.algorithms import grpo, grpo_step, sft
from posttrain.environments.math_verifier import math_reward
from posttrain.models.generation.interfaces import GenerationOutput

GRPO_YAML = "examples/configs/grpo_arithmetic.yaml"
SFT_YAML = "examples/configs/sft_arithmetic.yaml"
ENGINE_LOGPROB_SHIFT = 0.03  # added to every sampled token's engine logprob
PROBE_LOGPROB_SHIFT = 0.02  # added to every probe token the engine scores
# The runs train at lr 1e-2, so every optimizer step moves weights by ~1e-2: the replay must stay
# within 1% of one step (float noise through Adam reaches ~1e-5 after a few steps).
WEIGHT_TOLERANCE = 1e-4


def engine_transforms(tokenizer) -> dict:
    """Results rewritten on their way back from the engine (``in_process`` transforms):

    - sampling calls: every logprob off by ENGINE_LOGPROB_SHIFT;
    - greedy (validation) calls: the right answer for every third problem, a wrong one otherwise;
    - probe scores: every logprob off by PROBE_LOGPROB_SHIFT.
    """

    def generate(call, out: GenerationOutput) -> GenerationOutput:
        prompts, params = call.args[0], call.kwargs["params"]
        if not params.greedy:
            shifted = [[lp + ENGINE_LOGPROB_SHIFT for lp in row] for row in out.logprobs]
            return GenerationOutput(out.completion_ids, shifted, out.weight_version)
        completions = []
        for i, prompt in enumerate(prompts):
            answer = str(eval_sum(tokenizer.decode(prompt)))
            completions.append(tokenizer.encode(answer if i % 3 == 0 else answer + "9") + [tokenizer.eos_token_id])
        return GenerationOutput(completions, [[-1.0] * len(c) for c in completions], out.weight_version)

    def score(call, rows: list[list[float]]) -> list[list[float]]:
        return [[lp + PROBE_LOGPROB_SHIFT for lp in row] for row in rows]

    return {("generation", "generate"): generate, ("generation", "score"): score}


def eval_sum(question: str) -> int:
    a, b = question.rstrip("=").split("+")
    return int(a) + int(b)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def logged_at(run, step: int) -> dict[str, float]:
    """The ``train/*`` metrics the run logged at ``step``, without the prefix."""
    return {k.removeprefix("train/"): v[str(step)] for k, v in run.metrics.items()
            if k.startswith("train/") and str(step) in v}


def steps_of(run) -> list[list]:
    """The recorded calls split into training steps (each starts with a sampling ``generate``);
    calls before the first step are left out."""
    steps: list[list] = []
    for call in run.recorder.calls:
        if call.method == "generate" and not call.kwargs["params"].greedy:
            steps.append([])
        if steps:
            steps[-1].append(call)
    return steps


def first(calls, role: str, method: str):
    """The first of ``calls`` made to ``method`` of a ``role`` worker."""
    return next(c for c in calls if c.role == role and c.method == method)


def rollout_rewards(generate_call, tokenizer) -> list[float]:
    """The reward of each rollout of a recorded sampling call, recomputed from its text."""
    texts = tokenizer.batch_decode(generate_call.result.completion_ids, skip_special_tokens=True)
    questions = [tokenizer.decode(p) for p in generate_call.args[0]]
    return [low_digit_reward(t, str(eval_sum(q))) for t, q in zip(texts, questions, strict=True)]


def kept_rows(rewards: list[float], group_size: int) -> list[int]:
    """Rows of groups whose rewards vary; every row when none does."""
    groups = [rewards[g:g + group_size] for g in range(0, len(rewards), group_size)]
    rows = [g * group_size + i for g, grp in enumerate(groups) if len(set(grp)) > 1 for i in range(group_size)]
    return rows or list(range(len(rewards)))


def group_advantages(rewards: list[float], group_size: int) -> list[float]:
    """(r - mean) / (sample std + 1e-6) within each group (DeepSeekMath Sec. 4.1.2)."""
    out = []
    for g in range(0, len(rewards), group_size):
        grp = rewards[g:g + group_size]
        mean, std = statistics.fmean(grp), statistics.stdev(grp)
        out += [(r - mean) / (std + 1e-6) for r in grp]
    return out


def run_grpo(model_path, log_dir, tokenizer, *overrides: str, transforms: dict | None = None):
    """A 3-step in-process GRPO run (4 prompts x 4 completions, lr 1e-2) under ``engine_transforms``
    (and ``transforms``) and the low-digit reward, with ``overrides`` on top."""
    with pytest.MonkeyPatch.context() as mp:
        from in_process import InProcess

        mp.setattr(grpo_step, "math_reward", low_digit_reward)
        base = [f"model.path={model_path}", f"logger.log_dir={log_dir}",
                "grpo.num_steps=3", "grpo.num_prompts_per_step=4", "grpo.completions_per_prompt=4",
                "generation.max_new_tokens=6", "data.arithmetic.num_val=9", "grpo.val_period=0",
                "policy.lr=1e-2", "generation.refit_probe.max_logprob_error=0.1"]
        return InProcess().run(grpo, GRPO_YAML, base + list(overrides),
                               {**engine_transforms(tokenizer), **(transforms or {})})


@pytest.fixture(scope="module")
def grpo_run(tiny_model_path, tmp_path_factory, tokenizer):
    """Several optimizer steps per train call, with a KL term; the first train call held ``DELAY_S``."""
    run = run_grpo(tiny_model_path, tmp_path_factory.mktemp("grpo"), tokenizer, "policy.train_global_batch_size=4",
                   "policy.train_micro_batch_size=2", "grpo.kl_coef=0.5",
                   transforms={("policy", "train"): hold_first()})
    return run, run.cfg, tiny_model_path


def test_grpo_train_step_metrics_equal_an_independent_replay(grpo_run) -> None:
    from transformers import AutoModelForCausalLM

    run, cfg, model_path = grpo_run
    replay = ReplayTrainer(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32),
                           TrainerSpec.of(cfg, "grpo"))
    train_calls, reports = run.calls("policy", "train"), run.calls("policy", "train_step")
    assert len(train_calls) == len(reports) == 3
    optimizer_steps = 0
    for step, (call, report) in enumerate(zip(train_calls, reports, strict=True), start=1):
        batch, extra, _ = call.args
        assert max_weight_gap(call.weights_before, replay.weights()) < WEIGHT_TOLERANCE, f"step {step}: weights drifted"
        mask = batch.completion_mask.bool()
        # the worker scored the old logprobs itself (the loop sends none), from the policy the
        # call started from; it reports them to the loop with the step
        assert "old_logprobs" not in extra
        reported_old = report.result[3]
        assert (reported_old - replay.old_logprobs(batch))[mask].abs().max() < 1e-5, step
        metrics = replay.train(batch, extra)
        optimizer_steps += metrics["num_optimizer_steps"]
        logged = logged_at(run, step)
        assert_metrics_match(logged, metrics, f"step {step}")
    assert optimizer_steps > len(train_calls)  # some calls took several optimizer steps: ratios left 1
    assert max(run.metrics["train/clip_fraction"].values()) > 0
    assert min(run.metrics["train/probs_ratio_min"].values()) < 1 < max(run.metrics["train/probs_ratio_max"].values())
    assert max(run.metrics["train/kl"].values()) > 1e-4


@pytest.fixture(scope="module")
def one_step_run(tiny_model_path, tmp_path_factory, tokenizer):
    """GRPO as TRL's trainer runs it: each train call one optimizer step over the whole batch
    (on-policy, kl_coef 0), so the worker takes the old logprobs from its train forward."""
    run = run_grpo(tiny_model_path, tmp_path_factory.mktemp("grpo1"), tokenizer, "policy.train_global_batch_size=16",
                   "policy.train_micro_batch_size=8", "grpo.kl_coef=0")
    return run, run.cfg, tiny_model_path


def test_one_optimizer_step_scores_the_old_policy_in_its_train_forward(one_step_run) -> None:
    """The train call's only forward passes are its micro-batches' (no scoring pass, none of
    the reference), yet it trains as a replay that scores the old policy separately does:
    weights, loss, clip fraction and ratios (exactly 1: old is this forward's, detached), and
    the old logprobs it reports are the policy's before the step."""
    from transformers import AutoModelForCausalLM

    run, cfg, model_path = one_step_run
    replay = ReplayTrainer(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32),
                           TrainerSpec.of(cfg, "grpo"))
    scorer = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    train_calls, reports = run.calls("policy", "train"), run.calls("policy", "train_step")
    assert len(train_calls) == len(reports) == 3
    for step, (call, report) in enumerate(zip(train_calls, reports, strict=True), start=1):
        batch, extra, _ = call.args
        assert set(extra) == {"advantages"}, step
        micro = cfg.policy.train_micro_batch_size
        assert call.forward_rows == [min(micro, len(batch) - s) for s in range(0, len(batch), micro)], step
        assert max_weight_gap(call.weights_before, replay.weights()) < WEIGHT_TOLERANCE, f"step {step}: weights drifted"
        mask = batch.completion_mask.bool()
        scorer.load_state_dict(call.weights_before)  # the run's own weights at the call's start
        with torch.no_grad():
            old = padded(token_logprobs(scorer, batch, 1.0), batch.completion_mask.shape[1])
        assert (report.result[3] - old)[mask].abs().max() < 1e-5, step
        metrics = replay.train(batch, extra)
        assert metrics["num_optimizer_steps"] == 1
        logged = logged_at(run, step)
        assert logged["probs_ratio_min"] == logged["probs_ratio_max"] == 1.0
        assert_metrics_match(logged, metrics, f"step {step}")
        assert "kl" not in logged
    final = run.workers("policy")[0].impl.get_weights()
    assert max_weight_gap(final, replay.weights()) < WEIGHT_TOLERANCE
    assert max_weight_gap(final, train_calls[0].weights_before) > 1e-3  # it learned: the check has teeth


def test_the_reference_copy_is_kept_only_for_a_kl_term(grpo_run, one_step_run, sft_run) -> None:
    """kl_coef > 0 keeps the frozen initial policy; kl_coef 0 and SFT hold no copy of it
    (a model's worth of memory) and never ask for reference logprobs."""
    for run, kept in ((grpo_run[0], True), (one_step_run[0], False), (sft_run[0], False)):
        assert (run.workers("policy")[0].impl.reference is not None) is kept
        if not kept:
            assert not [c for c in run.calls("policy", "get_logprobs") if c.kwargs.get("reference")]


def test_grpo_reference_logprobs_are_the_initial_policys(grpo_run) -> None:
    from transformers import AutoModelForCausalLM

    run, _, model_path = grpo_run
    initial = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    for step, call in enumerate(run.calls("policy", "train"), start=1):
        batch, extra, _ = call.args
        with torch.no_grad():
            ref = padded(token_logprobs(initial, batch, 1.0), batch.completion_mask.shape[1])
        mask = batch.completion_mask.bool()
        assert (extra["ref_logprobs"] - ref)[mask].abs().max() < 1e-5, step


def test_grpo_rollout_metrics_equal_a_recomputation_from_the_rollouts(grpo_run, tokenizer) -> None:
    run, cfg, _ = grpo_run
    g = cfg.grpo.completions_per_prompt
    for step, calls in enumerate(steps_of(run), start=1):
        prompts, out = calls[0].args[0], calls[0].result
        rewards = rollout_rewards(calls[0], tokenizer)
        groups = [rewards[i:i + g] for i in range(0, len(rewards), g)]
        expected = {
            "train/reward_mean": statistics.fmean(rewards),
            "train/accuracy": statistics.fmean(r == 1.0 for r in rewards),
            "train/completion_length": statistics.fmean(len(c) for c in out.completion_ids),
            "train/fraction_groups_kept": statistics.fmean(len(set(grp)) > 1 for grp in groups),
        }
        for key, value in expected.items():
            assert run.metrics[key][str(step)] == pytest.approx(value, abs=1e-6), (step, key)

        # the train batch: exactly the kept rollouts, in order, with their own group advantages
        batch, extra, _ = first(calls, "policy", "train").args
        rows = kept_rows(rewards, g)
        assert len(batch) == len(rows), step
        advantages = group_advantages(rewards, g)
        for b, i in enumerate(rows):
            p, n = int(batch.prompt_lens[b]), int(batch.completion_lens[b])
            assert batch.input_ids[b, :p].tolist() == prompts[i], (step, b)
            assert batch.input_ids[b, p:p + n].tolist() == out.completion_ids[i], (step, b)
            assert float(extra["advantages"][b]) == pytest.approx(advantages[i], abs=1e-4), (step, b)
        assert len({len(out.completion_ids[i]) for i in rows}) > 1, "no padding in this batch: the test is weak"


def test_grpo_engine_trainer_disagreement_is_measured_on_the_sampled_tokens(grpo_run, tokenizer) -> None:
    """``train/token_mult_prob_error``: the mean over real completion tokens of
    exp(|logp_engine - logp_trainer|), here exp(ENGINE_LOGPROB_SHIFT) up to float noise."""
    run, cfg, _ = grpo_run
    for step, calls in enumerate(steps_of(run), start=1):
        out, rewards = calls[0].result, rollout_rewards(calls[0], tokenizer)
        old = first(calls, "policy", "train_step").result[3]  # the old logprobs the step reported
        errors = []
        for b, i in enumerate(kept_rows(rewards, cfg.grpo.completions_per_prompt)):
            trainer = old[b, : len(out.logprobs[i])].tolist()
            errors += [math.exp(abs(e - t)) for e, t in zip(out.logprobs[i], trainer, strict=True)]
        assert run.metrics["train/token_mult_prob_error"][str(step)] == pytest.approx(statistics.fmean(errors),
                                                                                      rel=1e-5), step
        assert statistics.fmean(errors) == pytest.approx(math.exp(ENGINE_LOGPROB_SHIFT), rel=1e-4)


def test_grpo_probe_metrics_compare_the_engine_with_the_trainer(grpo_run) -> None:
    run, _, _ = grpo_run
    for step, calls in enumerate(steps_of(run), start=1):
        score = first(calls, "generation", "score")
        # the probe batch, scored after the refit over the whole vocabulary (validation's call is not)
        trainer_calls = [c for c in calls if c.role == "policy" and c.method == "get_logprobs"
                         and c.kwargs.get("whole_vocab")]
        trainer = trainer_calls[-1].result
        gaps = [abs(e - float(t)) for row, t_row in zip(score.result, trainer, strict=True)
                for e, t in zip(row, t_row[: len(row)], strict=True)]
        assert run.metrics["train/refit_logprob_error"][str(step)] == pytest.approx(statistics.fmean(gaps), rel=1e-5)
        assert statistics.fmean(gaps) == pytest.approx(PROBE_LOGPROB_SHIFT, rel=1e-3)
        assert run.metrics["train/refit_token_mult_prob_error"][str(step)] == pytest.approx(
            statistics.fmean(math.exp(x) for x in gaps), rel=1e-5)


def test_grpo_validation_accuracy_is_the_fraction_of_right_answers(grpo_run, tokenizer) -> None:
    run, _, _ = grpo_run
    greedy = [c for c in run.recorder.calls if c.method == "generate" and c.kwargs["params"].greedy]
    assert sorted(run.metrics["val/accuracy"], key=int) == ["0", "3"] and len(greedy) == 2
    for step, call in zip(("0", "3"), greedy, strict=True):
        texts = tokenizer.batch_decode(call.result.completion_ids, skip_special_tokens=True)
        answers = [str(eval_sum(tokenizer.decode(p))) for p in call.args[0]]
        expected = statistics.fmean(math_reward(t, a) for t, a in zip(texts, answers, strict=True))
        assert run.metrics["val/accuracy"][step] == pytest.approx(expected)
        assert expected == pytest.approx(3 / 9)  # every third of the 9 held-out problems


def test_grpo_validation_sampling_accuracy_is_the_probability_of_the_reference_answers(grpo_run, tokenizer) -> None:
    """``val/sampling_accuracy`` at a step = the mean over held-out problems of the probability that the
    policy, with that step's weights, samples exactly the reference answer and EOS (recomputed here
    by a plain forward per problem, the prompts taken from the engine's validation calls)."""
    from transformers import AutoModelForCausalLM

    run, cfg, model_path = grpo_run
    greedy = [c for c in run.recorder.calls if c.method == "generate" and c.kwargs["params"].greedy]
    weights_at = {"0": run.calls("policy", "train")[0].weights_before,
                  "3": run.workers("policy")[0].impl.get_weights()}
    assert sorted(run.metrics["val/sampling_accuracy"], key=int) == ["0", "3"]
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    values = {}
    for (step, weights), call in zip(weights_at.items(), greedy, strict=True):
        model.load_state_dict(weights)
        probabilities = []
        for prompt in call.args[0]:
            answer = tokenizer.encode(str(eval_sum(tokenizer.decode(prompt)))) + [tokenizer.eos_token_id]
            ids = torch.tensor([list(prompt) + answer])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / cfg.generation.temperature
            probabilities.append(math.exp(float(logits.log_softmax(-1)[torch.arange(len(answer)),
                                                                      torch.tensor(answer)].sum())))
        values[step] = statistics.fmean(probabilities)
        # both sides in this process, fp32: float rounding (the sum's order), not a machine-dependent spread
        assert run.metrics["val/sampling_accuracy"][step] == pytest.approx(values[step], rel=1e-4), step
    assert values["3"] != pytest.approx(values["0"], rel=1e-3)  # the weights moved: a value frozen at step 0 fails


@pytest.fixture(scope="module")
def sft_run(tiny_model_path, tmp_path_factory, tokenizer):
    from in_process import InProcess

    overrides = [f"model.path={tiny_model_path}", f"logger.log_dir={tmp_path_factory.mktemp('sft')}",
                 "sft.num_steps=3", "sft.batch_size=8", "sft.val_period=2", "sft.val_loss_size=6",
                 "data.arithmetic.num_val=9", "policy.lr=1e-2", "policy.warmup_steps=0",
                 "generation.refit_probe.max_logprob_error=0.1",
                 "policy.train_global_batch_size=4", "policy.train_micro_batch_size=2"]
    # the first train call held DELAY_S (step_timing.py)
    run = InProcess().run(sft, SFT_YAML, overrides, {**engine_transforms(tokenizer), ("policy", "train"): hold_first()})
    yield run, run.cfg, tiny_model_path


def test_sft_train_step_metrics_equal_an_independent_replay(sft_run) -> None:
    from transformers import AutoModelForCausalLM

    run, cfg, model_path = sft_run
    replay = ReplayTrainer(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32),
                           TrainerSpec.of(cfg, "sft"))
    for step, call in enumerate(run.calls("policy", "train"), start=1):
        batch, extra, _ = call.args
        assert max_weight_gap(call.weights_before, replay.weights()) < WEIGHT_TOLERANCE, f"step {step}: weights drifted"
        metrics = replay.train(batch, extra)
        assert metrics["num_optimizer_steps"] == 2
        logged = logged_at(run, step)
        assert_metrics_match(logged, metrics, f"step {step}")


def test_sft_validation_loss_is_the_nll_of_the_held_out_solutions(sft_run) -> None:
    from transformers import AutoModelForCausalLM

    run, _, model_path = sft_run
    policy = run.workers("policy")[0].impl
    trains = run.calls("policy", "train")
    weights_at = {"0": trains[0].weights_before, "2": trains[2].weights_before, "3": policy.get_weights()}
    val_calls = [c for c in run.calls("policy", "get_logprobs") if len(c.args[0]) == 6]
    assert sorted(run.metrics["val/loss"], key=int) == ["0", "2", "3"] and len(val_calls) == 3
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    for (step, weights), call in zip(weights_at.items(), val_calls, strict=True):
        model.load_state_dict(weights)
        with torch.no_grad():
            logprobs = torch.cat(token_logprobs(model, call.args[0], 1.0))
        assert run.metrics["val/loss"][step] == pytest.approx(-float(logprobs.mean()), rel=1e-5), step


def test_grpo_and_sft_timings_measure_each_step_alone(grpo_run, sft_run) -> None:
    """Each step's ``timing/*`` measure that step, not the run so far (``step_timing.py``): the
    phases add up to at most ``timing/step``, which is at most the time between the step's log and
    the previous one; the first train call was held, and counts in step 1's train phase only."""
    for run, loop in ((grpo_run[0], "grpo"), (sft_run[0], "sft")):
        assert_each_step_timed_alone(run, loop)
        assert at(run, "timing/train", 1) >= DELAY_S, loop
