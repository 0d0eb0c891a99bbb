"""Tests for posttrain.algorithms.loss_functions: k3 KL, the clipped PG loss and the NLL.

A wrong sign, a clip on the wrong side, a per-sequence instead of per-token mean, or a
padding token that leaks into the sum all leave a loss that decreases; the checks below
look at the gradient token by token instead.
"""

import math

import pytest
import torch

from posttrain.algorithms.loss_functions import ClippedPGLoss, NLLLoss, kl_k3


def _data(old, adv, mask, ref=None):
    old = torch.as_tensor(old, dtype=torch.float32)
    return {
        "old_logprobs": old,
        "ref_logprobs": old.clone() if ref is None else torch.as_tensor(ref, dtype=torch.float32),
        "advantages": torch.as_tensor(adv, dtype=torch.float32),
        "completion_mask": torch.as_tensor(mask, dtype=torch.float32),
    }


def _grad(loss_fn, logprobs, data, num_tokens):
    lp = torch.as_tensor(logprobs, dtype=torch.float32).clone().requires_grad_()
    loss, metrics = loss_fn(lp, data, num_tokens)
    loss.backward()
    return loss, lp.grad, metrics


def _random_batch(batch=4, length=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=gen) * 3
    logprobs = old + torch.randn(batch, length, generator=gen) * 0.3
    ref = old + torch.randn(batch, length, generator=gen) * 0.3
    adv = torch.randn(batch, generator=gen)
    mask = torch.ones(batch, length)
    for b in range(batch):
        mask[b, length - b :] = 0  # row b has length - b real tokens
    return logprobs, _data(old, adv, mask, ref)


def _hand_loss(logprobs, data, num_tokens, clip_eps, kl_coef, cap=None):
    total = 0.0
    batch, length = logprobs.shape
    for b in range(batch):
        a = float(data["advantages"][b])
        for t in range(length):
            if data["completion_mask"][b, t] == 0:
                continue
            lp, old, ref = float(logprobs[b, t]), float(data["old_logprobs"][b, t]), float(data["ref_logprobs"][b, t])
            ratio = math.exp(lp - old)
            clipped = min(max(ratio, 1 - clip_eps), 1 + clip_eps)
            pg = -min(ratio * a, clipped * a)
            if cap is not None:  # truncated importance weight pi_old / pi_behaviour, at most cap
                pg *= min(math.exp(old - float(data["behaviour_logprobs"][b, t])), cap)
            k3 = math.exp(ref - lp) - (ref - lp) - 1
            total += pg + kl_coef * k3
    return total / num_tokens


# --- kl_k3 -------------------------------------------------------------------------------


def test_kl_k3_is_zero_when_equal() -> None:
    lp = torch.tensor([[-0.1, -2.0, -7.5], [0.0, -30.0, -1e-3]])
    assert torch.equal(kl_k3(lp, lp.clone()), torch.zeros(2, 3))


def test_kl_k3_is_non_negative() -> None:
    gen = torch.Generator().manual_seed(0)
    lp = -torch.rand(64, 16, generator=gen) * 10
    ref = -torch.rand(64, 16, generator=gen) * 10
    kl = kl_k3(lp, ref)
    assert (kl >= 0).all()
    assert (kl > 0).any()


def test_kl_k3_matches_the_formula() -> None:
    lp = torch.tensor([-1.0, -0.5, -3.0, -0.2])
    ref = torch.tensor([-0.5, -1.5, -0.1, -0.2])
    expected = torch.tensor([math.exp(r - p) - (r - p) - 1 for p, r in zip(lp.tolist(), ref.tolist(), strict=True)])
    torch.testing.assert_close(kl_k3(lp, ref), expected)
    # k3 is not symmetric: swapping the arguments changes it (catches swapped operands)
    assert not torch.allclose(kl_k3(ref, lp), expected)


def test_kl_k3_stays_finite_far_off() -> None:
    kl = kl_k3(torch.tensor([-200.0, 0.0]), torch.tensor([0.0, -200.0]))
    assert torch.isfinite(kl).all()


# --- ClippedPGLoss: value ---------------------------------------------------------------


@pytest.mark.parametrize(("clip_eps", "kl_coef"), [(0.2, 0.0), (0.2, 0.1), (0.05, 0.5)])
def test_pg_loss_matches_hand_computation(clip_eps: float, kl_coef: float) -> None:
    logprobs, data = _random_batch()
    num_tokens = float(data["completion_mask"].sum())
    loss, metrics = ClippedPGLoss(clip_eps, kl_coef)(logprobs, data, num_tokens)
    expected = _hand_loss(logprobs, data, num_tokens, clip_eps, kl_coef)
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert metrics["loss"] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    hand_kl = _hand_loss(logprobs, {**data, "advantages": torch.zeros(4)}, num_tokens, clip_eps, 1.0)
    assert metrics["kl"] == pytest.approx(hand_kl, rel=1e-5)


# --- ClippedPGLoss: gradient ------------------------------------------------------------


def test_gradient_at_ratio_one_is_minus_advantage_over_num_tokens() -> None:
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -4.0], [-1.1, -1.2, -1.3]])
    adv = torch.tensor([0.8, -1.5, 2.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    num_tokens = 10.0  # the global batch has more tokens than this micro-batch
    _, grad, metrics = _grad(ClippedPGLoss(0.2, 0.0), old, _data(old, adv, mask), num_tokens)
    torch.testing.assert_close(grad, -adv[:, None] * mask / num_tokens)
    assert metrics["clip_fraction"] == 0.0
    assert metrics["kl"] == 0.0


def test_gradient_at_ratio_one_ignores_the_kl_term() -> None:
    """At logp == ref the k3 gradient 1 - exp(ref - logp) is zero, whatever kl_coef."""
    old = torch.tensor([[-1.0, -2.0]])
    data = _data(old, [0.5], [[1.0, 1.0]])
    _, grad, _ = _grad(ClippedPGLoss(0.2, 0.7), old, data, 2.0)
    torch.testing.assert_close(grad, torch.tensor([[-0.25, -0.25]]))


def test_clipped_tokens_get_zero_gradient() -> None:
    eps = 0.2
    # token ratios: 1.5 (above 1 + eps), 0.5 (below 1 - eps), 1.1 (inside)
    old = torch.zeros(2, 3)
    logprobs = torch.log(torch.tensor([[1.5, 0.5, 1.1], [1.5, 0.5, 1.1]]))
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 3)
    _, grad, _ = _grad(ClippedPGLoss(eps, 0.0), logprobs, _data(old, adv, mask), 6.0)
    ratio = torch.exp(logprobs)
    # A > 0: ratio > 1 + eps is clipped (zero gradient); ratio < 1 - eps is not
    assert grad[0, 0].item() == 0.0
    assert grad[0, 1].item() == pytest.approx(-1.0 * ratio[0, 1].item() / 6.0)
    assert grad[0, 2].item() == pytest.approx(-1.0 * ratio[0, 2].item() / 6.0)
    # A < 0: ratio < 1 - eps is clipped (zero gradient); ratio > 1 + eps is not
    assert grad[1, 1].item() == 0.0
    assert grad[1, 0].item() == pytest.approx(1.0 * ratio[1, 0].item() / 6.0)
    assert grad[1, 2].item() == pytest.approx(1.0 * ratio[1, 2].item() / 6.0)


def test_disabling_the_clip_changes_loss_and_gradient() -> None:
    old = torch.zeros(1, 2)
    logprobs = torch.log(torch.tensor([[1.5, 1.1]]))
    data = _data(old, [1.0], [[1.0, 1.0]])
    loss_c, grad_c, _ = _grad(ClippedPGLoss(0.2, 0.0), logprobs, data, 2.0)
    loss_u, grad_u, _ = _grad(ClippedPGLoss(1e6, 0.0), logprobs, data, 2.0)
    assert loss_c.item() != pytest.approx(loss_u.item())
    assert grad_c[0, 0].item() == 0.0
    assert grad_u[0, 0].item() == pytest.approx(-1.5 / 2.0)
    assert grad_u[0, 1].item() == pytest.approx(grad_c[0, 1].item())
    assert loss_u.item() == pytest.approx(-(1.5 + 1.1) / 2.0)


def test_kl_coef_scales_the_kl_gradient() -> None:
    lp = torch.tensor([[-1.0, -0.4, -2.0]])
    ref = torch.tensor([[-0.5, -1.0, -2.5]])
    data = _data(lp, [0.0], [[1.0, 1.0, 1.0]], ref=ref)  # A = 0: only the KL term acts
    expected_unit = (1.0 - torch.exp(ref - lp)) / 3.0  # d k3 / d logp, over num_tokens
    _, g0, _ = _grad(ClippedPGLoss(0.2, 0.0), lp, data, 3.0)
    _, g1, m1 = _grad(ClippedPGLoss(0.2, 0.1), lp, data, 3.0)
    _, g2, m2 = _grad(ClippedPGLoss(0.2, 0.2), lp, data, 3.0)
    assert torch.equal(g0, torch.zeros(1, 3))
    torch.testing.assert_close(g1, 0.1 * expected_unit)
    torch.testing.assert_close(g2, 2 * g1)
    assert m1["kl"] == pytest.approx(m2["kl"])  # the metric does not depend on the coefficient
    assert m1["kl"] == pytest.approx(kl_k3(lp, ref).mean().item())


def test_kl_gradient_pulls_towards_the_reference() -> None:
    lp = torch.tensor([[-1.0, -3.0]])
    ref = torch.tensor([[-2.0, -2.0]])  # token 0: logp above ref, token 1: below
    _, grad, _ = _grad(ClippedPGLoss(0.2, 1.0), lp, _data(lp, [0.0], [[1.0, 1.0]], ref=ref), 2.0)
    # gradient descent lowers logp where it is above ref and raises it where below
    assert grad[0, 0] > 0 and grad[0, 1] < 0


def test_masked_tokens_get_exactly_zero_gradient() -> None:
    logprobs, data = _random_batch(seed=1)
    num_tokens = float(data["completion_mask"].sum())
    _, grad, _ = _grad(ClippedPGLoss(0.2, 0.3), logprobs, data, num_tokens)
    padding = data["completion_mask"] == 0
    assert padding.any()
    assert torch.equal(grad[padding], torch.zeros(int(padding.sum())))
    assert (grad[~padding] != 0).all()


def test_values_under_the_mask_do_not_change_the_loss() -> None:
    logprobs, data = _random_batch(seed=2)
    num_tokens = float(data["completion_mask"].sum())
    loss_fn = ClippedPGLoss(0.2, 0.3)
    loss, metrics = loss_fn(logprobs, data, num_tokens)
    padding = data["completion_mask"] == 0
    garbage = {k: v.clone() for k, v in data.items()}
    for key in ("old_logprobs", "ref_logprobs"):
        garbage[key][padding] = -25.0
    noisy_lp = logprobs.clone()
    noisy_lp[padding] = 3.0  # even an impossible logprob (> 0)
    loss2, metrics2 = loss_fn(noisy_lp, garbage, num_tokens)
    assert loss2.item() == loss.item()
    assert metrics2 == metrics  # ratio min/max and clip fraction only see real tokens


def test_split_into_micro_batches_sums_to_the_full_batch_loss() -> None:
    logprobs, data = _random_batch(batch=6, length=5, seed=3)
    num_tokens = float(data["completion_mask"].sum())  # global normalizer for both halves
    loss_fn = ClippedPGLoss(0.2, 0.1)
    full, _ = loss_fn(logprobs, data, num_tokens)
    parts = []
    for rows in (slice(0, 2), slice(2, 6)):  # uneven split with different token counts
        micro = {k: v[rows] for k, v in data.items()}
        parts.append(loss_fn(logprobs[rows], micro, num_tokens)[0])
    assert (parts[0] + parts[1]).item() == pytest.approx(full.item(), rel=1e-6)
    # and the full loss is the token mean: each token counts the same, whatever its row's length
    per_token = -data["advantages"][:, None].expand(6, 5)  # at ratio 1, pg = -A per token
    at_one, _ = ClippedPGLoss(0.2, 0.0)(data["old_logprobs"], data, num_tokens)
    mask = data["completion_mask"]
    assert at_one.item() == pytest.approx(((per_token * mask).sum() / mask.sum()).item(), rel=1e-6)


def test_metrics_on_a_hand_case() -> None:
    eps = 0.2
    old = torch.zeros(2, 3)
    # ratios: row 0 (A = 1): 1.5 clipped, 0.9, padding 9.0; row 1 (A = -1): 0.5 clipped, 1.1, 0.7 clipped
    ratios = torch.tensor([[1.5, 0.9, 9.0], [0.5, 1.1, 0.7]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    data = _data(old, [1.0, -1.0], mask)
    _, metrics = ClippedPGLoss(eps, 0.0)(torch.log(ratios), data, 5.0)
    assert metrics["clip_fraction"] == pytest.approx(3 / 5)
    assert metrics["probs_ratio_min"] == pytest.approx(0.5)
    assert metrics["probs_ratio_max"] == pytest.approx(1.5)  # the padding's 9.0 is ignored
    expected_loss = (-(1.2 * 1) - (0.9 * 1) + (1.1 * 1) + (0.8 * 1) + (0.8 * 1)) / 5
    assert metrics["loss"] == pytest.approx(expected_loss, rel=1e-5)
    assert set(metrics) == {"loss", "kl", "clip_fraction", "probs_ratio_min", "probs_ratio_max"}


def test_metrics_of_an_all_padding_micro_batch_are_neutral() -> None:
    data = _data(torch.zeros(1, 2), [1.0], [[0.0, 0.0]])
    loss, metrics = ClippedPGLoss()(torch.zeros(1, 2), data, 4.0)
    assert loss.item() == 0.0
    assert metrics["probs_ratio_min"] == 1.0 and metrics["probs_ratio_max"] == 1.0
    assert all(math.isfinite(v) for v in metrics.values())


# --- NLLLoss ------------------------------------------------------------------------------


def test_nll_equals_masked_mean_nll() -> None:
    logprobs = torch.tensor([[-0.5, -1.0, -9.0], [-2.0, -0.1, -0.2]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, metrics = NLLLoss()(logprobs, {"completion_mask": mask}, 5.0)
    expected = (0.5 + 1.0 + 2.0 + 0.1 + 0.2) / 5
    assert loss.item() == pytest.approx(expected)
    assert metrics == {"loss": pytest.approx(expected)}


def test_nll_gradient_and_micro_batch_split() -> None:
    logprobs = torch.tensor([[-0.5, -1.0, -9.0], [-2.0, -0.1, -0.2]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, _ = NLLLoss()(logprobs, {"completion_mask": mask}, 5.0)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, -mask / 5.0)
    halves = sum(NLLLoss()(logprobs[i : i + 1], {"completion_mask": mask[i : i + 1]}, 5.0)[0].item() for i in range(2))
    assert halves == pytest.approx(loss.item())


def test_extreme_values_under_the_mask_still_give_zero_gradient() -> None:
    old = torch.tensor([[-1.0, -100.0]])  # padding: a meaningless old logprob
    data = _data(old, [1.0], [[1.0, 0.0]], ref=torch.tensor([[-1.0, -1.0]]))
    _, grad, _ = _grad(ClippedPGLoss(0.2, 0.0), torch.tensor([[-1.0, 0.0]]), data, 1.0)
    assert torch.isfinite(grad).all()
    assert grad[0, 1].item() == 0.0


# --- ClippedPGLoss: truncated importance weights (asynchronous GRPO) --------------------


@pytest.mark.parametrize("cap", [0.5, 1.0, 2.0, 100.0])
def test_truncated_importance_weight_matches_hand_computation(cap: float) -> None:
    logprobs, data = _random_batch(seed=3)
    gen = torch.Generator().manual_seed(4)
    data["behaviour_logprobs"] = data["old_logprobs"] + torch.randn(data["old_logprobs"].shape, generator=gen) * 0.7
    num_tokens = float(data["completion_mask"].sum())
    loss, metrics = ClippedPGLoss(0.2, 0.1, importance_weight_cap=cap)(logprobs, data, num_tokens)
    assert loss.item() == pytest.approx(_hand_loss(logprobs, data, num_tokens, 0.2, 0.1, cap=cap), rel=1e-5, abs=1e-6)
    mask = data["completion_mask"] > 0
    weights = (data["old_logprobs"] - data["behaviour_logprobs"]).exp().clamp(max=cap)[mask]
    assert metrics["importance_weight"] == pytest.approx(weights.sum().item() / num_tokens, rel=1e-5)
    assert metrics["importance_weight"] <= cap + 1e-6


def test_truncated_importance_weight_scales_the_gradient_and_is_not_differentiated() -> None:
    """At ratio 1 the pg gradient is -A * w / num_tokens per token: the weight scales it and
    carries no gradient of its own (it is computed from data, not from the current logprobs)."""
    data = _data([[-1.0, -2.0]], [1.5], [[1.0, 1.0]])
    data["behaviour_logprobs"] = torch.tensor([[-1.0 - math.log(3.0), -2.0 + math.log(4.0)]])  # w = 3, 1/4
    _, grad, metrics = _grad(ClippedPGLoss(0.2, 0.0, importance_weight_cap=2.0), [[-1.0, -2.0]], data, 2.0)
    assert grad[0].tolist() == pytest.approx([-1.5 * 2.0 / 2.0, -1.5 * 0.25 / 2.0])  # w = min(3, 2), 1/4
    assert metrics["importance_weight"] == pytest.approx((2.0 + 0.25) / 2.0)


def test_without_a_cap_behaviour_logprobs_are_ignored_and_no_weight_is_reported() -> None:
    logprobs, data = _random_batch(seed=5)
    num_tokens = float(data["completion_mask"].sum())
    plain, metrics = ClippedPGLoss(0.2, 0.0)(logprobs, data, num_tokens)
    with_behaviour, _ = ClippedPGLoss(0.2, 0.0)(logprobs, {**data, "behaviour_logprobs": data["old_logprobs"] - 5},
                                                num_tokens)
    assert plain.item() == with_behaviour.item()
    assert "importance_weight" not in metrics


def test_a_cap_without_behaviour_logprobs_raises() -> None:
    logprobs, data = _random_batch()
    with pytest.raises(KeyError, match="behaviour_logprobs"):
        ClippedPGLoss(importance_weight_cap=2.0)(logprobs, data, 4.0)


# --- behaviours the automatic mutation run (tests/mutation/run_auto.sh) found untested ------------


def test_kl_k3_clamps_the_log_ratio_at_plus_and_minus_20() -> None:
    """Far past the clamp, k3 is the value at exactly -20 / +20, not at the raw log-ratio."""
    kl = kl_k3(torch.tensor([0.0, 0.0], dtype=torch.float64), torch.tensor([-100.0, 100.0], dtype=torch.float64))
    assert kl.tolist() == pytest.approx([math.exp(-20.0) + 20.0 - 1.0, math.exp(20.0) - 20.0 - 1.0], rel=1e-12)


def test_without_reference_logprobs_and_kl_coef_0_the_loss_is_the_plain_clipped_pg() -> None:
    logprobs, data = _random_batch(seed=6)
    del data["ref_logprobs"]
    num_tokens = float(data["completion_mask"].sum())
    loss, metrics = ClippedPGLoss(0.2, 0.0)(logprobs, data, num_tokens)
    hand = _hand_loss(logprobs, {**data, "ref_logprobs": logprobs}, num_tokens, 0.2, 0.0)  # k3 = 0
    assert loss.item() == pytest.approx(hand, rel=1e-5)
    assert "kl" not in metrics


def test_a_positive_kl_coef_without_reference_logprobs_raises_naming_both() -> None:
    logprobs, data = _random_batch()
    del data["ref_logprobs"]
    with pytest.raises(KeyError, match=r"kl_coef=0\.5 needs data\['ref_logprobs'\]"):
        ClippedPGLoss(0.2, 0.5)(logprobs, data, 4.0)


def test_the_ratio_extremes_ignore_padding_tokens_even_when_every_real_ratio_is_above_one() -> None:
    # padding's ratio is exp(0) = 1 by construction; with every real ratio at 2 it must not show
    old = torch.zeros(1, 3)
    data = _data(old, [1.0], [[1.0, 1.0, 0.0]])
    _, metrics = ClippedPGLoss(0.2, 0.0)(torch.full((1, 3), math.log(2.0)), data, 2.0)
    assert metrics["probs_ratio_min"] == pytest.approx(2.0)
    assert metrics["probs_ratio_max"] == pytest.approx(2.0)


def test_nan_logprobs_under_the_mask_never_reach_the_loss_its_gradient_or_metrics() -> None:
    """Entries past a completion are meaningless (compute_logprobs' contract): NaN there, in the
    old, behaviour or reference logprobs, changes nothing."""
    logprobs, data = _random_batch(seed=7)
    data["behaviour_logprobs"] = data["old_logprobs"] - 0.3
    num_tokens = float(data["completion_mask"].sum())
    loss_fn = ClippedPGLoss(0.2, 0.1, importance_weight_cap=2.0)
    loss, grad, metrics = _grad(loss_fn, logprobs, data, num_tokens)
    padding = data["completion_mask"] == 0
    nan = {k: v.clone() for k, v in data.items()}
    for key in ("old_logprobs", "behaviour_logprobs", "ref_logprobs"):
        nan[key][padding] = float("nan")
    loss2, grad2, metrics2 = _grad(loss_fn, logprobs, nan, num_tokens)
    assert loss2.item() == loss.item()
    assert torch.equal(grad2, grad)
    assert metrics2 == metrics


def test_the_importance_weight_exponent_stops_at_20_even_under_a_larger_cap() -> None:
    data = _data([[0.0]], [1.0], [[1.0]])
    data["behaviour_logprobs"] = torch.tensor([[-100.0]])  # w = e^100 before the clamp
    _, metrics = ClippedPGLoss(0.2, 0.0, importance_weight_cap=1e12)(torch.zeros(1, 1), data, 1.0)
    assert metrics["importance_weight"] == pytest.approx(math.exp(20.0), rel=1e-6)
