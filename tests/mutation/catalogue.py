"""Catalogue of mutants: deliberately broken variants of posttrain that train *silently*.

Each mutant is an exact text replacement in one library file. The runner
(``run_mutants.py``) applies it to a temporary copy of the repository and fails loudly when
an anchor is not found exactly once, so a refactor cannot quietly turn a mutant into a no-op:
update the anchor instead. Keep anchors small (one expression) so edits elsewhere in the
file leave them valid.

``first`` lists the tests expected to catch the mutant; the runner runs them first and falls
back to the whole fast tier, so a stale hint costs time, never a wrong verdict. Add a mutant
whenever a new silent-failure mode is found, and a test that catches it.
"""

from __future__ import annotations

from dataclasses import dataclass

LEARNING = "tests/integration/test_grpo_learning.py"


@dataclass(frozen=True)
class Mutant:
    """One silent failure.

    Attributes:
        name: short identifier (``--only NAME``).
        description: the silent failure it models, one line.
        path: the file to patch, relative to the repository root.
        replacements: ``(old, new)`` pairs; each ``old`` must occur exactly once in ``path``.
        first: pytest node ids (files or tests) most likely to catch it, run first.
    """

    name: str
    description: str
    path: str
    replacements: tuple[tuple[str, str], ...]
    first: tuple[str, ...] = ()


MUTANTS: tuple[Mutant, ...] = (
    Mutant("advantage_sign_flipped", "advantages are mean - reward: the policy learns to be wrong",
           "posttrain/algorithms/advantages.py",
           (("centered = grouped - grouped.mean(dim=1, keepdim=True)",
             "centered = grouped.mean(dim=1, keepdim=True) - grouped"),),
           ("tests/unit/test_advantages.py", f"{LEARNING}::test_high_reward_completion_gains_probability")),
    Mutant("advantages_over_whole_batch", "advantages normalized over the whole batch instead of per prompt group",
           "posttrain/algorithms/advantages.py",
           (("centered = grouped - grouped.mean(dim=1, keepdim=True)", "centered = grouped - grouped.mean()"),
            ("std = grouped.std(dim=1, keepdim=True)", "std = grouped.std()")),
           ("tests/unit/test_advantages.py", f"{LEARNING}::test_group_advantages_are_isolated_per_prompt")),
    Mutant("group_size_off_by_one", "each prompt sampled G+1 times, advantages grouped by G: groups straddle prompts",
           "posttrain/algorithms/grpo.py",
           (("g = cfg.grpo.completions_per_prompt", "g = cfg.grpo.completions_per_prompt + 1"),),
           (f"{LEARNING}::test_rollouts_come_in_contiguous_groups_of_one_prompt",)),
    Mutant("prompt_lens_off_by_one", "the train step scores tokens one position late (prompt_lens + 1)",
           "posttrain/models/policy/hf_policy_worker.py",
           (("mb.input_ids, mb.prompt_lens, width", "mb.input_ids, mb.prompt_lens + 1, width"),),
           (f"{LEARNING}::test_first_update_reads_the_loss_and_ratio_at_one",)),
    Mutant("loss_mask_includes_padding", "the policy-gradient loss is summed over padding tokens too",
           "posttrain/models/policy/hf_policy_worker.py",
           (('{"completion_mask": mb.completion_mask,', '{"completion_mask": torch.ones_like(mb.completion_mask),'),),
           (f"{LEARNING}::test_first_update_reads_the_loss_and_ratio_at_one",)),
    Mutant("loss_mask_drops_last_token", "the completion mask drops each completion's last token (EOS never trained)",
           "posttrain/data/batch.py",
           (("completion_mask[i, :n_c] = 1.0", "completion_mask[i, : n_c - 1] = 1.0"),),
           ("tests/unit/test_make_batch.py",)),
    Mutant("kl_against_current_policy", "reference logprobs come from the current policy: the KL penalty never binds",
           "posttrain/models/policy/hf_policy_worker.py",
           (("model = self.reference if reference else self.model", "model = self.model"),),
           (f"{LEARNING}::test_reference_policy_stays_frozen",
            f"{LEARNING}::test_larger_kl_coefficient_stays_closer_to_the_reference")),
    Mutant("ratio_clipping_disabled", "the probability ratio is never clipped: updates are unbounded",
           "posttrain/algorithms/loss_functions.py",
           (("clipped = ratio.clamp(1.0 - self.clip_eps, 1.0 + self.clip_eps)", "clipped = ratio"),),
           (f"{LEARNING}::test_tokens_outside_the_clip_range_get_no_update", "tests/unit/test_loss_functions.py")),
    Mutant("refit_skipped", "the GRPO loop never syncs weights to the generation engine: it samples the initial policy",
           "posttrain/algorithms/grpo.py",
           # a call to a no-op that returns no probe metrics: fits `refit(...)` with or without the probe
           (("refit(rt.policy, rt.generation", "(lambda *args: {})(rt.policy, rt.generation"),),
           ("tests/integration/test_grpo_loop_refit.py",)),
    Mutant("grads_zeroed_before_step", "gradients are zeroed between backward and the optimizer step: nothing moves",
           "posttrain/models/policy/hf_policy_worker.py",
           (("self.optimizer.step()", "self.optimizer.zero_grad(set_to_none=False); self.optimizer.step()"),),
           (f"{LEARNING}::test_high_reward_completion_gains_probability",)),
    Mutant("learning_rate_ignored", "the optimizer is built without the configured lr (torch's default 1e-3)",
           "posttrain/models/policy/hf_policy_worker.py",
           (('lr=cfg["lr"], weight_decay', "weight_decay"),),
           (f"{LEARNING}::test_learning_rate_sets_the_update_size",)),
    Mutant("reward_from_wrong_sample", "each completion is judged against the next rollout's problem",
           "posttrain/algorithms/grpo.py",
           (("zip(texts, rollouts.problems, strict=True)",
             "zip(texts, rollouts.problems[1:] + rollouts.problems[:1], strict=True)"),),
           (f"{LEARNING}::test_each_reward_is_judged_against_its_own_problem",)),
    # beyond the list
    Mutant("engine_ignores_weights", "the generation engine takes the new weight version but keeps its old weights",
           "posttrain/models/generation/hf_generation_worker.py",
           (("self.model.load_state_dict(weights, strict=True)", "pass"),),
           ("tests/unit/algorithms/test_runtime_refit.py",)),
    Mutant("logits_not_shifted", "completion token j is scored by the logits at its own position, not the one before",
           "posttrain/ops.py",
           (("positions = completion_positions(prompt_lens, completion_len, seq_len) - 1",
             "positions = completion_positions(prompt_lens, completion_len, seq_len)"),),
           ("tests/unit/test_compute_logprobs.py",)),
    Mutant("trainer_ignores_temperature", "the trainer scores tokens at temperature 1 while the engine samples at T",
           "posttrain/ops.py",
           (("completion_logits(logits, prompt_lens, completion_len).float() / temperature",
             "completion_logits(logits, prompt_lens, completion_len).float()"),),
           ("tests/unit/test_compute_logprobs.py",)),
    Mutant("dr_grpo_std_normalized", "Dr. GRPO advantages are still divided by the group std",
           "posttrain/algorithms/advantages.py",
           (("return centered.reshape(-1)",
             "return (centered / (grouped.std(dim=1, keepdim=True) + eps)).reshape(-1)"),),
           ("tests/unit/test_advantages.py", f"{LEARNING}::test_dr_grpo_advantages_are_mean_centred_and_learn")),
    Mutant("keeps_zero_variance_groups_only", "the zero-variance filter is inverted: only groups with no signal train",
           "posttrain/algorithms/grpo.py",
           (("keep = varied if varied.any() else keep", "keep = ~varied if varied.any() else keep"),),
           (f"{LEARNING}::test_group_advantages_are_isolated_per_prompt",)),
    Mutant("ratio_against_itself", "old logprobs replaced by the current ones: the ratio is always 1, never clipped",
           "posttrain/algorithms/loss_functions.py",
           (('logprobs - data["old_logprobs"]', "logprobs - logprobs.detach()"),),
           (f"{LEARNING}::test_tokens_outside_the_clip_range_get_no_update", "tests/unit/test_loss_functions.py")),
    Mutant("padding_ratio_not_masked", "padding's log-ratio is exponentiated before masking: exp(inf) * 0 = NaN",
           "posttrain/algorithms/loss_functions.py",
           (('torch.where(mask > 0, logprobs - data["old_logprobs"], torch.zeros_like(logprobs))',
             'logprobs - data["old_logprobs"]'),),
           (f"{LEARNING}::test_loss_and_gradients_stay_finite", "tests/unit/test_loss_functions.py")),
)
