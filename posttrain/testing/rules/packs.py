"""RL rule packs: the standard health checks of a GRPO or SFT run, without writing them.

``--pack grpo`` adds: loss and grad norm finite on every step, grad norm non-zero on every
step, reward groups not all zero-variance on any step, entropy above a floor, KL finite
(when logged: a run with ``kl_coef`` 0 scores no reference policy),
generation/trainer logprob agreement within a bound (when that metric is logged), and
loss, grad norm, entropy, KL (when logged) and mean reward not constant over the run.
``--pack sft`` adds the loss / grad-norm / entropy checks, a finite ``val/loss``, and loss,
grad norm, entropy and ``val/loss`` not constant (entropy and ``val/loss`` when logged).
Bounds have defaults per pack and a CLI flag each (``PACK_BOUNDS``).

"Not constant" is ``std(...) > 0``: a metric frozen at one value (a logger that writes a
stale number, a loss that is not the one being optimized, a policy that never updates)
passes every range check while the run learns nothing. Only metrics that move in every
real run are checked: ``train/token_mult_prob_error`` and ``train/refit_*`` are exactly
1.0 / 0.0 on the Hugging Face engine, the learning rate may be constant, and the clip
fraction may be 0 on every step of a short run. ``val/loss`` is read from step 0 (the
evaluation before training), since a short run may evaluate only at step 0 and its last step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from posttrain.testing.rules.checker import RuleSpec


@dataclass(frozen=True)
class Bound:
    """A pack threshold: its CLI flag, default per pack, and what it bounds."""

    flag: str
    defaults: Mapping[str, float]
    help: str


# name -> bound; the CLI adds one flag per entry (``--min-entropy 0.1``).
PACK_BOUNDS: dict[str, Bound] = {
    "min_grad_norm": Bound("--min-grad-norm", {"grpo": 0.0, "sft": 0.0}, "every step's grad norm must exceed this"),
    "min_groups_kept": Bound(
        "--min-groups-kept", {"grpo": 0.0}, "every step's fraction of reward groups with variance must exceed this"
    ),
    "min_entropy": Bound("--min-entropy", {"grpo": 0.05, "sft": 0.01}, "every step's entropy must exceed this"),
    "max_logprob_error": Bound(
        "--max-logprob-error", {"grpo": 1.05}, "max train/token_mult_prob_error (1.0: engine and trainer agree)"
    ),
}


@dataclass(frozen=True)
class PackCheck:
    """One check of a pack: a rule template over ``{bound}``, and whether its metric is optional."""

    metric: str
    template: str
    bound: str | None = None
    optional: bool = False


def _m(metric: str) -> str:
    return f'data["{metric}"]'


def _moves(metric: str, optional: bool = False, from_step_0: bool = False) -> PackCheck:
    """``std(metric) > 0``: not the same value on every step (``from_step_0``: count the
    evaluation before training too; ``std`` starts at step 1 by default)."""
    window = ", 0" if from_step_0 else ""
    return PackCheck(metric, f"std({_m(metric)}{window}) > 0", optional=optional)


# fmt: off
PACKS: dict[str, tuple[PackCheck, ...]] = {
    "grpo": (
        PackCheck("train/loss", f"all_finite({_m('train/loss')})"),
        PackCheck("train/grad_norm", f"all_finite({_m('train/grad_norm')})"),
        PackCheck("train/grad_norm", f"min({_m('train/grad_norm')}) > {{min_grad_norm}}", "min_grad_norm"),
        PackCheck("train/fraction_groups_kept", f"min({_m('train/fraction_groups_kept')}) > {{min_groups_kept}}",
                  "min_groups_kept"),
        PackCheck("train/entropy", f"min({_m('train/entropy')}) > {{min_entropy}}", "min_entropy"),
        PackCheck("train/kl", f"all_finite({_m('train/kl')})", optional=True),
        PackCheck("train/token_mult_prob_error", f"max({_m('train/token_mult_prob_error')}) < {{max_logprob_error}}",
                  "max_logprob_error", optional=True),
        _moves("train/loss"), _moves("train/grad_norm"), _moves("train/entropy"), _moves("train/kl", optional=True),
        _moves("train/reward_mean"),
    ),
    "sft": (
        PackCheck("train/loss", f"all_finite({_m('train/loss')})"),
        PackCheck("train/grad_norm", f"all_finite({_m('train/grad_norm')})"),
        PackCheck("train/grad_norm", f"min({_m('train/grad_norm')}) > {{min_grad_norm}}", "min_grad_norm"),
        PackCheck("train/entropy", f"min({_m('train/entropy')}) > {{min_entropy}}", "min_entropy", optional=True),
        PackCheck("val/loss", f"all_finite({_m('val/loss')})", optional=True),
        _moves("train/loss"), _moves("train/grad_norm"), _moves("train/entropy", optional=True),
        _moves("val/loss", optional=True, from_step_0=True),
    ),
}
# fmt: on


def pack_rules(pack: str, data: Mapping[str, Any], overrides: Mapping[str, float | None]) -> list[RuleSpec]:
    """The rules of a pack, with bounds filled in; optional checks on absent metrics are SKIP.

    Args:
        pack: a key of ``PACKS``.
        data: the metrics (to see which optional metrics were logged).
        overrides: bound name -> value from the CLI (None: the pack's default).

    Returns:
        One RuleSpec per check, in the pack's order.

    Raises:
        KeyError: an unknown pack (the CLI restricts ``--pack`` to ``PACKS``).
    """
    specs = []
    for check in PACKS[pack]:
        bounds = {}
        if check.bound is not None:
            override = overrides.get(check.bound)
            bounds[check.bound] = PACK_BOUNDS[check.bound].defaults[pack] if override is None else override
        rule = check.template.format(**bounds)
        skip = f"{check.metric} not logged (optional check)" if check.optional and check.metric not in data else ""
        specs.append(RuleSpec(rule, skip))
    return specs
