"""``policy.attn_implementation``: the attention transformers runs in the HF policy worker's model
and its reference copy (sdpa, eager, flex_attention), and where it is refused.

On a CPU the key's reach is observed as ``eager``: both models are built with it, and an eager
packing worker scores as the padded sdpa worker does. ``flex_attention`` is refused on a CPU
worker (torch's FlexAttention has no backward pass there, and the worker trains) and, with any
value but the default, the megatron backend, each in one line. On a GPU a packing worker on
FlexAttention (the block-sparse mask transformers builds from the packed position ids) scores
and takes a train step as the padded sdpa worker of the same weights, within the bounds of
``test_sequence_packing.py`` (fp32, TF32 off).

Broken, a worker that never passes the key to ``from_pretrained`` (mutant
``attn_implementation_ignored``) runs sdpa whatever the config says.
"""

from __future__ import annotations

import pytest
import torch
from harness.policy_backends import make_worker
from harness.worker_parity import rel
from test_sequence_packing import compare, mixed_batch  # this folder's (pytest puts it on sys.path)

from posttrain.algorithms.grpo_config import GRPOMasterConfig
from posttrain.config import REPO_ROOT, PolicyConfig, load_config
from posttrain.errors import ConfigError

GRPO_YAML = str(REPO_ROOT / "examples" / "configs" / "grpo_arithmetic.yaml")

_GPUS = torch.cuda.device_count()


@pytest.mark.parametrize("backend", ["hf", "lora"])
def test_the_key_reaches_the_policy_and_its_reference(tiny_model_path, backend) -> None:
    eager = make_worker(backend, tiny_model_path, attn_implementation="eager", sequence_packing=True)
    default = make_worker(backend, tiny_model_path)
    # the reference is a copy of the model (LoRA: the model with its adapters off); both run eager
    reference = eager.reference if backend == "hf" else eager.model
    assert eager.model.config._attn_implementation == reference.config._attn_implementation == "eager"
    assert default.model.config._attn_implementation == "sdpa"
    batch = mixed_batch(default.model.config.vocab_size)
    mask = batch.completion_mask.bool()
    # eager on packed rows (transformers' block-diagonal mask from the position ids) scores as sdpa on padded rows
    assert rel(eager.get_logprobs(batch), default.get_logprobs(batch), mask) <= 1e-5
    assert rel(eager.get_logprobs(batch, reference=True), default.get_logprobs(batch, reference=True), mask) <= 1e-5


def test_flex_attention_on_a_cpu_worker_is_refused_in_one_line(tiny_model_path) -> None:
    with pytest.raises(ConfigError, match=r"^policy.attn_implementation=flex_attention needs a CUDA device \(torch's "
                                          r"FlexAttention has no backward pass on a CPU, and the policy worker "
                                          r"trains\), got device=cpu$") as err:
        make_worker("hf", tiny_model_path, attn_implementation="flex_attention", sequence_packing=True)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["eager", "flex_attention"])
def test_attn_implementation_with_the_megatron_backend_is_refused_in_one_line(value: str) -> None:
    with pytest.raises(ConfigError, match=rf"attn_implementation={value} needs backend=hf \(it picks a transformers "
                                          r"model's attention; megatron-core's is policy.megatron.layer_spec\), got "
                                          r"backend=megatron$") as err:
        load_config(GRPO_YAML, ["policy.backend=megatron", f"policy.attn_implementation={value}"], GRPOMasterConfig)
    assert "\n" not in str(err.value) and str(err.value).count(f"attn_implementation={value}") == 1
    PolicyConfig.model_validate({"backend": "megatron"})  # the default (sdpa) is no choice to refuse


@pytest.mark.gpu(1)
@pytest.mark.skipif(_GPUS < 1, reason=f"needs 1 GPU, found {_GPUS}")
@pytest.mark.parametrize("chunk", [0, 3], ids=["one-chunk", "chunked"])
@pytest.mark.parametrize("backend", ["hf", "lora"])
def test_a_flex_attention_packing_worker_scores_and_trains_as_the_padded_sdpa_worker(tiny_model_path, backend,
                                                                                     chunk) -> None:
    got = compare(tiny_model_path, backend, 0.7, 6, 0.9, chunk, device="cuda", packing_attention="flex_attention")
    assert got["attention"] == "flex_attention"  # type: ignore[comparison-overlap]
    assert got["shapes"] and all(s[0] == 1 for s in got["shapes"]), got["shapes"]  # type: ignore[attr-defined]
    assert got["real_tokens"] < 0.7 * got["padded_tokens"]
    # the bounds of test_sequence_packing.py (measured on CPU: 7.2e-8, within 1e-6, 5.4e-4)
    assert got["logprobs"] <= 1e-5 and got["reference"] <= 1e-5, got
    assert got["metrics"] <= 1e-5, got
    assert got["weights"] <= 5e-3, got
