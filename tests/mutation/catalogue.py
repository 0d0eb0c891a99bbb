"""Catalogue of mutants: deliberately broken variants of posttrain that train *silently*.

Each mutant is an exact text replacement in one library file. The runner
(``run_mutants.py``) applies it to a temporary copy of the repository and fails loudly when
an anchor is not found exactly once, so a refactor cannot quietly turn a mutant into a no-op:
update the anchor instead. Keep anchors small (one expression) so edits elsewhere in the
file leave them valid.

``first`` lists the tests expected to catch the mutant; the runner runs them first and falls
back to the mutant's whole tier, so a stale hint costs time, never a wrong verdict. ``tier``
is where it must be caught: ``default`` (the README's test command and its slow tests,
``--slow-only``, both run by .ci/run), ``vllm`` (``--vllm-only``, on the real engine) or
``mcore`` (``--mcore-only``: megatron-core on 2 GPUs). ``klass`` is its silent-failure class
(the table in docs/testing.md). Add a mutant whenever a new silent-failure mode is found, and a
test that catches it. ``tests/unit/test_mutation_catalogue.py`` checks every anchor still
matches the sources.
"""

from __future__ import annotations

from dataclasses import dataclass

LEARNING = "tests/integration/test_grpo_learning.py"
PLUMBING = "tests/integration/test_config_plumbing.py::test_config_key_reaches_its_code"
READERS = "tests/unit/test_config_readers.py"
LOOP_METRICS = "tests/integration/test_loop_metrics.py"
STEP_METRICS = "tests/integration/test_step_metrics.py"
NAN = "tests/unit/testing/test_nan_reaches_a_verdict.py"
LOOP_DATA = "tests/integration/test_loop_data.py"
SFT_TOKENS = "tests/integration/test_sft_tokens.py"
VLLM_TESTS = "tests/unit/models/generation/test_vllm_generation.py"
VLLM_WORKER = "posttrain/models/generation/vllm/vllm_generation_worker.py"
MCORE_TESTS = "tests/unit/models/megatron/test_megatron_policy.py"
LAYER_SPEC_TESTS = "tests/unit/models/megatron/test_layer_specs.py"
MCORE_RESUME = "tests/unit/models/megatron/test_megatron_resume.py"
RESUME = "tests/integration/test_checkpoint_resume.py"
LOSSES = "tests/unit/algorithms/test_loss_functions.py"
ADVANTAGES = "tests/unit/algorithms/test_advantages.py"
LORA = "tests/unit/models/policy/test_lora.py"
LORA_LAYER = "posttrain/models/policy/lora.py"
HF_WORKER = "posttrain/models/policy/hf_policy_worker.py"
HF_WORKER_TESTS = "tests/unit/models/policy/test_hf_policy_worker.py"
DP_POLICY = "tests/unit/models/policy/test_lm_policy_data_parallel.py"
DP_POLICY_STEP = f"{DP_POLICY}::test_two_ranks_take_the_single_workers_optimizer_steps"
DP_POLICY_ROW_ORDER = f"{DP_POLICY}::test_the_old_logprobs_come_back_in_the_batchs_row_order"
DP_POLICY_REFIT = f"{DP_POLICY}::test_a_refit_sends_the_whole_model_the_checkpoint_holds"
DP_POLICY_RESUME = f"{DP_POLICY}::test_a_resume_takes_the_uninterrupted_policys_next_step_and_refuses_another_size"
ASYNC = "tests/integration/test_async_grpo.py"
ASYNC_KEYS = "tests/integration/test_async_grpo_keys_and_errors.py"
DATA_PARALLEL = "tests/integration/test_data_parallel"  # .py, _resume.py, _refit.py
ROLLOUT_TESTS = "tests/unit/rollouts"
MCORE_WORKER = "posttrain/models/policy/megatron_policy_worker.py"
EDGES = "tests/unit/testing/rules/test_rule_edges.py"
DOMAINS = "tests/unit/testing/rules/test_rule_domains.py"
RESULTS = "tests/unit/testing/harness/test_harness_results.py"
TRACKER = "tests/unit/testing/harness/test_harness_tracker.py"
SKIPS = "tests/unit/testing/harness/test_harness_skips.py"
BUDGET = "tests/unit/testing/harness/test_harness_budget.py"
SAMPLING_TESTS = "tests/unit/models/generation/test_sampling_distribution.py"
PRECISION_TESTS = "tests/unit/models/policy/test_precision.py"
MCORE_GEN_TESTS = "tests/unit/models/megatron/test_megatron_generation.py"
MCORE_IN_PLACE_TESTS = "tests/unit/models/megatron/test_megatron_in_place.py"
IN_PLACE = "posttrain/models/generation/megatron/in_place.py"
MCORE_SAMPLER = "posttrain/models/megatron/inference.py"
BISECT = "posttrain/testing/git_bisect.py"
BISECT_TESTS = "tests/unit/testing/test_bisect.py"
REPORT_TESTS = "tests/unit/testing/test_check_report.py"
REPORT_PLOTS = "posttrain/testing/report/plots.py"
REPORT_SPEC = "posttrain/testing/report/plot_spec.py"
CALIBRATE = "posttrain/testing/calibrate.py"
CALIBRATE_TESTS = "tests/unit/testing/test_calibrate.py"
COMPARISONS = "posttrain/testing/rules/comparisons.py"
RECORDING = "posttrain/algorithms/rollout_recording.py"
RECORDING_FORMAT = ("tests/unit/algorithms/test_rollout_recording_format.py::"
                    "test_anything_but_a_recording_of_this_runs_shape_is_one_line_naming_the_file")
COMPARISON_TESTS = "tests/unit/testing/rules/test_rule_comparisons.py"
TREND = "posttrain/testing/trend.py"
TREND_TESTS = "tests/unit/testing/test_trend.py"
NODE_PLACEMENT = "tests/unit/distributed/test_node_placement.py"
STEP_TIME = "tests/unit/models/policy/test_reference_timing.py"
MICRO_LOSS = "            loss, metrics = self._micro_loss(mb, logprobs, entropy, loss_fn, num_tokens, forward_old)\n"
MULTINODE = "tests/integration/test_multinode.py"
DP_STEP = f"{DATA_PARALLEL}.py::test_two_data_parallel_ranks_take_the_single_workers_step"
DP_FAULT = (f"{DATA_PARALLEL}.py::test_a_call_of_several_optimizer_steps_scores_and_returns_the_old_logprobs_in_"
            "row_order")
LOOP_TIMING = f"{LOOP_METRICS}::test_grpo_and_sft_timings_measure_each_step_alone"
ASYNC_TIMING = f"{ASYNC}::test_async_timings_and_counts_measure_each_step_alone"

# The silent-failure classes (docs/testing.md): "training" is the math of a GRPO step (issue 5);
# the others are the classes of issue 12.
CLASSES = ("training", "config", "metrics", "nan", "leakage", "sft-tokens", "stale-engine", "prompts", "megatron",
           "resume", "lora", "async", "precision",
           # issue 31: the behaviour distribution (class 2), a check that covers one engine of several
           # (3), the rule engine's edges (7), the harness's own records (8), the same bug in
           # another place (9); classes 1, 4, 5 and 6 extend resume, precision, config and prompts
           "sampling", "one-of-several", "rules", "harness", "same-bug-elsewhere",
           # issue 34: a recorded run and its replay that differ (what was sampled, scored or trained on)
           "replay",
           # issue 33: an engine whose samples, logprobs or weights are not the policy's
           "megatron-generation",
           # issue 36: a report (check-metrics --report) whose picture is not what was judged; bounds
           # recommended from healthy runs that are not where the stated false-alarm rate puts them
           # (check-metrics calibrate); a drift check that cannot see a run move from its history
           "report", "calibration", "drift",
           # issue 37: workers placed elsewhere than asked, or said to be where they are not
           "placement",
           # issue 36: a train step that got slower, or a step-time gate that cannot see it
           "performance",
           # a rule's comparison read by a tool other than the checker (calibration, margins, the report's
           # plot) on another side of the bound or with another strictness than the checker decides it
           "comparison",
           # a file the run reads back (a recording, a checkpoint) accepted with more items than it promises:
           # a count checked one way
           "one-sided-format",
           # a token prefix checked by its length, not its content (the SFT prompt, a replayed prompt)
           "prefix",
           # an outside catalogue's survivors: a global quantity (a metric, a norm, a decision) taken
           # from one data-parallel rank's shard or share; a per-step metric read from a running total
           "global-from-shard", "running-counter")


@dataclass(frozen=True)
class Mutant:
    """One silent failure.

    Attributes:
        name: short identifier (``--only NAME``).
        description: the silent failure it models, one line.
        path: the file to patch, relative to the repository root.
        replacements: ``(old, new)`` pairs; each ``old`` must occur exactly once in ``path``.
        first: pytest node ids (files or tests) most likely to catch it, run first.
        klass: its silent-failure class, one of ``CLASSES``.
        tier: ``default``, ``vllm`` or ``mcore`` (GPUs), the tier that must catch it.
        gpus: the GPUs its tier needs to judge it (an ``mcore`` mutant: 2 unless its tests,
            and the tier's fallback it may reach, need fewer).
    """

    name: str
    description: str
    path: str
    replacements: tuple[tuple[str, str], ...]
    first: tuple[str, ...] = ()
    klass: str = "training"
    tier: str = "default"
    gpus: int | None = None

    @property
    def gpus_needed(self) -> int:
        """``gpus``, else 2 for the mcore tier and 0 for the CPU tiers."""
        return self.gpus if self.gpus is not None else (2 if self.tier == "mcore" else 0)


MUTANTS: tuple[Mutant, ...] = (
    Mutant("advantage_sign_flipped", "advantages are mean - reward: the policy learns to be wrong",
           "posttrain/algorithms/advantages.py",
           (("centered = grouped - grouped.mean(dim=1, keepdim=True)",
             "centered = grouped.mean(dim=1, keepdim=True) - grouped"),),
           ("tests/unit/algorithms/test_advantages.py", f"{LEARNING}::test_high_reward_completion_gains_probability")),
    Mutant("advantages_zeroed", "every advantage is 0: the loss and its gradient vanish, nothing is learned",
           "posttrain/algorithms/advantages.py",
           (("return (centered / (std + eps)).reshape(-1)", "return (0 * centered / (std + eps)).reshape(-1)"),),
           (ADVANTAGES, f"{LEARNING}::test_high_reward_completion_gains_probability")),
    Mutant("advantages_over_whole_batch", "advantages normalized over the whole batch instead of per prompt group",
           "posttrain/algorithms/advantages.py",
           (("centered = grouped - grouped.mean(dim=1, keepdim=True)", "centered = grouped - grouped.mean()"),
            ("std = grouped.std(dim=1, keepdim=True)", "std = grouped.std()")),
           ("tests/unit/algorithms/test_advantages.py", f"{LEARNING}::test_group_advantages_are_isolated_per_prompt")),
    Mutant("group_size_off_by_one", "each prompt sampled G+1 times, advantages grouped by G: groups straddle prompts",
           "posttrain/algorithms/grpo_step.py",
           (("g = cfg.grpo.completions_per_prompt", "g = cfg.grpo.completions_per_prompt + 1"),),
           (f"{LEARNING}::test_rollouts_come_in_contiguous_groups_of_one_prompt",)),
    Mutant("prompt_lens_off_by_one", "the train step scores tokens one position late (prompt_lens + 1)",
           "posttrain/models/policy/base_policy_worker.py",
           (("compute_logprobs_and_entropy(logits, batch.input_ids, batch.prompt_lens, width",
             "compute_logprobs_and_entropy(logits, batch.input_ids, batch.prompt_lens + 1, width"),),
           (f"{LEARNING}::test_first_update_reads_the_loss_and_ratio_at_one",)),
    Mutant("loss_mask_includes_padding", "the policy-gradient loss is summed over padding tokens too",
           "posttrain/models/policy/base_policy_worker.py",
           (('{"completion_mask": mb.batch.completion_mask,',
             '{"completion_mask": torch.ones_like(mb.batch.completion_mask),'),),
           (f"{LEARNING}::test_first_update_reads_the_loss_and_ratio_at_one",)),
    Mutant("loss_mask_drops_last_token", "the completion mask drops each completion's last token (EOS never trained)",
           "posttrain/data/batch.py",
           (("torch.arange(completion_len) < c_lens[:, None]", "torch.arange(completion_len) < c_lens[:, None] - 1"),),
           ("tests/unit/data/test_make_batch.py",)),
    Mutant("kl_against_current_policy", "reference logprobs come from the current policy: the KL penalty never binds",
           "posttrain/models/policy/base_policy_worker.py",
           (("yield self.reference if reference else self.model", "yield self.model"),),
           (f"{LEARNING}::test_reference_policy_stays_frozen",
            f"{LEARNING}::test_larger_kl_coefficient_stays_closer_to_the_reference")),
    Mutant("ratio_clipping_disabled", "the probability ratio is never clipped: updates are unbounded",
           "posttrain/algorithms/loss_functions.py",
           (("clipped = ratio.clamp(1.0 - self.clip_eps, 1.0 + self.clip_eps)", "clipped = ratio"),),
           (f"{LEARNING}::test_tokens_outside_the_clip_range_get_no_update", LOSSES)),
    Mutant("refit_skipped", "the GRPO loop never syncs weights to the generation engine: it samples the initial policy",
           "posttrain/algorithms/grpo.py",
           # a call to a no-op that returns no probe metrics: fits `refit(...)` with or without the probe
           (("refit(rt.policy, rt.engine", "(lambda *args: {})(rt.policy, rt.engine"),),
           ("tests/integration/test_grpo_loop_refit.py::"
            "test_in_this_process_the_engine_scores_like_the_trainer_after_each_refit",
            "tests/integration/test_grpo_loop_refit.py::test_engine_scores_like_the_trainer_on_every_step")),
    Mutant("grads_zeroed_before_step", "gradients are zeroed between backward and the optimizer step: nothing moves",
           "posttrain/models/policy/hf_policy_worker.py",
           (("self.optimizer.step()", "self.optimizer.zero_grad(set_to_none=False); self.optimizer.step()"),),
           (f"{LEARNING}::test_high_reward_completion_gains_probability",)),
    Mutant("learning_rate_ignored", "the optimizer is built without the configured lr (torch's default 1e-3)",
           "posttrain/models/policy/hf_policy_worker.py",
           (('lr=cfg.lr, weight_decay', "weight_decay"),),
           (f"{LEARNING}::test_learning_rate_sets_the_update_size",)),
    Mutant("reward_from_wrong_sample", "each completion is judged against the next rollout's problem",
           "posttrain/algorithms/grpo_step.py",
           (("zip(texts, rollouts.problems, strict=True)",
             "zip(texts, rollouts.problems[1:] + rollouts.problems[:1], strict=True)"),),
           (f"{LEARNING}::test_each_reward_is_judged_against_its_own_problem",)),
    # beyond the issue's list
    Mutant("engine_ignores_weights", "the generation engine takes the new weight version but keeps its old weights",
           "posttrain/models/generation/hf_generation_worker.py",
           (("            state[name].copy_(tensor)", "            pass"),),
           ("tests/unit/algorithms/test_runtime_refit.py",)),
    Mutant("logits_not_shifted", "completion token j is scored by the logits at its own position, not the one before",
           "posttrain/ops.py",
           (("positions = completion_positions(prompt_lens, completion_len, seq_len) - 1",
             "positions = completion_positions(prompt_lens, completion_len, seq_len)"),),
           ("tests/unit/test_ops.py",)),
    Mutant("trainer_ignores_temperature", "the trainer scores tokens at temperature 1 while the engine samples at T",
           "posttrain/ops.py",
           (("selected = completion_logits(logits, prompt_lens, completion_len).float() / temperature",
             "selected = completion_logits(logits, prompt_lens, completion_len).float()"),),
           ("tests/unit/test_ops.py",)),
    Mutant("dr_grpo_std_normalized", "Dr. GRPO advantages are still divided by the group std",
           "posttrain/algorithms/advantages.py",
           (("return centered.reshape(-1)",
             "return (centered / (grouped.std(dim=1, keepdim=True) + eps)).reshape(-1)"),),
           (ADVANTAGES, f"{LEARNING}::test_dr_grpo_advantages_are_mean_centred_and_learn")),
    Mutant("keeps_zero_variance_groups_only", "the zero-variance filter is inverted: only groups with no signal train",
           "posttrain/algorithms/grpo_step.py",
           (("keep = varied if varied.any() else keep", "keep = ~varied if varied.any() else keep"),),
           (f"{LEARNING}::test_group_advantages_are_isolated_per_prompt",)),
    Mutant("ratio_against_itself", "old logprobs replaced by the current ones: the ratio is always 1, never clipped",
           "posttrain/algorithms/loss_functions.py",
           (('logprobs - data["old_logprobs"]', "logprobs - logprobs.detach()"),),
           (f"{LEARNING}::test_tokens_outside_the_clip_range_get_no_update", LOSSES)),
    Mutant("fused_old_logprobs_keep_grad", "one-step train calls take old = the forward's logprobs undetached: "
           "the ratio's gradient is 0, nothing learns",
           "posttrain/models/policy/base_policy_worker.py",
           # the loss's old logprobs (the data-parallel review moved them off forward_old, which only
           # returns them: the anchor there had become an equivalent mutant, passed by its test)
           (('data.setdefault("old_logprobs", logprobs.detach())', 'data.setdefault("old_logprobs", logprobs)'),),
           (f"{LOOP_METRICS}::test_one_optimizer_step_scores_the_old_policy_in_its_train_forward",)),
    Mutant("old_logprobs_from_updated_weights", "a train call of several optimizer steps takes each step's old "
           "logprobs from its own forward: later steps' ratios are 1 against already-updated weights",
           "posttrain/models/policy/base_policy_worker.py",
           (("from_forward = scores_old and len(step_rows) == 1", "from_forward = scores_old"),),
           (f"{LOOP_METRICS}::test_grpo_train_step_metrics_equal_an_independent_replay",)),
    Mutant("padding_ratio_not_masked", "padding's log-ratio is exponentiated before masking: exp(inf) * 0 = NaN",
           "posttrain/algorithms/loss_functions.py",
           (('torch.where(mask > 0, logprobs - data["old_logprobs"], torch.zeros_like(logprobs))',
             'logprobs - data["old_logprobs"]'),),
           (f"{LEARNING}::test_loss_and_gradients_stay_finite", "tests/unit/algorithms/test_loss_functions.py")),
    # --- issue 12: config plumbing -------------------------------------------------------
    Mutant("kl_coef_ignored", "the loop builds its loss without grpo.kl_coef: the KL penalty never acts",
           "posttrain/algorithms/grpo.py",
           (("ClippedPGLoss(clip_eps=cfg.grpo.clip_eps, kl_coef=cfg.grpo.kl_coef)",
             "ClippedPGLoss(clip_eps=cfg.grpo.clip_eps)"),),
           (f"{PLUMBING}[grpo.kl_coef]",), klass="config"),
    Mutant("reference_copy_always_built", "the policy worker ignores reference=false: a kl_coef 0 run holds a "
           "second copy of the model it never reads",
           HF_WORKER, (("elif cfg.reference:", "elif True:"),),
           (f"{LOOP_METRICS}::test_the_reference_copy_is_kept_only_for_a_kl_term",
            "tests/unit/models/policy/test_reference_policy.py"), klass="config"),
    Mutant("sampling_temperature_ignored", "rollouts are sampled at temperature 1 whatever generation.temperature says",
           "posttrain/algorithms/grpo_step.py",
           (("temperature=gen.temperature, top_p", "temperature=1.0, top_p"),),
           (f"{PLUMBING}[generation.temperature]",), klass="config"),
    Mutant("weight_decay_ignored", "AdamW is built without policy.weight_decay",
           "posttrain/models/policy/hf_policy_worker.py",
           (('weight_decay=cfg.weight_decay', "weight_decay=0.0"),),
           (f"{PLUMBING}[policy.weight_decay]",), klass="config"),
    Mutant("zero_variance_filter_always_on", "grpo.drop_zero_variance_groups=false still drops the groups",
           "posttrain/algorithms/grpo_step.py",
           (("if cfg.drop_zero_variance_groups:", "if True:"),),
           (f"{PLUMBING}[grpo.drop_zero_variance_groups]",), klass="config"),
    # --- issue 12: metrics that lie ------------------------------------------------------------
    Mutant("entropy_over_padding", "train/entropy sums the padding positions' entropy too",
           "posttrain/models/policy/base_policy_worker.py",
           (('metrics["entropy"] = (masked_sum(entropy, mb.batch.completion_mask) / num_tokens).item()',
             'metrics["entropy"] = (entropy.sum() / num_tokens).item()'),),
           (f"{STEP_METRICS}", f"{LOOP_METRICS}::test_grpo_train_step_metrics_equal_an_independent_replay"),
           klass="metrics"),
    Mutant("ratio_min_over_padding", "train/probs_ratio_min also reads padding, where the ratio is 1",
           "posttrain/algorithms/loss_functions.py",
           (('"probs_ratio_min": ratio[real].min().item() if real.any() else 1.0,',
             '"probs_ratio_min": ratio.min().item(),'),),
           (f"{STEP_METRICS}",), klass="metrics"),
    Mutant("token_mult_prob_error_self_compared", "the engine/trainer error compares the trainer with itself: always 1",
           "posttrain/algorithms/grpo_step.py",
           (("token_mult_prob_error(gen_logprobs, trained.old_logprobs,",
             "token_mult_prob_error(trained.old_logprobs, trained.old_logprobs,"),),
           (f"{LOOP_METRICS}::test_grpo_engine_trainer_disagreement_is_measured_on_the_sampled_tokens",),
           klass="metrics"),
    Mutant("pack_kl_must_move_dropped", "the grpo pack no longer fails a KL that never moves",
           "posttrain/testing/rules/packs.py",
           (('_moves("train/entropy"), _moves("train/kl", optional=True),', '_moves("train/entropy"),'),),
           ("tests/unit/testing/rules/test_rule_packs.py",), klass="metrics"),
    Mutant("std_of_constant_not_zero", "std takes fsum/n as the mean: a frozen metric's std is a rounding error > 0",
           "posttrain/testing/rules/helpers.py",
           (("    m = exact_mean(vals)", "    m = math.fsum(vals) / len(vals)"),),
           ("tests/unit/testing/rules/test_rule_packs.py", "tests/unit/testing/test_check_metrics.py"),
           klass="metrics"),
    # --- issue 12: NaN that never reaches a verdict --------------------------------------------------
    Mutant("tensorboard_nan_as_zero", "the logger writes 0.0 to TensorBoard for a NaN or infinite value",
           "posttrain/utils/logger.py",
           (("self.writer.add_scalar(name, value, step)",
             "self.writer.add_scalar(name, value if math.isfinite(value) else 0.0, step)"),),
           (f"{NAN}::test_a_non_finite_value_fails_the_checks_through_tensorboard",), klass="nan"),
    Mutant("tb_dump_clamps_inf", "the TensorBoard dump turns +-inf into +-3.4e38 (NaN kept)",
           "posttrain/testing/tb_to_json.py",
           (("return float(str(np.float32(value)))",
             "return float(str(np.nan_to_num(np.float32(value), nan=np.nan)))"),),
           (f"{NAN}::test_a_non_finite_value_fails_the_checks_through_tensorboard",), klass="nan"),
    Mutant("finite_scan_skips_first_step", "the rule engine's finiteness scan starts at the second step",
           "posttrain/testing/rules/series.py",
           (("if not all(map(math.isfinite, self.step_values)):",
             "if not all(map(math.isfinite, self.step_values[1:])):"),),
           (f"{NAN}::test_a_non_finite_value_fails_the_checks_on_the_logger_json",), klass="nan"),
    Mutant("logger_floors_negative_inf", "the logger writes -inf as -3.4e38 in both files",
           "posttrain/utils/logger.py",
           (("value = float(value)", "value = max(float(value), -3.4e38)"),),
           (f"{NAN}::test_a_non_finite_value_fails_the_checks_on_the_logger_json",), klass="nan"),
    # --- issue 12: held-out leakage ---------------------------------------------------------------
    Mutant("validation_on_training_problems", "the evaluation before training scores training problems",
           "posttrain/algorithms/grpo.py",
           (("logger.log(validate(rt, val_problems, cfg), step=0)",
             "logger.log(validate(rt, train_problems[:len(val_problems)], cfg), step=0)"),),
           (f"{LOOP_DATA}::test_grpo_on_arithmetic_trains_on_every_training_problem_and_validates_on_none",),
           klass="leakage"),
    Mutant("gsm8k_validation_from_train_file", "GSM8K's held-out problems are read from the training file",
           "posttrain/data/datasets.py",
           (("load_gsm8k(cfg.gsm8k_val_path)", "load_gsm8k(cfg.gsm8k_train_path)"),),
           (f"{LOOP_DATA}::test_gsm8k_loaders_take_validation_from_the_test_file_only",), klass="leakage"),
    Mutant("held_out_problems_in_training", "the training pool also holds the held-out problems",
           "posttrain/data/datasets.py",
           (("    return train, val[: cfg.max_val] if cfg.max_val else val",
             "    return train + val, val[: cfg.max_val] if cfg.max_val else val"),),
           (f"{LOOP_DATA}::test_arithmetic_loaders_split_train_and_validation_disjointly",), klass="leakage"),
    # --- issue 12: SFT trained on the wrong tokens ---------------------------------------------------
    Mutant("sft_on_final_answer_only", "SFT trains on the final answer, not the worked solution (GSM8K)",
           "posttrain/algorithms/evaluation.py",
           (("chat.sft_example(p.question, p.solution)", "chat.sft_example(p.question, p.answer)"),),
           (f"{LOOP_DATA}::test_sft_on_gsm8k_trains_on_the_worked_solution_not_just_the_final_answer",),
           klass="sft-tokens"),
    Mutant("sft_eos_not_trained", "SFT drops the EOS from the trained tokens: the model never learns to stop",
           "posttrain/algorithms/evaluation.py",
           (("[c for _, c in pairs], chat.tokenizer.pad_token_id)",
             "[c[:-1] for _, c in pairs], chat.tokenizer.pad_token_id)"),),
           (f"{SFT_TOKENS}", f"{LOOP_DATA}::test_sft_rows_train_on_each_problems_own_solution"), klass="sft-tokens"),
    Mutant("sft_prompt_token_trained", "the last prompt token ('=') is trained on as part of the response",
           "posttrain/data/chat.py",
           (("turn = full[len(prompt):]", "turn = full[len(prompt) - 1:]"),
            ("return prompt, tuple(turn[", "return prompt[:-1], tuple(turn[")),
           (f"{SFT_TOKENS}",), klass="sft-tokens"),
    # --- issue 12: an engine that keeps stale state ---------------------------------------------------
    Mutant("rollout_version_unchecked", "the loop trains on rollouts whatever weight version sampled them",
           "posttrain/algorithms/grpo_step.py",
           (("if rollouts.weight_version != trainer_version:", "if False:"),),
           (f"{LOOP_DATA}::test_rollouts_from_an_engine_on_another_weight_version_stop_the_run",),
           klass="stale-engine"),
    Mutant("refit_version_unchecked", "refit never compares the version the engines read back with the trainer's",
           "posttrain/weight_sync/refit.py",
           (("    if receipt.weight_version != version:", "    if False:"),),
           (f"{LOOP_DATA}::test_an_engine_reporting_a_stale_version_after_refit_stops_the_run",
            "tests/unit/algorithms/test_runtime_refit.py::test_an_engine_that_loads_nothing_fails_the_refits_version_check"),
           klass="stale-engine"),
    Mutant("refit_probe_scored_apart", "the engines' probe scores from the refit call are dropped and asked for again "
           "(two more round trips a step)", "posttrain/weight_sync/refit.py",
           (("trainer_probe, receipt.probe_logprobs)", "trainer_probe, None)"),),
           ("tests/unit/algorithms/test_runtime_refit.py::test_a_probed_refit_is_one_call_per_side",)),
    # issue 16: the broadcast refit (gloo on CPUs: every Ray test that refits goes through it)
    Mutant("broadcast_sends_empty_buckets", "the refit broadcast sends buckets it never filled (engines load garbage)",
           "posttrain/weight_sync/broadcast.py",
           (("                    slot.view(flat).copy_(weights[slot.name])", "                    pass"),),
           ("tests/unit/weight_sync/test_broadcast.py", "tests/unit/models/generation/test_refit_broadcast.py"),
           klass="stale-engine"),
    Mutant("broadcast_drops_tied_names", "the receivers never yield a tied name: vLLM's CPU lm_head copy goes stale",
           "posttrain/weight_sync/broadcast.py",
           (("            for slot in bucket.slots:\n                yield",
             "            for slot in [s for s in bucket.slots if not s.alias_of]:\n                yield"),),
           ("tests/unit/weight_sync/test_broadcast.py",), klass="stale-engine"),
    Mutant("prefix_cache_not_reset", "a refit loads the weights but keeps the KV blocks cached with the old ones",
           VLLM_WORKER,
           (("        cleared = self.llm.reset_prefix_cache()\n", "        cleared = True\n"),),
           (f"{VLLM_TESTS}::test_after_each_refit_prompts_sharing_a_cached_prefix_get_the_trainers_new_logprobs",),
           klass="stale-engine", tier="vllm"),
    Mutant("vllm_version_checked_against_itself", "the vLLM worker checks the engine's stamps against the label "
           "it reads back, not the version it was given", VLLM_WORKER,
           (("        expected = self.version\n", "        expected = self.weight_version()\n"),),
           (f"{VLLM_TESTS}::test_generate_refuses_an_engine_relabelled_behind_the_workers_back",),
           klass="stale-engine", tier="vllm"),
    Mutant("vllm_reports_remembered_version", "the vLLM worker reports the version it was given, not the engine label",
           VLLM_WORKER,
           (("        return int(self.llm.llm_engine.get_weight_version())\n", "        return self.version\n"),),
           (f"{VLLM_TESTS}::test_refit_fails_its_version_check_when_the_engine_drops_the_new_label",),
           klass="stale-engine", tier="vllm"),
    # --- issue 12: prompts reused across steps -------------------------------------------------------
    Mutant("grpo_same_prompts_every_step", "GRPO trains on the first step's prompts at every step",
           "posttrain/algorithms/grpo.py",
           (("generate_rollouts(rt.engine, rt.chat, sampler.batch(step), cfg, step)",
             "generate_rollouts(rt.engine, rt.chat, sampler.batch(1), cfg, step)"),),
           (f"{LOOP_DATA}::test_each_step_trains_on_new_prompts_and_an_epoch_covers_the_pool_once",),
           klass="prompts"),
    Mutant("sampler_stuck_at_first_batch", "the sampler returns an epoch's first batch at every step",
           "posttrain/data/sampler.py",
           (("start = (step - 1) % self.steps_per_epoch * self.batch_size", "start = 0"),),
           ("tests/unit/data/test_sampler.py",), klass="prompts"),
    Mutant("epoch_order_never_changes", "every epoch replays the first epoch's order",
           "posttrain/data/sampler.py",
           (("order = self._permutation(self.epoch_of(step))", "order = self._permutation(0)"),),
           ("tests/unit/data/test_sampler.py",), klass="prompts"),
    # --- issue 15: the Megatron policy (judged on 2 GPUs: --mcore-only) ---------------------------
    Mutant("megatron_tp_attributes_not_set", "GPTModel built without initialisation: no weight is tagged tensor-"
           "parallel, so the grad norm counts rank 0's shards only and clipping is too weak under TP",
           "posttrain/models/megatron/model.py", (("perform_initialization=True", "perform_initialization=False"),),
           (f"{MCORE_TESTS}::test_tensor_parallel_2_matches_the_hf_worker",), klass="megatron", tier="mcore"),
    Mutant("megatron_gate_up_swapped", "SwiGLU's gate and up projections swapped in the HF -> Megatron conversion",
           "posttrain/models/megatron/conversion.py", (("torch.cat([gate, up])", "torch.cat([up, gate])"),),
           (f"{MCORE_TESTS}::test_logits_equal_the_hf_models", "tests/unit/models/megatron/test_conversion.py"),
           klass="megatron", tier="mcore"),
    Mutant("megatron_warmup_ignored", "the Megatron worker trains at the full lr from the first step",
           MCORE_WORKER, (('return self.cfg.lr * (min', 'return self.cfg.lr * 1.0 or (min'),),
           (f"{MCORE_TESTS}::test_train_steps_equal_the_hf_workers",), klass="megatron", tier="mcore"),
    Mutant("megatron_reference_is_policy", "the Megatron reference model is the trained model: the KL never binds",
           MCORE_WORKER,
           (("load_local_state(self.reference, shard)",
             "load_local_state(self.reference, shard); self.reference = model"),),
           (f"{LEARNING}::test_reference_policy_stays_frozen",), klass="megatron", tier="mcore"),
    Mutant("megatron_nonfinite_step_taken", "a NaN gradient is applied: the weights turn NaN",
           MCORE_WORKER,
           (("        if math.isfinite(grad_norm):\n            for group",
             "        if True:\n            for group"),),
           (f"{MCORE_TESTS}::test_a_non_finite_gradient_skips_the_step_and_training_goes_on",), klass="megatron",
           tier="mcore"),
    Mutant("megatron_optimizer_state_not_restored", "load_checkpoint restores the weights but not Adam's moments",
           MCORE_WORKER, (('self.optimizer.load_state_dict(state["optimizer"])', "pass"),),
           (f"{MCORE_TESTS}::test_checkpoint_save_and_load_continue_exactly",), klass="megatron", tier="mcore"),
    Mutant("megatron_vocab_padding_in_softmax", "the zero rows that pad the vocabulary for TP get probability mass",
           "posttrain/models/megatron/model.py",
           (("return model(input_ids, positions, None)[..., :vocab_size]",
             "return model(input_ids, positions, None)"),),
           (f"{MCORE_TESTS}::test_tensor_parallel_2_matches_the_hf_worker",), klass="megatron", tier="mcore"),
    Mutant("megatron_qkv_bias_dropped", "the converter forgets Qwen2's q/k/v biases",
           "posttrain/models/megatron/conversion.py", (("qkv_bias=True,", "qkv_bias=False,"),),
           (f"{MCORE_TESTS}::test_weights_round_trip_hf_to_megatron_to_hf_bit_exact",), klass="megatron",
           tier="mcore"),
    # --- issue 13: a resumed run that is not the run it continues ----------------------------------
    Mutant("resume_without_optimizer_state", "a resumed run restores the weights but starts Adam's moments over",
           "posttrain/models/policy/hf_policy_worker.py",
           (('        self.optimizer.load_state_dict(state["optimizer"])', "        pass"),),
           (f"{RESUME}::test_a_resumed_run_logs_what_the_uninterrupted_run_logged",), klass="resume"),
    Mutant("resume_without_refit", "after a resume the engine samples from the initial weights until the next refit",
           "posttrain/algorithms/runtime.py",
           (("                refit(rt.policy, rt.generation, rt.probe)", "                pass"),),
           (f"{RESUME}::test_a_resumed_run_logs_what_the_uninterrupted_run_logged",), klass="resume"),
    Mutant("resume_keeps_dead_runs_steps", "metrics.json keeps what the interrupted run logged after its checkpoint",
           "posttrain/utils/logger.py", (("int(step) <= resume_step", "True"),),
           (f"{RESUME}::test_steps_logged_after_the_checkpoint_by_the_interrupted_run_are_dropped",), klass="resume"),
    Mutant("stop_without_checkpoint", "Ctrl-C stops the run without a checkpoint of the step it finished",
           "posttrain/algorithms/checkpointing.py",
           (("        saved = save(policy, run_cfg, step)\n    raise", "        pass\n    raise"),),
           ("tests/integration/test_interrupts.py::test_a_signal_mid_step_finishes_the_step_checkpoints_it_and_stops",),
           klass="resume"),
    Mutant("launchers_copy_aborts", "the launcher's copy of a Ctrl-C (uv run forwards the group's SIGINT 0.2 s "
           "later) counts as a second press: the run aborts with no checkpoint of the step it was on",
           "posttrain/utils/interrupts.py", (("SAME_INTERRUPT_S = 1.0", "SAME_INTERRUPT_S = 0.0"),),
           ("tests/integration/test_interrupts.py::test_a_launchers_copy_of_the_signal_does_not_abort",),
           klass="resume"),
    Mutant("shutdown_interruptible", "a late copy of the signal while Ray shuts down raises out of the entry point: "
           "a traceback and exit 1 instead of the closing line and 130", "posttrain/utils/cli.py",
           (("    except StopRequested as exc:\n        with signals_held():",
             "    except StopRequested as exc:\n        with contextlib.nullcontext():"),
            ("from posttrain.errors import PosttrainError",
             "import contextlib\n\nfrom posttrain.errors import PosttrainError")),
           ("tests/unit/utils/test_cli.py::test_a_late_copy_of_the_signal_while_the_run_shuts_down_leaves_the_stop_clean",),
           klass="resume"),
    Mutant("run_job_in_the_foreground", "the functional scripts run their job in the foreground: a SIGTERM to the "
           "script (or to uv run) kills the script and leaves the job training on, unstopped",
           "tests/functional/common.sh",
           (('  (trap - INT; exec python "$@") &\n  pid=$!\n', '  python "$@" & pid=$!; wait $pid\n'),),
           ("tests/unit/scripts/test_run_job.py::test_a_signal_to_the_script_stops_its_job_and_the_script_exits_with_"
            "the_jobs_status",
            "tests/integration/test_interrupts.py::test_a_functional_scripts_job_under_uv_run_stops_cleanly_and_the_"
            "script_exits_with_it"), klass="resume"),
    # --- issue 13: LoRA adapters that train, but not the model the engine or the user gets ------
    Mutant("lora_refit_without_adapters", "refit sends the base weights: the engine never serves what LoRA learned",
           LORA_LAYER, (("value = tensor + deltas[name] if name in deltas else tensor", "value = tensor"),),
           (f"{LORA}::test_merged_weights_are_w0_plus_scaled_ba_and_compute_what_the_adapted_model_computes",
            "tests/integration/test_grpo_loop_refit.py"), klass="lora"),
    Mutant("lora_reference_with_adapters", "the reference keeps the adapters on: the KL penalty never binds",
           HF_WORKER, (("with self.model.disable_adapter():", "with contextlib.nullcontext():"),),
           (f"{LORA}::test_the_reference_is_the_base_model",), klass="lora"),
    Mutant("lora_adapter_not_restored", "a resumed LoRA run restores Adam's state but not the adapter weights",
           HF_WORKER, (("set_peft_model_state_dict(self.model, adapter)",
                        "set_peft_model_state_dict(self.model, {})"),),
           (f"{LORA}::test_a_checkpoint_holds_the_adapter_only_and_resumes_exactly",
            f"{RESUME}::test_a_resumed_run_logs_what_the_uninterrupted_run_logged"), klass="lora"),
    Mutant("lora_export_unmerged", "the final export drops the adapters: the saved model is the base model",
           HF_WORKER, (("copy.deepcopy(self.model).merge_and_unload()", "copy.deepcopy(self.model).unload()"),),
           (f"{LORA}::test_the_export_is_a_plain_model_with_the_merged_weights",), klass="lora"),
    Mutant("lora_dropout_ignored", "policy.lora.dropout never reaches peft", LORA_LAYER,
           (('lora_dropout=cfg.dropout', "lora_dropout=0.0"),),
           (f"{LORA}::test_rank_alpha_and_dropout_reach_the_adapters",), klass="config"),
    # --- issue 18/14: one engine driver, an SFT run without an engine, Ray start-up -------------
    Mutant("engine_loads_a_partial_refit", "an engine takes a refit with a tensor missing and moves its version "
           "(the receiver's one check, for every engine and transport)",
           "posttrain/weight_sync/receiver.py",
           (("    if missing or unknown:", "    if False:"),),
           ("tests/unit/models/generation/test_refit_probe.py::test_hf_partial_refit_is_refused",
            "tests/unit/models/generation/test_toy_engine.py::"
            "test_the_receivers_strictness_holds_for_the_toy_engine_without_a_line_of_its_own",
            "tests/unit/models/generation/test_vllm_generation.py::"
            "test_a_partial_refit_is_refused_in_one_line_before_anything_loads"),
           klass="stale-engine"),
    Mutant("sft_starts_an_unused_engine", "SFT validating by loss only still starts (and reserves) a generation engine",
           "posttrain/algorithms/sft.py",
           (("with_generation=cfg.sft.val_accuracy", "with_generation=True"),),
           ("tests/integration/test_config_plumbing.py::test_config_key_reaches_its_code[sft.val_accuracy]",),
           klass="config"),
    Mutant("ray_start_timeout_not_retried", "a Ray start that timed out on a busy machine is not retried",
           "posttrain/distributed/ray_cluster.py",
           (("            if STARTUP_TIMEOUT not in str(exc):", "            if True:"),),
           ("tests/unit/distributed/test_init_ray_retries.py",), klass="config"),
    # --- issue 38: two GPUs ------------------------------------------------------------------------
    Mutant("colocated_engine_sees_every_gpu", "a worker that shares a bundle without reserving it (a colocated "
           "engine) sees every GPU of the node and runs on GPU 0, not on the policy's GPU",
           "posttrain/distributed/worker_group.py",
           (("                **({} if reserve else _shared_bundle_env(cluster, i)),\n", ""),),
           ("tests/unit/distributed/test_shared_bundle_devices.py::"
            "test_a_worker_that_reserves_nothing_is_given_its_bundles_gpus",
            "tests/unit/distributed/test_shared_bundle_devices.py"), klass="config"),
    Mutant("data_parallel_ranks_share_a_gpu", "policy.data_parallel_size=2 (or TP=2) on half a GPU each is accepted: "
           "Ray packs both ranks onto one device, where NCCL refuses the second",
           "posttrain/models/policy/lm_policy.py",
           (("    if ranks > 1 and 0 < gpus_per_worker < 1:", "    if False:"),),
           ("tests/unit/models/megatron/test_backend_checks.py",), klass="config"),
    # --- issue 35: chunked logprobs -----------------------------------------------------------------
    Mutant("logprob_chunk_tokens_ignored", "policy.logprob_chunk_tokens is read by nobody: the worker builds the full "
           "[B, S, V] logits anyway (the memory the key exists to save)",
           "posttrain/models/policy/hf_policy_worker.py",
           (("chunk = self.cfg.logprob_chunk_tokens or (", "chunk = 0 or ("),),
           ("tests/unit/models/policy/test_logprob_chunks.py",), klass="config"),
    Mutant("logprob_chunk_scores_the_previous_token", "each chunk of the chunked logprobs scores every position "
           "against the token before its own",
           "posttrain/ops.py",
           (("hidden[rows].to(compute_dtype), w, targets[rows], temperature,",
             "hidden[rows].to(compute_dtype), w, targets[rows].roll(1), temperature,"),),
           ("tests/unit/test_chunked_logprobs.py",), klass="training"),
    Mutant("logprob_chunks_ignore_the_temperature", "the chunked scoring takes logprobs at temperature 1 while the "
           "engine samples at T",
           "posttrain/models/policy/hf_policy_worker.py",
           (("chunk, self.cfg.temperature, top_k, top_p, with_entropy, compute_dtype)",
             "chunk, 1.0, top_k, top_p, with_entropy, compute_dtype)"),),
           ("tests/unit/models/policy/test_logprob_chunks.py",), klass="sampling"),
    Mutant("logprob_chunks_in_fp32_under_bf16_mixed", "under bf16-mixed the chunked scoring multiplies the output "
           "layer in fp32 while the full-logits path (autocast) does it in bf16: the trainer's logprobs move",
           "posttrain/models/policy/hf_policy_worker.py",
           (("compute_dtype = torch.bfloat16 if self.precision == \"bf16-mixed\" else None",
             "compute_dtype = None"),),
           ("tests/unit/models/policy/test_logprob_chunks.py::"
            "test_under_bf16_mixed_the_chunks_multiply_in_bf16_as_autocast_does",), klass="precision"),
    # --- issue 17: asynchronous GRPO -------------------------------------------------------------
    Mutant("filter_keeps_stale_samples", "the staleness filter keeps samples older than max_staleness",
           "posttrain/rollouts/filters.py",
           (("stale = current_version - group_version", "stale = False and current_version - group_version"),),
           (f"{ROLLOUT_TESTS}/test_staleness_filter.py",), klass="async"),
    Mutant("claim_not_exclusive", "a claim reads the oldest samples without taking them: the next claim gets them too",
           "posttrain/rollouts/buffer.py",
           (("taken = [self._unclaimed.popleft() for _ in range(n)]",
             "taken = [self._unclaimed[i] for i in range(n)]"),),
           (f"{ROLLOUT_TESTS}/test_rollout_buffer.py",), klass="async"),
    # --- issue 34: recorded rollouts ---------------------------------------------------------------
    Mutant("recording_rounds_the_logprobs", "the recording keeps 3 decimals of the engine's logprobs: a replay's "
           "engine/trainer agreement (and any ratio against the behaviour policy) is no longer the run's",
           "posttrain/algorithms/rollout_recording.py",
           (('"samples": [dict(s) for s in samples]}',
             '"samples": [{**s, "generation_logprobs": [round(x, 3) for x in s["generation_logprobs"]]} '
             'for s in samples]}'),),
           ("tests/integration/test_rollout_recording.py::"
            "test_a_replay_trains_exactly_as_the_recorded_run_and_starts_no_engine",), klass="replay"),
    Mutant("replay_repeats_the_first_step", "the replay trains every step on the first step's recorded rollouts",
           "posttrain/algorithms/grpo.py",
           (("recording.load_step(replay, step,", "recording.load_step(replay, 1,"),),
           ("tests/integration/test_rollout_recording.py::"
            "test_a_replay_trains_exactly_as_the_recorded_run_and_starts_no_engine",), klass="replay"),
    Mutant("recording_refuses_nothing", "a step file of another group size is replayed: advantages mix groups",
           "posttrain/algorithms/rollout_recording.py",
           (("    if shape != (num_prompts, completions_per_prompt):", "    if False:"),),
           ("tests/unit/algorithms/test_rollout_recording_format.py",), klass="replay"),
    Mutant("micro_batch_loss_normalised_per_micro_batch", "each micro-batch's loss is its own token mean, not "
           "its share of the global batch's: gradient accumulation sums k means (TRL issue 2617's bug)",
           "posttrain/models/policy/base_policy_worker.py",
           (("loss, metrics = loss_fn(logprobs, data, num_tokens)",
             "loss, metrics = loss_fn(logprobs, data, max(mb.batch.completion_mask.sum().item(), 1.0))"),),
           ("tests/integration/test_layout_parity.py",), klass="training"),
    Mutant("data_parallel_gradients_averaged", "the data-parallel ranks' gradients are averaged, not summed: "
           "each rank's loss is already its share of the global token mean, so the step is half the size",
           "posttrain/models/policy/hf_policy_worker.py",
           (("self.gradient_scale = float(self.data_parallel_size)", "self.gradient_scale = 1.0"),),
           (DP_POLICY_STEP, DP_STEP), klass="training"),
    Mutant("data_parallel_metrics_of_rank_0", "a data-parallel step reports rank 0's share of the metrics as the "
           "global batch's", "posttrain/models/policy/base_policy_worker.py",
           (("steps.append(self._reduce_over_ranks(step_metrics) if sharded else step_metrics)",
             "steps.append(step_metrics)"),),
           (DP_POLICY_STEP, DP_STEP), klass="metrics"),
    Mutant("data_parallel_loss_over_local_tokens", "each data-parallel rank normalises its loss by its own token "
           "count, not the global batch's", "posttrain/models/policy/base_policy_worker.py",
           (('max(self._across_ranks([batch.completion_mask[g_start:g_end].sum().item()], "sum")[0], 1.0)',
             "max(batch.completion_mask[g_start:g_end].sum().item(), 1.0)"),),
           (DP_POLICY_STEP, DP_STEP), klass="training"),
    Mutant("data_parallel_refit_sends_the_local_shard", "a data-parallel refit sends each rank's own shard of "
           "the weights, not the gathered model", "posttrain/models/policy/hf_policy_worker.py",
           (("        if self.data_parallel_size > 1:\n            return self._full_state()[0]\n", ""),),
           (DP_POLICY_REFIT,
            f"{DATA_PARALLEL}_refit.py::test_the_engine_serves_the_data_parallel_policys_weights_after_every_refit"),
           klass="stale-engine"),
    Mutant("data_parallel_resume_without_optimizer", "a data-parallel resume restores the weights but starts "
           "AdamW's moments afresh", "posttrain/models/policy/hf_policy_worker.py",
           (('optim_state_dict=state["optimizer_by_name"],',
             'optim_state_dict=__import__("torch.distributed.checkpoint.state_dict", fromlist=["_"])'
             '.get_optimizer_state_dict(self.model, self.optimizer),'),),
           (DP_POLICY_RESUME,
            f"{DATA_PARALLEL}_resume.py::test_a_data_parallel_run_resumes_exactly_and_refuses_another_size"),
           klass="resume"),
    Mutant("data_parallel_old_logprobs_in_rank_order", "the ranks' old logprobs are stacked in rank order, not put "
           "back in the batch's row order: the engine/trainer agreement compares other rows",
           "posttrain/models/policy/lm_policy.py",
           (("            for i, result in zip(index, results, strict=True):\n"
             "                old_logprobs[i] = result[3]",
             "            old_logprobs = torch.cat([r[3] for r in results])"),),
           (DP_POLICY_ROW_ORDER, DP_FAULT), klass="metrics"),
    Mutant("claim_ignores_the_timeout_key",
           "the trainer's claim waits the 600 s default, whatever grpo.async.claim_timeout_s says",
           "posttrain/algorithms/async_grpo.py",
           (("claim_step(buffer, producer, n, acfg.claim_timeout_s)", "claim_step(buffer, producer, n, 600.0)"),),
           (f"{ASYNC_KEYS}::test_a_claim_timeout_in_process_is_one_line_naming_the_key",
            f"{ASYNC_KEYS}::test_a_claim_timeout_is_one_line_naming_the_key"), klass="async"),
    Mutant("shard_drops_a_row", "the data-parallel fan-out leaves the last sample out of every shard",
           "posttrain/rollouts/fan_out.py",
           (("    for i, sample in enumerate(samples):\n        shards[owner[i]]",
             "    for i, sample in enumerate(samples[:-1]):\n        shards[owner[i]]"),),
           (f"{ROLLOUT_TESTS}/test_fan_out.py",), klass="async"),
    Mutant("ratio_uses_trainer_logprobs", "off-policy samples are trained as if the trainer had sampled them",
           "posttrain/algorithms/grpo_step.py",
           (("    elif off_policy:\n", "    elif False:\n"),),
           ("tests/unit/algorithms/test_off_policy_learn.py",), klass="async"),
    Mutant("producer_runs_too_far_ahead", "the producer samples one step further ahead than max_staleness allows",
           "posttrain/algorithms/rollout_producer.py",
           (("self.allowed = trained + 1 + self.cfg", "self.allowed = trained + 2 + self.cfg"),),
           ("tests/unit/algorithms/test_rollout_producer.py::"
            "test_the_producer_samples_at_most_max_staleness_steps_past_the_trained_one",
            f"{ASYNC}::test_claim_filter_fan_out_clear_with_a_real_producer"), klass="async"),
    Mutant("importance_weight_not_applied", "the truncated importance weight is computed and reported but not applied",
           "posttrain/algorithms/loss_functions.py",
           (("            pg = pg * weight\n", "            pg = pg\n"),),
           (f"{LOSSES}::test_truncated_importance_weight_matches_hand_computation",), klass="async"),
    # policy.precision (issue 16): a mode that silently computes in another precision
    Mutant("bf16_mixed_computes_in_fp32", "bf16-mixed keeps fp32 master weights but never turns autocast on",
           "posttrain/models/policy/hf_policy_worker.py",
           (('enabled=self.precision == "bf16-mixed")', "enabled=False)"),),
           ("tests/unit/models/policy/test_precision.py::test_bf16_mixed_computes_in_bf16_over_fp32_master_weights",),
           klass="precision"),
    Mutant("engine_dtype_ignores_precision", "the engine stays float32 whatever the policy computes in",
           "posttrain/config.py",
           (('return "float32" if precision == "fp32" else "bfloat16"', 'return "float32"'),),
           ("tests/unit/models/policy/test_precision.py",), klass="precision"),
    # --- issue 31: classes 1 (resume restores the whole run) and 5 (values reach their code unchanged) ---
    Mutant("resume_reference_from_checkpoint", "a resumed run loads the checkpoint into the KL reference too: the "
           "KL is measured against step N's weights, not the initial model's",
           HF_WORKER, (("                self.model.load_state_dict(loaded.state_dict())",
                        "                for model in (self.model, self.reference or self.model):\n"
                        "                    model.load_state_dict(loaded.state_dict())"),),
           (f"{RESUME}::test_a_loaded_checkpoint_trains_on_from_its_weights_against_the_initial_reference",
            f"{RESUME}::test_a_resumed_run_logs_what_the_uninterrupted_run_logged"), klass="resume"),
    Mutant("sft_stop_check_skipped_on_resume", "a resumed SFT run forgets that its last validation met the target: "
           "run again, a finished run trains on",
           "posttrain/algorithms/sft.py",
           (("metrics = {k: v[str(resumed_at)] for k, v in logger.metrics.items() if str(resumed_at) in v}",
             "metrics = {}"),),
           (f"{RESUME}::test_an_sft_run_that_reaches_its_target_early_checkpoints_that_step_and_a_rerun_does_nothing_"
            "more",), klass="resume"),
    Mutant("async_resume_samples_from_step_1", "a resumed asynchronous run's producer starts sampling at step 1: the "
           "steps after the checkpoint train on the first steps' prompts again",
           "posttrain/algorithms/async_grpo.py",
           (("train_problems, cfg, resumed_at + 1)", "train_problems, cfg, 1)"),),
           (f"{ASYNC}::test_a_resumed_async_run_in_process_samples_the_step_after_its_checkpoint_first",
            f"{ASYNC}::test_a_resumed_async_run_samples_its_first_step_with_the_restored_weights"), klass="resume"),
    Mutant("megatron_reference_from_checkpoint", "a resumed Megatron run loads the checkpoint into the KL reference "
           "too", MCORE_WORKER,
           (("        load_local_state(self.model, self._local_shard(read_hf_weights(path)))",
             "        load_local_state(self.reference or self.model, self._local_shard(read_hf_weights(path)))\n"
             "        load_local_state(self.model, self._local_shard(read_hf_weights(path)))"),),
           (f"{RESUME}::test_a_loaded_checkpoint_trains_on_from_its_weights_against_the_initial_reference[megatron]",),
           klass="resume", tier="mcore"),
    Mutant("megatron_ranks_load_rank0_optimizer", "every tensor-parallel rank restores rank 0's optimizer shard (same "
           "shapes: no error, the other ranks' Adam moments are wrong)", MCORE_WORKER,
           (("OPTIMIZER_STATE.format(rank=self.rank)", "OPTIMIZER_STATE.format(rank=0)"),),
           (f"{MCORE_RESUME}::test_each_tensor_parallel_rank_restores_its_own_optimizer_state[tp2]",), klass="resume",
           tier="mcore"),
    Mutant("lora_alpha_cast_to_int", "policy.lora.alpha is cast to int on its way to peft (peft annotates it int): "
           "1.5 scales the adapters as 1", LORA_LAYER,
           (("lora_alpha=cfg.alpha,", "lora_alpha=int(cfg.alpha),"),),
           (f"{PLUMBING}[policy.lora.alpha]",), klass="config"),
    Mutant("kl_coef_truncated", "grpo.kl_coef is truncated to a whole number on its way to the loss",
           "posttrain/algorithms/grpo.py",
           (("ClippedPGLoss(clip_eps=cfg.grpo.clip_eps, kl_coef=cfg.grpo.kl_coef)",
             "ClippedPGLoss(clip_eps=cfg.grpo.clip_eps, kl_coef=float(int(cfg.grpo.kl_coef)))"),),
           (f"{PLUMBING}[grpo.kl_coef]",), klass="config"),
    Mutant("importance_weight_cap_clamped", "the asynchronous loop clamps grpo.async.importance_weight_cap to 2",
           "posttrain/algorithms/async_grpo.py",
           (("importance_weight_cap=acfg.importance_weight_cap)",
             "importance_weight_cap=acfg.importance_weight_cap and min(acfg.importance_weight_cap, 2.0))"),),
           (f"{ASYNC}::test_the_async_loop_trains_with_the_configured_importance_weight_cap",
            f"{ASYNC_KEYS}::test_max_staleness_buffer_size_and_the_weight_cap_reach_the_loop"), klass="config"),
    Mutant("stop_target_rounded", "sft.stop_at_val_accuracy is rounded to one decimal (0.65 -> 0.7): the run trains "
           "past the accuracy it was told to stop at", "posttrain/algorithms/sft.py",
           (('metrics.get("val/accuracy", 0.0) >= target', 'metrics.get("val/accuracy", 0.0) >= round(target, 1)'),),
           (f"{PLUMBING}[sft.stop_at_val_accuracy]",), klass="config"),
    # --- issue 31: classes 2 (the behaviour distribution: temperature, top-k, top-p) and 4 (precision contracts) ---
    Mutant("hf_engine_logprobs_untruncated", "the hf engine reports log_softmax(logits / T) over the whole "
           "vocabulary while it samples from the top-k / top-p set: the behaviour logprobs are not the sampler's",
           "posttrain/models/generation/hf_generation_worker.py",
           (("output_scores=True,", "output_scores=True, output_logits=True,"),
            ("scores = torch.stack(out.scores, dim=1).float()",
             "scores = torch.stack(out.logits, dim=1).float() / (1.0 if params.greedy else params.temperature)")),
           (f"{SAMPLING_TESTS}::test_the_engines_sampled_logprobs_are_the_trainers_of_the_same_tempered_truncated_"
            "distribution",), klass="sampling"),
    Mutant("vllm_engine_raw_logprobs", "vLLM returns raw logprobs (before temperature and top-k / top-p): the "
           "behaviour logprobs are of another distribution than the one sampled", VLLM_WORKER,
           (('logprobs_mode="processed_logprobs"', 'logprobs_mode="raw_logprobs"'),),
           (f"{VLLM_TESTS}::test_sampled_logprobs_are_the_trainers_of_the_same_tempered_truncated_distribution",),
           klass="sampling", tier="vllm"),
    Mutant("trainer_ignores_top_k_top_p", "the policy workers are built without generation.top_k / top_p: the "
           "trainer scores the whole tempered vocabulary while the engine samples a truncated one",
           "posttrain/algorithms/runtime.py",
           (("top_k=sampling.top_k, top_p=sampling.top_p)", ")"),),
           (f"{PLUMBING}[generation.top_k]", f"{PLUMBING}[generation.top_p]"), klass="sampling"),
    Mutant("top_p_before_temperature", "the train step picks the top-p set from the logits before the temperature",
           "posttrain/ops.py",
           (("keep = sampling_mask(scaled, top_k, top_p)", "keep = sampling_mask(logits.float(), top_k, top_p)"),),
           ("tests/unit/test_ops.py::test_logprobs_of_the_sampling_distribution_equal_the_hand_computation",),
           klass="sampling"),
    Mutant("sampled_token_dropped_by_trainer", "a sampled token the trainer's top-k / top-p set leaves out scores "
           "-inf: its ratio is NaN and the step is skipped", "posttrain/ops.py",
           (("            keep = keep.scatter(-1, targets[..., None], True)\n", "            pass\n"),),
           ("tests/unit/test_ops.py::test_a_sampled_token_outside_this_sides_set_keeps_a_finite_logprob",),
           klass="sampling"),
    Mutant("behaviour_logprobs_replaced_in_one_step", "a one-optimizer-step train call divides by its own forward's "
           "logprobs even when handed the behaviour logprobs", "posttrain/models/policy/base_policy_worker.py",
           (('data.setdefault("old_logprobs", logprobs.detach())', 'data["old_logprobs"] = logprobs.detach()'),),
           (f"{SAMPLING_TESTS}::test_a_train_call_divides_by_exactly_the_behaviour_logprobs_it_was_given",),
           klass="sampling"),
    Mutant("behaviour_logprobs_replaced_in_several_steps", "a train call of several optimizer steps divides by the "
           "trainer's logprobs even when handed the behaviour logprobs",
           "posttrain/models/policy/base_policy_worker.py",
           (('if self.old_logprobs is not None and "old_logprobs" not in extra:',
             "if self.old_logprobs is not None:"),),
           (f"{SAMPLING_TESTS}::test_a_train_call_divides_by_exactly_the_behaviour_logprobs_it_was_given",),
           klass="sampling"),
    Mutant("loss_math_in_model_dtype", "the train step's log-softmax runs in the model's dtype (bf16): logprobs, "
           "ratio and entropy ~1e-2 off", "posttrain/ops.py",
           (("scaled = logits.float() / temperature", "scaled = logits / temperature"),),
           (f"{PRECISION_TESTS}::test_the_loss_math_runs_in_fp32_on_a_bf16_models_logits",), klass="precision"),
    Mutant("old_logprobs_rounded_to_model_dtype", "a one-step train call keeps its old logprobs in the model's dtype: "
           "the ratio's denominator is bf16-rounded, the first ratio is not 1",
           "posttrain/models/policy/base_policy_worker.py",
           (("forward_old.append(logprobs.detach())",
             "forward_old.append(logprobs.detach().to(torch.bfloat16))"),),
           (f"{PRECISION_TESTS}::test_the_loss_math_runs_in_fp32_on_a_bf16_models_logits",), klass="precision"),
    Mutant("probe_bound_fp32_loose", "the fp32 probe bound is 0.05: an engine a whole (small) step behind passes",
           "posttrain/weight_sync/probe.py", (('"fp32": 1e-3,', '"fp32": 0.05,'),),
           (f"{PRECISION_TESTS}::test_each_precisions_probe_bound_sits_where_its_derivation_puts_it",),
           klass="precision"),
    Mutant("probe_bound_bf16_loose", "the bf16-mixed probe bound is 1.0: an engine one step behind passes",
           "posttrain/weight_sync/probe.py", (('"bf16-mixed": 0.2}', '"bf16-mixed": 1.0}'),),
           (f"{PRECISION_TESTS}::test_each_precisions_probe_bound_sits_where_its_derivation_puts_it",),
           klass="precision"),
    Mutant("tf32_never_switched_off", "policy.tf32=false leaves TF32 matmuls on: a parity run is not full fp32",
           "posttrain/models/precision.py",
           (("torch.backends.cuda.matmul.allow_tf32 = enabled", "torch.backends.cuda.matmul.allow_tf32 = True"),),
           (f"{PRECISION_TESTS}::test_tf32_is_switched_on_and_off_as_asked",), klass="precision"),
    # --- issue 31: class 3 (a check that covers one of several engines) ---
    Mutant("probe_pools_engines", "the probe judges the mean over all engines' rows: one stale engine of N is "
           "diluted to 1/N of the error and passes a bf16 bound",
           "posttrain/weight_sync/probe.py",
           (("return worst_engine_errors(engine, trainer, batch.completion_mask, self.num_engines)",
             "return probe_errors(engine, trainer, batch.completion_mask)"),),
           ("tests/unit/models/generation/test_refit_probe.py",), klass="one-of-several"),
    Mutant("probe_best_engine", "the probe reports the best engine's error instead of the worst",
           "posttrain/weight_sync/probe.py",
           (("return {key: max(errors[key] for errors in per_engine)",
             "return {key: min(errors[key] for errors in per_engine)"),),
           ("tests/unit/models/generation/test_refit_probe.py",), klass="one-of-several"),
    Mutant("probe_rows_fewer_than_engines", "the probe keeps num_sequences rows when there are more engines: "
           "the last engines are never probed",
           "posttrain/weight_sync/probe.py",
           (('"num_sequences": max(cfg.num_sequences, num_engines)', '"num_sequences": cfg.num_sequences'),),
           ("tests/unit/models/generation/test_refit_probe.py",), klass="one-of-several"),
    Mutant("version_from_first_engine", "the engines' weight version is read from the first engine only",
           "posttrain/weight_sync/receipt.py",
           (("version = agreed_version((r.weight_version for r in receipts), who)",
             "version = agreed_version((r.weight_version for r in receipts[:1]), who)"),),
           ("tests/unit/models/generation/test_sharding.py",
            "tests/unit/models/generation/test_refit_broadcast.py::"
            "test_a_refit_that_one_engine_only_pretends_to_load_fails_whichever_engine_it_is"), klass="one-of-several"),
    # --- issue 31: class 6 (a chat template like a real instruct model's) ---
    Mutant("prompt_without_generation_header", "GRPO prompts are rendered without the generation prompt: the model "
           "must write the assistant header itself (invisible with a role-less template)",
           "posttrain/data/chat.py",
           (('return tuple(self._render([{"role": "user", "content": question}], add_generation_prompt=True))',
             'return tuple(self._render([{"role": "user", "content": question}], add_generation_prompt=False))'),),
           ("tests/integration/test_chat_template.py",), klass="prompts"),
    Mutant("sft_trains_after_end_of_turn", "SFT also trains what the template renders after the end-of-turn token",
           "posttrain/data/chat.py",
           (("return prompt, tuple(turn[: turn.index(eos) + 1] if eos in turn else turn)",
             "return prompt, tuple(turn)"),),
           ("tests/integration/test_chat_template.py",), klass="sft-tokens"),
    # --- issue 31: classes 7 (the rule engine's edges) and 8 (the harness's own records) ---
    Mutant("completeness_metric_off_by_one", "a metric a rule reads may stop one step before --expect-steps",
           "posttrain/testing/rules/completeness.py",
           (("series.steps[-1] < expect_steps:", "series.steps[-1] < expect_steps - 1:"),),
           (f"{EDGES}::test_a_rule_passes_at_step_n_and_fails_when_the_run_or_a_metric_it_reads_stops_at_n_minus_1",),
           klass="rules"),
    Mutant("completeness_reads_first_metric_only", "only the first metric a rule reads is checked for completeness",
           "posttrain/testing/rules/completeness.py",
           (("for name in sorted(metrics_read):", "for name in sorted(metrics_read)[:1]:"),),
           (f"{EDGES}::test_a_rule_passes_at_step_n_and_fails_when_the_run_or_a_metric_it_reads_stops_at_n_minus_1",),
           klass="rules"),
    Mutant("mean_checks_only_its_window", "mean refuses a NaN only inside its range: mean(x, -20) skips earlier NaNs",
           "posttrain/testing/rules/helpers.py",
           (("    series = finite_series(values)\n    if not 0.0 <= ignore_top_p",
             "    series = as_series(values)\n    if not 0.0 <= ignore_top_p"),),
           (f"{EDGES}::test_a_non_finite_value_at_the_first_a_middle_or_the_last_step_fails_every_helper_naming_it",),
           klass="rules"),
    Mutant("ratio_above_counts_nan_as_below", "ratio_above counts a NaN as a value below the threshold",
           "posttrain/testing/rules/helpers.py",
           (("vals = finite_series(values).step_values", "vals = as_series(values).step_values"),),
           (f"{EDGES}::test_a_non_finite_value_at_the_first_a_middle_or_the_last_step_fails_every_helper_naming_it",),
           klass="rules"),
    Mutant("token_mult_domain_from_zero", "the vacuity check takes exp(|delta|) for >= 0: min(x) >= 1 is judged sound",
           "posttrain/testing/rules/vacuity.py",
           (('("train/token_mult_prob_error", 1.0, math.inf)', '("train/token_mult_prob_error", 0.0, math.inf)'),),
           (f"{DOMAINS}::test_a_bound_of_a_metrics_range_is_vacuous_and_a_tighter_one_is_not",), klass="rules"),
    Mutant("git_untracked_not_dirty", "a new file not yet added leaves unit_results.json's commit clean",
           "posttrain/testing/harness/results.py",
           (('git("status", "--porcelain")', 'git("status", "--porcelain", "--untracked-files=no")'),),
           (RESULTS,), klass="harness"),
    Mutant("git_dirty_misses_staged", "only unstaged edits mark the commit dirty (git diff): staged ones do not",
           "posttrain/testing/harness/results.py",
           (('git("status", "--porcelain")', 'git("diff", "--name-only")'),),
           (RESULTS,), klass="harness"),
    Mutant("nothing_ran_counts_runtime_skips", "a test that skips in its body (no backend, no kernel) counts as "
           "run: a selection whose tests all skipped at run time exits 0, green having tested nothing",
           "posttrain/testing/harness/selection.py",
           (('return not report.skipped or hasattr(report, "wasxfail")', "return True"),),
           (f"{SKIPS}::test_a_selection_whose_tests_all_skipped_exits_5_whenever_they_skipped",), klass="harness"),
    Mutant("strict_skips_ignore_ci", "CI=true does not make skips strict: a CI runner without the package a module "
           "needs skips it and goes green", "posttrain/testing/harness/machine.py",
           (('environ.get(CI_ENV, "")', 'environ.get("POSTTRAIN_CI", "")'),),
           (f"{SKIPS}::test_ci_makes_skips_strict_and_a_declared_skip_on_the_wrong_machine_fails",), klass="harness"),
    Mutant("time_budget_ignores_ci", "CI=true does not make the time budget strict: a test that grew past the "
           "budget without saying why passes CI, and the tier's time creeps up one test at a time",
           "posttrain/testing/harness/plugin.py",
           (("or on_ci(os.environ)", "or on_ci({})"),),
           (f"{BUDGET}::test_under_ci_an_unmarked_test_over_the_budget_fails_the_run_and_a_marked_one_does_not",),
           klass="harness"),
    Mutant("time_budget_slow_reason_not_shipped", "under xdist the controller never learns a test's slow reason: "
           "every marked test over the budget fails CI's -n run, or (the other way) a check written to tolerate "
           "that passes unmarked ones", "posttrain/testing/harness/budget.py",
           (("if call.when == \"call\" and reason is not None:", "if call.when == \"setup\" and reason is not None:"),),
           (f"{BUDGET}::test_under_xdist_the_controller_judges_every_workers_tests",), klass="harness"),
    Mutant("time_budget_counts_a_bare_slow_mark", "a bare @pytest.mark.slow counts as a reason: a test over the "
           "budget escapes the check by a marker that says nothing", "posttrain/testing/harness/budget.py",
           (("if t.seconds > budget_s and not t.slow)", "if t.seconds > budget_s and t.slow is None)"),),
           (f"{BUDGET}::test_a_call_over_the_budget_without_a_reason_is_one_line_naming_the_test_and_its_time",),
           klass="harness"),
    Mutant("skip_condition_never_judged", "a declared skip is accepted on any machine: a GPU test that skipped on "
           "the GPU machine (a broken CUDA install) is reported as expected",
           "posttrain/testing/harness/skips.py",
           (("return all(ok for ok, _ in verdicts)", "return True"),),
           (f"{SKIPS}::test_a_skip_declared_for_this_machine_is_expected_and_one_for_another_machine_is_not",),
           klass="harness"),
    Mutant("skip_reason_matched_in_part", "a skip reason matches a row by its beginning: 'needs 2 GPUs, found 0 "
           "and the kernel is missing' passes as a GPU skip", "posttrain/testing/harness/skips.py",
           (("match = rule.pattern.fullmatch(skip.reason)", "match = rule.pattern.match(skip.reason)"),),
           (f"{SKIPS}::test_the_whole_reason_must_match_not_a_part_of_it",), klass="harness"),
    Mutant("peak_is_current_rss", "get_max_mem reads the memory in use now (VmRSS): a freed 1 GiB spike vanishes",
           "posttrain/testing/harness/memory.py",
           (('line.startswith("VmHWM:")', 'line.startswith("VmRSS:")'),),
           (f"{TRACKER}::test_max_mem_keeps_a_1_gib_spike_that_a_ray_actor_allocated_and_freed",), klass="harness"),
    Mutant("uv_run_workers_missed", "workers Ray started through `uv run` are left out of get_max_mem",
           "posttrain/testing/harness/memory.py",
           (("(tree.get(p, []) if _is_uv_run(p) else [p])", "[p]"),),
           (f"{TRACKER}::test_a_worker_that_ray_started_through_uv_run_is_counted",), klass="harness"),
    Mutant("xdist_auto_counts_machine_cores", "-n auto starts one worker per core of the machine (xdist's count), "
           "not per CPU this process may use: a container limited to 16 of 32 CPUs overcommits 2x",
           "posttrain/testing/harness/plugin.py",
           (("    return parallel.available_cpus()", "    return None"),),
           ("tests/unit/testing/harness/test_harness_parallel.py::"
            "test_auto_starts_one_worker_per_cpu_of_the_affinity_mask_not_per_core_of_the_machine",), klass="harness"),
    Mutant("xdist_worker_leaves_tokenizer_threads", "an xdist worker bounds torch's threads but not the fast "
           "tokenizers' rayon pool: 16 workers on 16 cores each spin 16 threads and the tier runs 10x slower",
           "posttrain/testing/harness/parallel.py",
           (('THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS")',
             'THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")'),),
           ("tests/unit/testing/harness/test_harness_parallel.py::"
            "test_a_fast_tokenizer_in_a_worker_starts_only_its_share_of_threads",), klass="harness"),
    Mutant("xdist_workers_race_on_the_ray_token_file", "the controller hands its workers no Ray token: on a fresh "
           "machine their clusters race on ~/.ray/auth_token and a worker that lost fails every later cluster start",
           "posttrain/testing/harness/plugin.py",
           (("        parallel.share_ray_auth_token()  # workers", "        None  # workers"),),
           ("tests/unit/testing/harness/test_harness_parallel.py::test_every_worker_starts_with_the_controllers_ray_token",
            "tests/unit/testing/harness/test_harness_parallel.py::"
            "test_a_workers_cluster_starts_after_another_worker_rewrote_the_ray_token_file"), klass="harness"),
    Mutant("run_unit_keeps_dontwritebytecode", "run_unit.sh keeps a PYTHONDONTWRITEBYTECODE=1 of the machine: every "
           "xdist worker, Ray actor and pytester run compiles the same sources again (16 cores: 182 s, not 115 s)",
           "tests/run_unit.sh",
           (("unset PYTHONDONTWRITEBYTECODE", ": PYTHONDONTWRITEBYTECODE kept"),),
           ("tests/unit/testing/harness/test_harness_run_unit.py::"
            "test_bytecode_is_written_where_the_environment_forbids_it",), klass="harness"),
    # issue 36: tools/bisect.sh (posttrain/testing/git_bisect.py), git bisect run on the toolkit's verdicts
    Mutant("bisect_exit_2_is_bad", "the bisect takes exit 2 (could not judge: no GPU, a bad override) for a failure: "
           "a commit that cannot run is named the culprit", BISECT,
           (('    if code == 1:\n        return "fail", "exit 1"',
             '    if code in (1, 2):\n        return "fail", f"exit {code}"'),),
           (f"{BISECT_TESTS}::test_a_commit_that_cannot_be_judged_is_skipped_and_the_bisect_still_converges",
            f"{BISECT_TESTS}::test_only_exit_0_and_1_are_verdicts"), klass="harness"),
    Mutant("bisect_repeat_ignored", "--repeat N decides each commit on its first run: one flaky verdict misplaces "
           "the culprit", BISECT,
           (("    left = repeat - len(outcomes)", "    left = 1 - len(outcomes)"),),
           (f"{BISECT_TESTS}::test_a_flaky_check_misplaces_the_culprit_once_and_repeat_finds_it",
            f"{BISECT_TESTS}::test_the_repeat_policy_is_the_majority_of_the_runs_with_a_verdict"), klass="harness"),
    Mutant("bisect_flip_against_itself", "the rule that flipped is looked for by comparing the first bad commit's "
           "report with itself: no rule or test is ever named", BISECT,
           (("good_run, bad_run = good.representative(), bad.representative()",
             "good_run, bad_run = bad.representative(), bad.representative()"),),
           (f"{BISECT_TESTS}::test_a_regression_at_commit_5_is_named_with_the_rule_that_flipped_and_the_checkout_is_"
            "untouched", f"{BISECT_TESTS}::test_a_pytest_command_names_the_failing_test_node_ids"), klass="harness"),
    Mutant("bisect_timeout_is_bad", "a run killed at --timeout counts as a failure: a commit that hangs (or a slow "
           "machine) is named the culprit", BISECT,
           (('            return None, f"timed out after {timeout:g} s"',
             '            return 1, f"timed out after {timeout:g} s"'),),
           (f"{BISECT_TESTS}::test_a_timeout_kills_the_whole_process_group",
            f"{BISECT_TESTS}::test_a_commit_that_cannot_be_judged_is_skipped_and_the_bisect_still_converges"),
           klass="harness"),
    Mutant("bisect_staged_changes_accepted", "the uncommitted-changes refusal reads git diff: a staged edit passes, "
           "and the user bisects believing their edit is tested", BISECT,
           (('git(repo, "status", "--porcelain", "--untracked-files=no")', 'git(repo, "diff", "--name-only")'),),
           (f"{BISECT_TESTS}::test_uncommitted_changes_are_refused_and_untracked_files_are_not",), klass="harness"),
    Mutant("sampling_accuracy_averages_the_logprobs", "val/sampling_accuracy takes exp of the mean logprob over the "
           "row (padding counted), not of the sum over the answer's tokens: a per-token geometric mean that reads "
           "high whatever the answer's probability",
           "posttrain/algorithms/evaluation.py",
           (("    per_row = torch.exp((logprobs * batch.completion_mask).sum(dim=1))",
             "    per_row = torch.exp((logprobs * batch.completion_mask).mean(dim=1))"),),
           ("tests/integration/test_loop_metrics.py::"
            "test_grpo_validation_sampling_accuracy_is_the_probability_of_the_reference_answers",), klass="metrics"),
    Mutant("xdist_worker_keeps_a_leaked_thread_count", "a test that leaves torch on more threads (or torch "
           "imported before the worker's configure) hands them to every later test of its worker: 16 workers x 16 "
           "OpenMP threads on 16 cores",
           "posttrain/testing/harness/parallel.py",
           (("        if torch is not None and torch.get_num_threads() != self.share:",
             "        if False:"),),
           ("tests/unit/testing/harness/test_harness_parallel.py::"
            "test_a_test_that_leaves_torch_on_more_threads_does_not_hand_them_to_the_next",), klass="harness"),
    Mutant("learn_timed_as_reward", "learn times its advantages under the scoring's phase: timing/reward adds the "
           "two and says it is the verifier's",
           "posttrain/algorithms/grpo_step.py",
           (('with timer.time("advantages"):', 'with timer.time("reward"):'),),
           ("tests/unit/algorithms/test_off_policy_learn.py",), klass="metrics"),
    # --- issue 32: the backend table ---
    Mutant("auto_ignores_the_table_order", "generation.backend=auto takes the last importable row, not the first: "
           "a machine with vLLM installed silently generates with the slower hf engine",
           "posttrain/models/generation/backends.py",
           (("key=lambda b: b.auto_order or 0)", "key=lambda b: -(b.auto_order or 0))"),),
           ("tests/unit/models/generation/test_refit_probe.py::test_auto_picks_vllm_only_when_importable",),
           klass="config"),
    Mutant("colocation_ignores_the_row", "every backend's engines share the policy's bundle when colocated, the hf "
           "engine's on CPUs too (its threads would run on CPUs its bundle never reserved for it)",
           "posttrain/models/generation/backends.py",
           (("    return cfg.colocated and (colocates is True or (colocates == \"gpu\" and gpus_per_worker > 0))",
             "    return cfg.colocated"),),
           ("tests/unit/models/generation/test_refit_probe.py::test_bundles_colocated_share_the_policy_bundle",),
           klass="config"),
    Mutant("hf_engine_never_colocates_on_gpus", "the hf engine takes a GPU of its own even when colocated on GPUs: "
           "a TP=2 or DP=2 policy with an hf engine needs 3 GPUs where 2 would do",
           "posttrain/models/generation/backends.py",
           (("(colocates == \"gpu\" and gpus_per_worker > 0)", "(colocates == \"gpu\" and gpus_per_worker < 0)"),),
           ("tests/unit/models/generation/test_refit_probe.py::test_bundles_colocated_share_the_policy_bundle",),
           klass="config"),
    Mutant("toolkit_imports_the_library", "a toolkit module imports a library module: posttrain-testing, installed "
           "alone, fails at its first command (the dev venv, which has both, never notices)",
           "posttrain/testing/check_metrics.py",
           (("from posttrain.testing.rules import interpreter as metric_rules",
             "from posttrain.errors import PosttrainError  # noqa: F401\n"
             "from posttrain.testing.rules import interpreter as metric_rules"),),
           ("tests/unit/testing/test_toolkit_distribution.py::"
            "test_the_toolkit_installs_alone_and_its_command_and_api_refuse_a_vacuous_rule",), klass="harness"),
    Mutant("weight_sync_imports_a_model", "the weight-sync room reaches up into models/ (a lazy import inside "
           "a function): the layers no longer hold and a cycle between the two rooms is one line away",
           "posttrain/weight_sync/probe.py",
           (("from __future__ import annotations\n",
             "from __future__ import annotations\n\n\ndef _precision():\n"
             "    from posttrain.models import precision\n    return precision\n"),),
           ("tests/unit/test_layers.py",), klass="config"),
    Mutant("async_actors_bypass_the_transport", "the async loop starts its producer as a Ray actor whatever the "
           "run's transport: an in-process run starts Ray, and its producer samples from a copy of the engines",
           "posttrain/algorithms/async_actors.py",
           (("self.actor: Actor = current_transport().actor(RolloutProducer,",
             "from posttrain.distributed.transport import RayTransport\n"
             "        self.actor: Actor = RayTransport().actor(RolloutProducer,"),),
           (f"{ASYNC}::test_the_async_loop_runs_in_process_and_at_k_0_trains_as_the_synchronous_loop",),
           klass="async"),
    Mutant("buffer_client_swaps_outcomes", "the async loop's buffer handle clears the dropped samples as consumed: "
           "the buffer's record says stale samples were trained on",
           "posttrain/algorithms/async_actors.py",
           (('self.actor.call("clear", [s["sample_id"] for s in dropped], "dropped")',
             'self.actor.call("clear", [s["sample_id"] for s in dropped], "consumed")'),),
           ("tests/unit/rollouts/test_rollout_buffer.py::"
            "test_the_loops_handle_clears_each_sample_as_what_happened_to_it",), klass="async"),
    Mutant("in_process_shares_arguments", "the in-process transport hands workers the caller's own objects: a "
           "worker that edits its input edits the driver's, which Ray's serialization never allows (an "
           "in-process test then passes where a real run differs)",
           "posttrain/distributed/transport.py",
           (("        return copied(getattr(self.workers[rank], method)(*copied(args), **copied(kwargs)))",
             "        return copied(getattr(self.workers[rank], method)(*args, **kwargs))"),),
           ("tests/unit/distributed/test_transport.py::"
            "test_an_in_process_group_runs_any_worker_class_and_copies_what_crosses_it",), klass="harness"),
    Mutant("api_skips_vacuity_check", "the public check_rules never runs the vacuity check the CLI runs: a rule "
           "true of every run passes when called from Python",
           "posttrain/testing/rules/checker.py",
           (("CheckOptions(expect_steps, vacuity_check, min_margin))",
             "CheckOptions(expect_steps, False, min_margin))"),),
           ("tests/unit/testing/rules/test_rule_checker.py::"
            "test_the_public_api_judges_every_rule_as_the_check_metrics_command_does",), klass="rules"),
    Mutant("api_is_truth_only", "posttrain.testing.rules.check_rules is the interpreter's truth alone (no vacuity, "
           "completeness or margin policy), as before issue 32",
           "posttrain/testing/rules/__init__.py",
           (("from posttrain.testing.rules.checker import check_rules\n",
             "from posttrain.testing.rules.interpreter import evaluate_rules as check_rules\n"),),
           ("tests/unit/testing/rules/test_rule_checker.py::"
            "test_the_public_api_judges_every_rule_as_the_check_metrics_command_does",), klass="rules"),
    # --- issue 31: class 9 (the same bug in another place: each copy of a behaviour pinned) ---
    Mutant("fused_entropy_untruncated", "the train step's entropy (the fused op) is of the whole tempered vocabulary, "
           "not of the top-k / top-p distribution that sampled (compute_entropy stays right)",
           "posttrain/ops.py",
           (("        entropy = _entropy(logp)\n    return logp.gather",
             "        entropy = _entropy(torch.log_softmax(completion_logits(logits, prompt_lens, completion_len)"
             ".float() / temperature, -1))\n    return logp.gather"),),
           ("tests/unit/test_ops.py::test_logprobs_of_the_sampling_distribution_equal_the_hand_computation",),
           klass="same-bug-elsewhere"),
    Mutant("standalone_entropy_untempered", "compute_entropy drops the temperature (the fused op stays right)",
           "posttrain/ops.py",
           (("return _entropy(sampling_log_softmax(completion_logits(logits, prompt_lens, completion_len), "
             "temperature,", "return _entropy(sampling_log_softmax(completion_logits(logits, prompt_lens, "
             "completion_len), 1.0,"),),
           ("tests/unit/test_ops.py",), klass="same-bug-elsewhere"),
    Mutant("slope_skips_nonfinite_scan", "slope reads its window without the NaN/inf scan the other helpers do",
           "posttrain/testing/rules/helpers.py",
           (("steps, vals = step_window(finite_series(values), range_start, range_end)\n    if len(vals) < 2:",
             "steps, vals = step_window(as_series(values), range_start, range_end)\n    if len(vals) < 2:"),),
           (f"{EDGES}::test_a_non_finite_value_at_the_first_a_middle_or_the_last_step_fails_every_helper_naming_it",),
           klass="same-bug-elsewhere"),
    Mutant("last_step_skips_nonfinite_scan", "last_step reads its metric without the NaN/inf scan",
           "posttrain/testing/rules/helpers.py",
           (("    series = finite_series(values)\n    if not series.steps:",
             "    series = as_series(values)\n    if not series.steps:"),),
           (f"{EDGES}::test_a_non_finite_value_at_the_first_a_middle_or_the_last_step_fails_every_helper_naming_it",),
           klass="same-bug-elsewhere"),
    Mutant("engine_loads_before_it_checks", "the receiver loads a refit before it checks the tensors: a refused refit "
           "leaves the engine labelled with weights it loaded only in part",
           "posttrain/weight_sync/receiver.py",
           (("""            check_refit(self.refit_shapes(), {name: tuple(t.shape) for name, t in tensors.items()},
                        self.rank, version)
            self._load_weights(iter(tensors.items()), version)""",
             """            self._load_weights(iter(tensors.items()), version)
            check_refit(self.refit_shapes(), {name: tuple(t.shape) for name, t in tensors.items()},
                        self.rank, version)"""),),
           ("tests/unit/models/generation/test_refit_probe.py::test_hf_partial_refit_is_refused",
            "tests/unit/models/generation/test_refit_probe.py::test_hf_refit_with_an_unknown_name_or_a_wrong_shape_is_one_line"),
           klass="same-bug-elsewhere"),
    Mutant("ray_leak_check_never_settles", "a module fixture's actors are recorded before the GCS lists them: on a "
           "loaded machine they are blamed on the first test that uses them (a false leak error)",
           "posttrain/testing/harness/ray_leaks.py",
           (("(_settled_ids() if RAY_FIXTURE in request.fixturenames else self._ids())",
             "(self._ids() if RAY_FIXTURE in request.fixturenames else self._ids())"),),
           ("tests/unit/testing/harness/test_harness_ray_leaks_stand_in.py::"
            "test_only_the_fixtures_of_a_test_that_uses_ray_wait_for_their_actors_to_be_listed",
            "tests/unit/testing/harness/test_harness_ray_leaks.py::"
            "test_only_fixtures_of_a_test_that_uses_ray_wait_for_their_actors_to_settle"), klass="harness"),
    # --- issue 33: generation with megatron-core's inference loop (--mcore-only, 1 GPU) -----------
    Mutant("megatron_sampler_raw_logprobs", "the engine returns the raw logits' logprobs (megatron's own), not "
           "those of the tempered, top-k / top-p distribution it sampled from: every importance ratio is off",
           MCORE_SAMPLER, (("logp = sampling_log_softmax(logits, p.temperature, p.top_k, p.top_p)\n",
                            "logp = sampling_log_softmax(logits, p.temperature, p.top_k, p.top_p)\n"
                            "            raw = torch.log_softmax(logits, dim=-1)\n"),
                           ("self.logprobs.append(logp.gather(",
                            "self.logprobs.append((raw if not p.greedy else logp).gather(")),
           (f"{MCORE_GEN_TESTS}::test_sampled_logprobs_equal_the_trainers",), klass="megatron-generation",
           tier="mcore", gpus=1),
    Mutant("megatron_sampler_padded_vocab", "the padded vocabulary's ids (zero logits) can be sampled",
           MCORE_SAMPLER, (("logits = last_token_logits[:, : self.vocab_size].float()",
                            "logits = last_token_logits.float()"),),
           ("tests/unit/models/megatron/test_step_sampler.py",), klass="megatron-generation"),
    Mutant("megatron_sampler_reads_one_step_late", "a row's completion is read from the step after its prompt ended",
           MCORE_SAMPLER, (("first = len(prompt) - shortest ", "first = len(prompt) - shortest + 1 "),),
           (f"{MCORE_GEN_TESTS}::test_greedy_tokens_equal_hf_generates_on_64_prompts_of_mixed_lengths",),
           klass="megatron-generation", tier="mcore", gpus=1),
    Mutant("megatron_sampler_ignores_the_seed", "every call draws from a generator seeded with 0: each GRPO step "
           "resamples the same completions", MCORE_SAMPLER,
           (("generator.manual_seed(seed)", "generator.manual_seed(0)"),),
           (f"{MCORE_GEN_TESTS}::test_a_seed_gives_the_same_samples_and_another_seed_others",),
           klass="megatron-generation", tier="mcore", gpus=1),
    Mutant("megatron_sampler_leaves_the_model_in_eval", "the policy's model comes back from generation in eval()",
           MCORE_SAMPLER, (("self.model.train(was_training)", "pass"),),
           (f"{MCORE_GEN_TESTS}::test_the_policys_own_model_samples_as_the_engine_and_stays_in_training_mode",),
           klass="megatron-generation", tier="mcore", gpus=1),
    Mutant("megatron_engine_refit_only_bumps_the_version", "the megatron engine takes a refit's version but keeps "
           "its old weights", "posttrain/models/generation/megatron/megatron_generation_worker.py",
           (("        self._load_hf(hf)\n        self.version = version", "        self.version = version"),),
           (f"{MCORE_GEN_TESTS}::test_a_refit_is_served_by_the_next_call",), klass="megatron-generation", tier="mcore",
           gpus=1),
    Mutant("vllm_score_reads_the_previous_position", "the vLLM engine's score reads each token's logprob one "
           "position early (the prompt's last logits for the first token): the probe and decode-vs-prefill drift",
           "posttrain/models/generation/vllm/vllm_generation_worker.py",
           (("out.prompt_logprobs[len(prompt) + t]", "out.prompt_logprobs[len(prompt) + max(t - 1, 0)]"),),
           ("tests/unit/models/generation/test_vllm_generation.py::test_decode_logprobs_equal_one_prefill_of_the_sequence",),
           klass="sampling", tier="vllm"),
    # issue 34: pipeline stages of the Megatron conversion (models/megatron/conversion.py)
    Mutant("pipeline_stage_boundary_off_by_one", "every pipeline stage boundary sits one layer early: stage 0 "
           "holds a layer too few and the last stage one too many, each loaded under the wrong layer number",
           "posttrain/models/megatron/conversion.py",
           (("    return range(pp_rank * per_stage, (pp_rank + 1) * per_stage)",
             "    return range(max(pp_rank * per_stage - 1, 0), "
             "(pp_rank + 1) * per_stage - (pp_rank < pp_size - 1))"),),
           ("tests/unit/models/megatron/test_conversion.py::"
            "test_each_pipeline_stage_holds_its_own_layers_renumbered_from_zero",), klass="megatron"),
    Mutant("pipeline_tied_copy_not_compared", "tied embeddings over pipeline stages: a last-stage output layer that "
           "drifted from the embedding is merged without a word, the export keeping the embedding only",
           "posttrain/models/megatron/conversion.py",
           (("    elif pp_size > 1 and not torch.equal(", "    elif False and not torch.equal("),),
           ("tests/unit/models/megatron/test_conversion.py::"
            "test_a_tied_output_layer_that_drifted_from_the_embedding_is_refused",), klass="megatron"),
    Mutant("context_parallel_accepted", "policy.megatron.context_parallel_size=2 is accepted and ignored: the "
           "run trains on one GPU per rank while the user believes the sequence is split",
           "posttrain/config.py", (("        if self.context_parallel_size != 1:", "        if False:"),),
           ("tests/unit/models/megatron/test_backend_checks.py::"
            "test_megatron_layouts_not_built_yet_are_refused_in_one_line",), klass="config"),
    # issue 34: megatron-core's schedules in the Megatron policy worker
    Mutant("megatron_schedule_loss_divided_by_micro_batches", "the loss handed to megatron's schedule is not "
           "multiplied back by the micro-batch count: megatron divides it again and every accumulated gradient is "
           "1/k of the global batch's (a smaller step, clipping seldom active)", MCORE_WORKER,
           (("                return loss * n, outputs", "                return loss, outputs"),),
           (f"{MCORE_TESTS}::test_train_steps_equal_the_hf_workers",), klass="training", tier="mcore", gpus=1),
    Mutant("pipeline_metrics_of_the_first_stage", "with pipeline stages, rank 0 (the first stage) answers the train "
           "step with its own metrics, never computed there, instead of the last stage's", MCORE_WORKER,
           (("            step_metrics, old = self._from_last_stage(", "            _, old = self._from_last_stage("),),
           (f"{MCORE_TESTS}::test_pipeline_parallel_2_matches_the_hf_worker",), klass="metrics", tier="mcore"),
    Mutant("pipeline_embedding_grads_not_reduced", "the embedding group's gradient all-reduce never runs: the tied "
           "output layer on the last stage and the embedding on the first train apart", MCORE_WORKER,
           (("        finalize_model_grads([self.model])", "        pass"),),
           (f"{MCORE_TESTS}::test_pipeline_parallel_2_matches_the_hf_worker",), klass="megatron", tier="mcore"),
    Mutant("sequence_parallel_accepted", "policy.megatron.sequence_parallel=true (with TP > 1) passes validation: the "
           "workers then fail to start deep in megatron, or, with another norm, silently run without it",
           "posttrain/config.py", (("        if self.sequence_parallel:\n", "        if False:\n"),),
           ("tests/unit/models/megatron/test_backend_checks.py::"
            "test_megatron_layouts_not_built_yet_are_refused_in_one_line",), klass="config"),
    # issue 35: the Megatron policy's torch layer spec (models/megatron/attention.py, model.py)
    Mutant("sdpa_attention_not_causal", "the torch layer spec's attention attends to later tokens: every logit sees "
           "the future, training and scoring both", "posttrain/models/megatron/attention.py",
           (("            causal = True", "            causal = False"),),
           (f"{LAYER_SPEC_TESTS}::test_sdpa_core_attention_equals_megatrons",
            f"{MCORE_TESTS}::test_logits_equal_the_hf_models"), klass="megatron", tier="mcore", gpus=1),
    Mutant("sdpa_attention_mask_inverted", "the inference loop's boolean mask read with the opposite meaning: a "
           "megatron engine's prefill attends only to later tokens and every decode step to none",
           "posttrain/models/megatron/attention.py",
           (("mask.masked_fill_(attention_mask, MASKED)", "mask.masked_fill_(~attention_mask, MASKED)"),),
           (f"{LAYER_SPEC_TESTS}::test_sdpa_core_attention_equals_megatrons",
            "tests/unit/models/megatron/test_megatron_generation.py"), klass="megatron", tier="mcore", gpus=1),
    Mutant("layer_spec_key_ignored", "policy.megatron.layer_spec=torch builds megatron's unfused attention: the "
           "same numbers, none of the speed or memory asked for", "posttrain/models/megatron/model.py",
           (('    if layer_spec == "torch":\n        from posttrain.models.megatron.attention',
             '    if False:\n        from posttrain.models.megatron.attention'),),
           (f"{LAYER_SPEC_TESTS}::test_the_layer_spec_key_builds_its_attention",), klass="config", tier="mcore",
           gpus=1),
    # issue 35: the HF policy's fused RMSNorm (models/fused_norms.py)
    Mutant("fused_rms_norm_drops_the_weight", "the fused RMSNorm of a float32 model normalises but never scales by "
           "the layer's weight: every layer's learned gain is ignored, in training and scoring",
           "posttrain/models/fused_norms.py",
           (("F.rms_norm(hidden_states, shape, self.weight, self.variance_epsilon)",
             "F.rms_norm(hidden_states, shape, None, self.variance_epsilon)"),),
           ("tests/unit/models/policy/test_fused_rms_norm.py::test_the_fused_norm_computes_what_transformers_computes",),
           klass="training"),
    Mutant("fused_rms_norm_eps_dropped", "the fused RMSNorm of bf16 inputs uses torch's default epsilon instead of "
           "the model's: a different normalisation near zero, silently", "posttrain/models/fused_norms.py",
           (("F.rms_norm(hidden_states.float(), shape, None, self.variance_epsilon)",
             "F.rms_norm(hidden_states.float(), shape, None, None)"),),
           ("tests/unit/models/policy/test_fused_rms_norm.py::test_the_fused_norm_computes_what_transformers_computes",),
           klass="training"),
    Mutant("fused_rms_norm_key_ignored", "policy.fused_rms_norm=false still swaps the norms: the key a user turns off "
           "to rule the fused kernel out changes nothing", "posttrain/models/policy/hf_policy_worker.py",
           (("        if cfg.fused_rms_norm:", "        if True:"),),
           ("tests/unit/models/policy/test_fused_rms_norm.py::test_the_key_reaches_the_policy_and_its_reference",),
           klass="config"),
    # issue 35: sequence packing (data/packing.py, the HF worker)
    Mutant("packed_attention_leaks_across_sequences", "packed sequences given one offset span for the whole row: "
           "every packed sequence attends to the sequences before it", "posttrain/data/packing.py",
           (("    sizes = [n for n in lengths.tolist() if n > 0]", "    sizes = [sum(lengths.tolist())]"),),
           ("tests/unit/models/policy/test_sequence_packing.py::"
            "test_a_packing_worker_scores_and_trains_as_the_padded_worker",), klass="training"),
    Mutant("varlen_attention_not_causal", "the per-sequence attention (CPU, fp32) is not causal: each token attends "
           "to the later tokens of its sequence", "posttrain/models/packed_attention.py",
           (("out = F.scaled_dot_product_attention(q, k, v, is_causal=True,",
             "out = F.scaled_dot_product_attention(q, k, v, is_causal=False,"),),
           ("tests/unit/models/policy/test_varlen_attention.py",), klass="training"),
    Mutant("output_layer_scoring_refusals_dropped", "chunked logprobs or packing with megatron, compile or FSDP2 "
           "pass validation: the run then scores from a weight those paths never apply (or FSDP2 never gathered)",
           "posttrain/config.py", (("            if other:\n                raise ValueError(f\"{key} cannot be",
                                    "            if False:\n                raise ValueError(f\"{key} cannot be"),),
           ("tests/unit/models/policy/test_logprob_chunks.py::"
            "test_what_output_layer_scoring_cannot_serve_is_refused_in_one_line",), klass="config"),
    Mutant("packing_attends_by_the_dense_mask", "a packing worker keeps sdpa: transformers' dense block-diagonal "
           "mask, right and T^2 work per head and layer (4.8x the padded batch's at GSM8K-like lengths)",
           "posttrain/models/policy/hf_policy_worker.py",
           (("            self.model.set_attn_implementation(varlen_attention.register())\n", "            pass\n"),),
           ("tests/unit/models/policy/test_sequence_packing.py::"
            "test_a_packing_worker_scores_and_trains_as_the_padded_worker",), klass="performance"),
    # issue 35: sequence packing on the Megatron backend (models/megatron/attention.py, the worker)
    Mutant("megatron_packed_attention_spans_the_row", "the torch layer spec's packed attention is given one sequence "
           "spanning the packed row: each sequence attends to the sequences packed before it",
           "posttrain/models/megatron/attention.py",
           (("packed_causal_attention(query, key, value, params.cu_seqlens_q, bounds,",
             "packed_causal_attention(query, key, value, params.cu_seqlens_q[[0, -1]], (0, bounds[-1]),"),),
           ("tests/unit/models/megatron/test_megatron_packing.py",
            f"{LAYER_SPEC_TESTS}::test_packed_sequences_attend_as_megatrons_attention_over_each_sequence_alone"),
           klass="megatron", tier="mcore", gpus=1),
    Mutant("flash_varlen_not_causal", "the flash varlen kernel (GPU, bf16) attends to the later tokens of each "
           "packed sequence: bf16 packed training sees the future, both backends",
           "posttrain/models/packed_attention.py",
           (('{"window_size": (-1, 0)} if windowed else {"is_causal": True}',
             '{"window_size": (-1, -1)} if windowed else {"is_causal": False}'),),
           (f"{LAYER_SPEC_TESTS}::test_packed_sequences_attend_as_megatrons_attention_over_each_sequence_alone",
            "tests/unit/models/megatron/test_megatron_packing.py::"
            "test_bf16_mixed_packing_runs_the_flash_kernel_and_scores_as_padded_rows"),
           klass="training", tier="mcore", gpus=1),
    Mutant("causal_attention_not_causal", "right-padded rows attended without a mask and not causally: every "
           "token sees the later tokens of its row (a GPU worker's default attention)",
           "posttrain/models/policy/causal_attention.py",
           (("value, None, dropout=dropout, scaling=scaling, is_causal=True)",
             "value, None, dropout=dropout, scaling=scaling, is_causal=False)"),),
           ("tests/unit/models/policy/test_causal_attention.py",), klass="training"),
    Mutant("right_padding_unchecked", "a left-padded batch reaches workers that attend causally without its mask: "
           "its real tokens attend to padding and lose their first positions, silently",
           "posttrain/data/batch.py", (("        if wrong.any():\n            row, position",
                                        "        if False:\n            row, position"),),
           ("tests/unit/models/policy/test_causal_attention.py",), klass="training"),
    Mutant("causal_attention_off_on_gpu", "a GPU worker keeps transformers' masked sdpa: right, and the attention "
           "kernels compute the whole square (2.2x the causal backward at 0.39B; always so under compile)",
           "posttrain/models/policy/hf_policy_worker.py",
           (('        elif self.device.type == "cuda" and self.model.config._attn_implementation == "sdpa":',
             '        elif False:'),),
           ("tests/unit/models/policy/test_causal_attention.py::"
            "test_on_a_gpu_a_worker_attends_causally_and_as_the_masked_worker",), klass="performance", tier="mcore",
           gpus=1),
    Mutant("megatron_packing_key_ignored", "policy.sequence_packing=true on the Megatron backend trains on padded "
           "rows: the same numbers, none of the speed asked for", "posttrain/models/policy/megatron_policy_worker.py",
           (("            if self.cfg.sequence_packing:  # one stage", "            if False:  # one stage"),),
           ("tests/unit/models/megatron/test_megatron_packing.py::"
            "test_a_packing_megatron_worker_scores_and_trains_as_the_hf_worker",), klass="config", tier="mcore",
           gpus=1),
    # issue 35: torch's foreach kernels as megatron-core's multi-tensor ops (models/megatron/multi_tensor.py)
    Mutant("megatron_foreach_norm_sums_norms", "the Megatron optimizer's gradient norm adds the tensors' norms "
           "instead of taking the norm of all: a larger norm logged and clipping where none is due",
           "posttrain/models/megatron/multi_tensor.py",
           (("torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))",
             "torch.stack([n.float() for n in norms]).sum()"),),
           ("tests/unit/models/megatron/test_multi_tensor.py",  # CPU; on a GPU also the train-step parity
            f"{MCORE_TESTS}::test_train_steps_equal_the_hf_workers"), klass="megatron"),
    Mutant("megatron_master_weights_not_copied", "bf16-mixed: the optimizer updates its fp32 master weights and "
           "never copies them into the bf16 model: the loss prints, the model never changes",
           "posttrain/models/megatron/multi_tensor.py",
           (("    if scale == 1.0:\n        torch._foreach_copy_(dst, src)", "    if scale == 1.0:\n        pass"),),
           ("tests/unit/models/megatron/test_multi_tensor.py",  # CPU; on a GPU also the bf16 learning test
            f"{MCORE_TESTS}::test_bf16_mixed_keeps_fp32_master_weights_and_learns"), klass="megatron"),
    # issue 33, the engine in place (models/generation/megatron/in_place.py)
    Mutant("in_place_engine_serves_unpublished_weights", "the in-place megatron engine generates between a train step "
           "and its refit: completions of weights no probe checked, labelled with the previous version",
           IN_PLACE, (("        if self.served_version != self.weight_version:", "        if False:"),),
           (f"{MCORE_IN_PLACE_TESTS}::test_a_train_step_is_served_only_after_the_refit_publishes_it",),
           klass="megatron-generation", tier="mcore", gpus=1),
    Mutant("in_place_refit_publishes_nothing", "an in-place refit answers without publishing the version: the "
           "engine keeps labelling completions with the old one", IN_PLACE,
           (("        self.served_version = version\n", "        pass\n"),),
           (f"{MCORE_IN_PLACE_TESTS}::test_a_train_step_is_served_only_after_the_refit_publishes_it",),
           klass="stale-engine", tier="mcore", gpus=1),
    Mutant("in_place_engine_samples_the_reference", "the in-place engine samples from the frozen reference model, "
           "not the one the policy trains: generation never sees a train step", IN_PLACE,
           (("MegatronSampler(unwrap(self.model),", "MegatronSampler(unwrap(self.reference or self.model),"),),
           (f"{MCORE_IN_PLACE_TESTS}::test_a_train_step_is_served_only_after_the_refit_publishes_it",),
           klass="megatron-generation", tier="mcore", gpus=1),
    Mutant("in_place_over_an_hf_policy", "a colocated megatron engine over an HF policy is taken for the policy's "
           "own workers: no engine of its own, no bundle, no weights", "posttrain/models/generation/backends.py",
           (("row.in_place is not None and policy_backend == backend", "row.in_place is not None"),),
           ("tests/unit/models/megatron/test_backend_checks.py::"
            "test_a_colocated_megatron_engine_over_a_megatron_policy_takes_no_bundle_of_its_own",), klass="config"),
    # issue 36, check-metrics --report: plots that show something other than what was judged
    Mutant("report_bound_line_not_drawn", "a rule's plot has no line at its bound: the margin cannot be seen",
           REPORT_PLOTS,
           (("            ax.axhline(level.y, color=colour, ls=style, lw=width, label=level.label, gid=gid, zorder=4)",
             "            pass  # the bound line is not drawn"),),
           (REPORT_TESTS,), klass="report"),
    Mutant("report_bound_drawn_at_the_value", "the bound line is drawn at the value the rule computed: every rule "
           "looks like it sits on its bound", REPORT_SPEC,
           (('levels.append(Level(value_read.metric, bound, f"bound {bound:.4g}"',
             'levels.append(Level(value_read.metric, value if value is not None else bound, f"bound {bound:.4g}"'),),
           (REPORT_TESTS,), klass="report"),
    Mutant("report_nan_points_dropped", "NaN and inf steps are dropped from the plotted series: the plot of a "
           "failing all_finite rule looks clean", REPORT_SPEC,
           (("return Trace(metric, tuple(value.steps), tuple(value.step_values))",
             "return Trace(metric, *zip(*[(s, v) for s, v in zip(value.steps, value.step_values) "
             "if math.isfinite(v)]))"),),
           (REPORT_TESTS,), klass="report"),
    Mutant("report_nan_markers_not_drawn", "non-finite values leave a gap in the line but no marker or label",
           REPORT_PLOTS,
           (('        _draw_non_finite(ax, trace, f"rule-{index}-nonfinite-{k}")', "        pass"),),
           (REPORT_TESTS,), klass="report"),
    Mutant("report_vacuous_not_flagged", "a VACUOUS rule's plot looks like a pass: no banner", REPORT_PLOTS,
           (('    if result.status == "VACUOUS":', '    if result.status == "VACUOUS!":'),),
           (REPORT_TESTS,), klass="report"),
    Mutant("report_failing_steps_not_ringed", "the steps beyond the bound are not marked on the plot",
           REPORT_SPEC, (("failing += _beyond(value_read, op, bound, data)", "failing += []"),),
           (REPORT_TESTS,), klass="report"),
    # issue 36, check-metrics calibrate and functional-trend
    Mutant("calibrate_ignores_the_false_alarm_rate", "the recommended bound is the 1% one whatever "
           "--false-alarm-rate says", CALIBRATE,
           (("student_t_quantile(1 - false_alarm_rate, n - 1)", "student_t_quantile(0.99, n - 1)"),),
           (CALIBRATE_TESTS,), klass="calibration"),
    Mutant("calibrate_no_small_n_widening", "the bound forgets that the next run varies too (no sqrt(1 + 1/n)): "
           "healthy runs false-alarm more often than stated", CALIBRATE,
           (("* math.sqrt(1 + 1 / n)", "* 1.0"),), (CALIBRATE_TESTS,), klass="calibration"),
    Mutant("calibrate_bound_on_the_wrong_side", "an upper bound is recommended below the healthy runs' mean",
           CALIBRATE, (("centre + k * spread if upper else centre - k * spread",
                        "centre - k * spread if upper else centre + k * spread"),),
           (CALIBRATE_TESTS,), klass="calibration"),
    Mutant("calibrate_log_scale_ignored", "--log-scale calibrates the raw values: a right-skewed quantity's bound "
           "sits too near its healthy runs", CALIBRATE,
           (("    return math.exp(bound) if log_scale else bound\n", "    return bound\n"),
            ("        values = [math.log(v) for v in values]\n", "        pass\n")),
           (CALIBRATE_TESTS,), klass="calibration"),
    Mutant("trend_compares_with_the_newest_run", "the final value's band is built from the newest run itself "
           "instead of the history: nothing ever drifts", TREND,
           (("[final_value(r.metrics.get(name)) for r in history]",
             "[final_value(newest.metrics.get(name)) for r in history]"),), (TREND_TESTS,), klass="drift"),
    Mutant("trend_history_includes_failing_runs", "runs that failed their rules are part of the healthy band",
           TREND, (("history = [r for r in runs[:-1] if r.passed][-args.history:]",
                    "history = runs[:-1][-args.history:]"),), (TREND_TESTS,), klass="drift"),
    # issue 37: placement across nodes (cluster.placement_strategy, distributed/node_placement.py)
    Mutant("placement_strategy_key_ignored", "cluster.placement_strategy never reaches the reservation: every run "
           "packs its workers (PACK) whatever the user asked for", "posttrain/algorithms/runtime.py",
           (("cluster.gpus_per_worker, cluster.placement_strategy)", "cluster.gpus_per_worker)"),),
           (f"{PLUMBING}[cluster.placement_strategy]",), klass="config"),
    Mutant("placement_group_ignores_the_strategy", "the virtual cluster asks Ray for a PACK placement group "
           "whatever the strategy it was given", "posttrain/distributed/ray_cluster.py",
           (("* num_bundles, strategy=strategy)", "* num_bundles, strategy=\"PACK\")"),),
           (f"{NODE_PLACEMENT}::test_the_strategy_reaches_the_placement_group",), klass="placement"),
    Mutant("placement_strategy_check_skipped", "a strategy the nodes cannot hold is not refused: the placement "
           "group waits for nodes that never come, and the run stops only at the reservation's timeout",
           "posttrain/distributed/ray_cluster.py",
           (("        check_placement(strategy, self.bundle, num_bundles, alive_node_resources())\n", ""),),
           (f"{NODE_PLACEMENT}::test_a_strategy_the_nodes_cannot_hold_is_refused_before_anything_is_reserved",
            f"{MULTINODE}::test_a_strategy_the_nodes_cannot_hold_is_one_line_and_exit_2"), klass="placement"),
    Mutant("strict_spread_counts_nodes_too_small", "STRICT_SPREAD's check counts every node, also those too small "
           "for a bundle: a layout Ray can never place passes", "posttrain/distributed/node_placement.py",
           (("holding_one < num_bundles", "len(nodes) < num_bundles"),),
           (f"{NODE_PLACEMENT}::test_strict_spread_needs_a_node_per_bundle",), klass="placement"),
    Mutant("engine_node_taken_for_the_policys", "the engines are reported on the policy's node without asking "
           "them: the runtime line and placement/* say the refit stays on one node when it crosses two",
           "posttrain/algorithms/runtime.py",
           (("engine_nodes = gen.node_ids() if gen is not None else []",
             "engine_nodes = policy_nodes[:1] * gen.num_engines if gen is not None else []"),),
           ("tests/unit/algorithms/test_runtime.py::"
            "test_the_runtime_line_and_placement_metrics_name_the_node_the_engine_reports",
            f"{MULTINODE}::test_grpo_with_the_engine_on_another_node_refits_across_nodes_exactly"),
           klass="placement"),
    Mutant("lost_node_not_named", "a worker that died with its node is reported without the node: the user "
           "cannot tell a lost machine from a crashed process", "posttrain/distributed/worker_group.py",
           (("where = self._where(ranks[0]) if ranks and self._nodes is not None else \"\"", "where = \"\""),),
           ("tests/unit/distributed/test_worker_group.py::"
            "test_once_the_nodes_are_known_a_worker_that_dies_is_named_with_its_node",
            f"{MULTINODE}::test_a_lost_worker_node_ends_the_run_in_one_line_naming_it_and_the_run_resumes_exactly"),
           klass="placement"),
    Mutant("dead_worker_not_named", "a worker that died is reported as 'a worker': the user cannot tell the engine "
           "from the policy, nor which rank was lost", "posttrain/distributed/worker_group.py",
           (('raise WorkerDiedError(f"{who} died during {method}{where}: {reason}")',
             'raise WorkerDiedError(f"a worker died during {method}{where}: {reason}")'),),
           ("tests/unit/distributed/test_worker_group.py::test_a_worker_that_dies_mid_call_is_one_line_naming_it",
            f"{MULTINODE}::test_a_killed_engine_actor_ends_the_run_in_one_line_naming_it_and_the_run_resumes_exactly"),
           klass="placement"),
    Mutant("train_step_recomputes_forwards", "each micro-batch's forward runs three more times without gradients "
           "(a recompute, as a logging change might add): the train step takes 2x as long and learns the same",
           "posttrain/models/policy/base_policy_worker.py",
           ((MICRO_LOSS, "            with torch.no_grad():\n"
                         "                for _ in range(3):\n"
                         "                    self._completion_logprobs(self.model, mb.batch, self.cfg.top_k,\n"
                         "                                              self.cfg.top_p, with_entropy=True)\n"
             + MICRO_LOSS),),
           (f"{STEP_TIME}::test_the_train_step_costs_less_than_gate_plain_torch_steps",), klass="performance"),
    Mutant("reference_timing_period_ignored", "policy.reference_timing_period never reaches the worker: no call is "
           "timed, and a gate on timing/train_over_reference has nothing to judge",
           "posttrain/models/policy/base_policy_worker.py",
           (("timed = period > 0 and (self.weight_version + 1) % period == 0", "timed = False"),),
           (f"{STEP_TIME}::test_the_period_picks_the_timed_calls_and_the_ratio_is_train_over_reference",),
           klass="performance"),
    Mutant("step_time_ratio_inverted", "timing/train_over_reference is the reference over the train call: a slower "
           "train step lowers it, and the gate passes what it exists to fail",
           "posttrain/models/policy/base_policy_worker.py",
           (('"timing/train_over_reference": train_seconds / reference}',
             '"timing/train_over_reference": reference / train_seconds}'),),
           (f"{STEP_TIME}::test_the_gate_fails_a_train_step_made_twice_as_slow",), klass="performance"),
    Mutant("step_time_gate_bound_loosened", "grpo.sh's step-time gate bound raised from 1.8 to 3: a train step "
           "2x slower (2.56) passes", "tests/functional/grpo.sh",
           (("${TRAIN_OVER_REFERENCE_MAX:-1.8}", "${TRAIN_OVER_REFERENCE_MAX:-3}"),),
           ("tests/unit/testing/rules/test_rule_real_runs.py",), klass="performance"),
    Mutant("peer_death_hidden_behind_its_closed_socket", "a broadcast whose sender died mid-refit reports the "
           "receivers' closed socket (a traceback), not the lost worker", "posttrain/distributed/worker_group.py",
           (("            second.gather(done, second.method)\n", "            pass\n"),),
           ("tests/unit/distributed/test_worker_group.py::test_a_collective_whose_peer_died_reports_the_death_not_"
            "the_closed_socket",), klass="placement"),
    Mutant("refit_join_waits_in_turn", "the broadcast refit waits for the engines' join, then the policy's: a policy "
           "worker lost while joining is reported as the engines' closed socket", "posttrain/weight_sync/refit.py",
           (("        wait_both(engines.start_joining_broadcast(host, port, world_size, BROADCAST_TIMEOUT_S), "
             "joining)\n",
             "        engines.start_joining_broadcast(host, port, world_size, BROADCAST_TIMEOUT_S).wait()\n"
             "        joining.wait()\n"),),
           ("tests/unit/weight_sync/test_refit_worker_death.py",), klass="placement"),
    Mutant("refit_transfer_waits_in_turn", "the broadcast refit waits for the receivers, then the sender: a policy "
           "worker lost mid-send is reported as the engines' closed socket", "posttrain/weight_sync/refit.py",
           (("    receipt, (trainer_probe, buckets, sent) = wait_both(engines.start_receiving(version, engine_probe), "
             "sending)\n",
             "    receipt = engines.start_receiving(version, engine_probe).wait()\n"
             "    trainer_probe, buckets, sent = sending.wait()\n"),),
           ("tests/unit/weight_sync/test_refit_worker_death.py",), klass="placement"),
    # a rule's comparison read by a second tool (class "comparison")
    Mutant("less_or_equal_made_strict", "`<=` fails at its bound, as `<` does: a run exactly on a `<=` bound fails, "
           "and every tool reads the bound as strict", COMPARISONS,
           (('ast.LtE: Comparison("<=", upper=True, strict=False)',
             'ast.LtE: Comparison("<=", upper=True, strict=True)'),),
           (f"{COMPARISON_TESTS}::test_the_checker_decides_each_operator_as_python_does_at_and_around_the_bound",),
           klass="comparison"),
    Mutant("calibrate_flips_a_difference_rule", "a rule whose bound reads the metrics "
           "(`mean(r, -20) > mean(r, 1, 21)`) is calibrated as if its bound were on the left: the margin is "
           "recommended on the wrong side of the healthy runs", CALIBRATE,
           (("bound_on_left = right_reads and not left_reads", "bound_on_left = right_reads"),),
           (f"{COMPARISON_TESTS}::test_a_rule_whose_bound_reads_the_metrics_is_calibrated_on_the_side_the_checker_fails",),
           klass="comparison"),
    Mutant("margin_slack_on_the_value_side", "a margin's slack taken value-minus-bound with the operator as written: "
           "`0.05 < min(m)` reports a passing run's margin as negative and a failing one's as positive",
           "posttrain/testing/rules/margins.py",
           (("gap = comparison.slack(link.left, link.right)", "gap = comparison.slack(value, bound)"),),
           (f"{COMPARISON_TESTS}::test_a_margins_sign_is_the_verdicts_and_zero_is_the_bound_itself",),
           klass="comparison"),
    Mutant("plot_bound_on_the_left_not_flipped", "the report reads `2 < max(m)` as `max(m) < 2`: it shades and rings "
           "the side of the bound the checker passes", REPORT_SPEC,
           (("op = seen_from_the_value(written, bound_on_left)", "op = written"),),
           (f"{COMPARISON_TESTS}::test_the_plot_shades_and_rings_where_the_checker_fails",), klass="comparison"),
    Mutant("gauge_holds_from_the_value_side", "the gauge colours a link by the operator seen from the value side "
           "applied to the sides as written: `2 < max(m)` shows red where the checker passes",
           REPORT_SPEC, (("holds = written.holds(link.left, link.right)", "holds = op.holds(link.left, link.right)"),),
           (f"{COMPARISON_TESTS}::test_the_plot_shades_and_rings_where_the_checker_fails",), klass="comparison"),
    Mutant("calibrate_broken_margin_sign", "calibration reports a broken run's distance past the recommended bound "
           "with its sign flipped: a caught run reads as 'beyond by -3 std'", CALIBRATE,
           (("past = -op.slack(value, cal.recommended_bound)", "past = op.slack(value, cal.recommended_bound)"),),
           (f"{COMPARISON_TESTS}::test_calibration_reads_each_operator_as_the_checker_does",), klass="comparison"),
    # a format check that bounds one side only (class "one-sided-format")
    Mutant("recording_accepts_extra_samples", "a recorded step with more samples than its header's P * G is "
           "replayed: the run trains on rows no step of this shape sampled", RECORDING,
           (("len(samples) != num_prompts * completions_per_prompt",
             "len(samples) < num_prompts * completions_per_prompt"),),
           (RECORDING_FORMAT,), klass="one-sided-format"),
    Mutant("recording_accepts_extra_logprobs", "a recorded sample with more generation logprobs than completion tokens "
           "is replayed: the train batch cuts the extra ones off, misaligned behaviour logprobs pass unseen",
           RECORDING, (("if logprobs != completion:", "if logprobs < completion:"),), (RECORDING_FORMAT,),
           klass="one-sided-format"),
    Mutant("recording_seq_len_checked_one_way", "a recorded sample whose seq_len is more than its tokens is replayed",
           RECORDING, (('if sample["seq_len"] != tokens:', 'if sample["seq_len"] < tokens:'),), (RECORDING_FORMAT,),
           klass="one-sided-format"),
    Mutant("lora_resume_ignores_missing_adapter_tensors", "a LoRA checkpoint whose adapter lacks tensors resumes: "
           "those adapters restart from their initialization in a run that reports it resumed",
           "posttrain/models/policy/lora.py",
           (('lost = [key for key in missing if ".lora_" in key]',
             'lost = [key for key in unexpected if ".lora_" in key]'),),
           (f"{LORA}::test_a_checkpoint_whose_adapter_lacks_a_tensor_or_has_one_too_many_is_refused",),
           klass="one-sided-format"),
    Mutant("resume_rank_count_checked_one_way", "a checkpoint written by fewer ranks than the run has resumes: "
           "a rank finds no state of its own (a data-parallel or tensor-parallel resume at another size)",
           "posttrain/utils/checkpoint.py", (("    if saved != current:\n", "    if saved > current:\n"),),
           ("tests/unit/utils/test_checkpoint_dirs.py::"
            "test_a_checkpoint_written_by_more_or_fewer_ranks_than_the_run_has_is_refused_in_one_line",),
           klass="one-sided-format"),
    # a prefix checked by length, not by content (class "prefix")
    Mutant("sft_prompt_prefix_checked_by_length", "SFT checks only that the conversation is as long as the generation "
           "prompt: a template that renders an answered user turn differently trains on a prompt GRPO never samples",
           "posttrain/data/chat.py",
           (("if tuple(full[: len(prompt)]) != prompt:", "if len(full[: len(prompt)]) != len(prompt):"),),
           ("tests/unit/data/test_chat.py::"
            "test_a_template_that_renders_an_answered_user_turn_differently_is_refused_in_one_line",),
           klass="prefix"),
    Mutant("replayed_prompt_checked_by_length", "a replay checks a recorded prompt's length against this run's prompt "
           "of its question: a recording of another tokenizer or template trains on prompts this run never samples",
           RECORDING, (("if list(recorded) != list(prompt):", "if len(recorded) != len(prompt):"),),
           ("tests/unit/algorithms/test_rollout_recording_format.py::"
            "test_a_replayed_prompt_must_be_this_runs_prompt_of_its_question_token_for_token",),
           klass="prefix"),
    Mutant("replayed_prompts_unchecked", "GRPO replays a recording without comparing its prompts with this run's",
           "posttrain/algorithms/grpo.py",
           (("                                                               rt.chat.prompt))",
             "                                                               None))"),),
           ("tests/integration/test_rollout_recording.py::"
            "test_a_replay_of_a_recording_whose_prompt_is_not_this_runs_stops_before_training",),
           klass="prefix"),
    # --- a global quantity from one rank's shard (data parallelism, FSDP2 over gloo) ---------------
    Mutant("data_parallel_extremes_summed", "the ranks' probability-ratio minima and maxima are summed, not "
           "reduced by min / max: a step whose ratios all read 1 reports 2",
           "posttrain/models/policy/base_policy_worker.py",
           (('for k in keys], "max")', 'for k in keys], "sum")'),), (DP_POLICY_STEP, DP_STEP),
           klass="global-from-shard"),
    Mutant("data_parallel_idle_extremes_zero", "a rank's idle micro-batch reports 0 for every metric, its extremes "
           "too: the global ratio minimum reads 0", "posttrain/models/policy/base_policy_worker.py",
           (('math.inf if k.endswith("_min") else -math.inf if k.endswith("_max") else 0.0', "0.0"),),
           (DP_POLICY_STEP, DP_STEP),
           klass="global-from-shard"),
    Mutant("inf_gradient_step_taken", "only a NaN norm skips the step: an overflowed (+inf) gradient is clipped "
           "to NaN and applied", HF_WORKER, (("if math.isfinite(grad_norm):", "if not math.isnan(grad_norm):"),),
           (f"{HF_WORKER_TESTS}::test_a_step_whose_gradient_overflowed_to_inf_is_skipped_and_the_next_one_trains",
            DP_FAULT), klass="nan"),
    # --- a per-step metric read from a running total -----------------------------------------------
    Mutant("grpo_step_clock_started_once", "timing/step is read from a clock started once before the loop: "
           "every step reports the run so far", "posttrain/algorithms/grpo.py",
           (("        for step in range(resumed_at + 1, cfg.grpo.num_steps + 1):\n"
             "            start = time.perf_counter()\n",
             "        start = time.perf_counter()\n"
             "        for step in range(resumed_at + 1, cfg.grpo.num_steps + 1):\n"),),
           (LOOP_TIMING,), klass="running-counter"),
    Mutant("timer_pop_keeps_durations", "Timer.pop hands the durations over without resetting them: every "
           "timing/<phase> adds up the run so far", "posttrain/utils/timer.py",
           (("        self._durations = {}\n", ""),), (LOOP_TIMING, ASYNC_TIMING), klass="running-counter"),
    Mutant("async_overlap_from_the_running_total", "async/overlap_seconds is the producer's sampling seconds "
           "of the whole run, not of this step", "posttrain/algorithms/async_grpo.py",
           (("max(sampled - sampled_before - waited, 0.0)", "max(sampled - waited, 0.0)"),), (ASYNC_TIMING,),
           klass="running-counter"),
    Mutant("producer_clock_started_once", "the producer times its sampling from a clock started once: each batch "
           "adds the thread's whole life to the sampling seconds", "posttrain/algorithms/rollout_producer.py",
           (("        batch = self.next_batch\n        try:\n",
             "        batch = self.next_batch\n        start = time.perf_counter()\n        try:\n"),
            ("                start = time.perf_counter()\n                rollouts", "                rollouts")),
           (ASYNC_TIMING,), klass="running-counter"),
    Mutant("async_buffer_size_counts_every_put", "async/buffer_size counts every sample ever put, not those held",
           "posttrain/algorithms/async_grpo.py",
           (("buffer.status().size - len(claimed)", "buffer.status().put_total - len(claimed)"),), (ASYNC_TIMING,),
           klass="running-counter"),
    # --- config keys nothing reads: on one backend, or in a whole run -------------------------------
    Mutant("hf_engine_threads_unread", "the hf engine never reads generation.num_threads: its torch threads stay 1 "
           "whatever the key says", "posttrain/models/generation/hf_generation_worker.py",
           (("torch.set_num_threads(cfg.num_threads)", "torch.set_num_threads(1)"),),
           (f"{READERS}::test_every_config_key_is_read_or_refused_on_every_backend",
            f"{PLUMBING}[generation.num_threads]"), klass="config"),
    Mutant("megatron_optimizer_betas_unread", "the Megatron optimizer is built with AdamW's default betas: "
           "policy.betas reaches the hf backend only (caught on a CPU, by the sources)",
           "posttrain/models/megatron/model.py",
           (("adam_beta1=cfg.betas[0]", "adam_beta1=0.9"), ("adam_beta2=cfg.betas[1]", "adam_beta2=0.999")),
           (f"{READERS}::test_every_config_key_is_read_or_refused_on_every_backend",), klass="config"),
    Mutant("vllm_kv_capacity_unread", "the vLLM engine sizes its KV cache and batch with 256 sequences whatever "
           "generation.max_num_seqs says", VLLM_WORKER,
           (("self.cfg.max_num_seqs, max_model_len)", "256, max_model_len)"),
            ("max_num_seqs=self.cfg.max_num_seqs,", "max_num_seqs=256,")),
           (f"{READERS}::test_every_config_key_is_read_or_refused_on_every_backend",), klass="config"),
    Mutant("fused_rms_norm_accepted_on_megatron", "policy.fused_rms_norm=false is accepted by the Megatron backend, "
           "which never reads it", "posttrain/config.py",
           (("    \"fused_rms_norm\": (\"hf\", \"it swaps transformers' RMSNorm modules; megatron-core builds its own "
             "norms\"),\n", ""),),
           (f"{READERS}::test_every_config_key_is_read_or_refused_on_every_backend",), klass="config"),
    Mutant("unread_key_check_off", "a run given a key it never reads trains on without a word",
           "posttrain/algorithms/unread_keys.py", (("    if unread:\n", "    if False:\n"),),
           ("tests/integration/test_unread_keys.py",), klass="config"),
)
