"""LoRA on the Hugging Face policy worker (``policy.lora``), in-process on CPU.

Each test checks what a user relies on against an independent computation: the trainable
count against the layer shapes, the merged weights against ``W0 + (alpha / r) B A`` done by
hand and against the adapted model's own forward pass, the reference against a freshly
loaded base model, checkpoints against a worker that never stopped. The backend-agnostic
learning tests (tests/integration/test_grpo_learning.py, test_sft_tokens.py) and the exact
resume test (test_checkpoint_resume.py) also run over LoRA (``policy_backends.BACKENDS``).
"""

from __future__ import annotations

import json

import pytest
import torch
from harness.policy_backends import make_worker

from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.config import LORA_TARGETS_ALL_LINEAR, LoraConfig, PolicyConfig
from posttrain.data.batch import make_batch
from posttrain.errors import ConfigError
from posttrain.models.policy.lora import check_adapter

RANK, ALPHA = 4, 8.0


def base_model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def lora_worker(path: str, **lora):
    cfg = {"rank": RANK, "alpha": ALPHA, **lora}
    return make_worker("hf", path, lr=1e-2, lora=cfg, train_global_batch_size=4, train_micro_batch_size=4)


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(2, 17, (5,), generator=g).tolist() for _ in range(4)]
    comps = [torch.randint(2, 17, (3,), generator=g).tolist() for _ in range(4)]
    return make_batch(prompts, comps, pad_id=0)


def train_steps(worker, n: int = 3, seed: int = 0) -> list[dict]:
    out = []
    for i in range(n):
        b = batch(seed + i)
        extra = {"advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]), "old_logprobs": worker.get_logprobs(b),
                 "ref_logprobs": worker.get_logprobs(b, reference=True)}
        out.append(worker.train(b, extra, ClippedPGLoss(kl_coef=0.1)))
    return out


def logits(model, b) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits


def test_only_the_adapters_train_and_their_count_follows_the_layer_shapes(tiny_model_path) -> None:
    worker = lora_worker(tiny_model_path)
    plain = base_model(tiny_model_path)
    # r * (in + out) per adapted linear layer, counted from the plain model
    expected = sum(RANK * (m.in_features + m.out_features) for name, m in plain.named_modules()
                   if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in LORA_TARGETS_ALL_LINEAR)
    total = sum(p.numel() for p in plain.parameters())
    assert worker.parameter_counts() == (expected, total + expected)
    assert sum(p.numel() for g in worker.optimizer.param_groups for p in g["params"]) == expected
    initial = worker.get_weights()
    torch.testing.assert_close(initial, plain.state_dict(), rtol=0, atol=0)  # B starts at zero
    train_steps(worker)
    after = worker.get_weights()
    assert max((after[k] - initial[k]).abs().max().item() for k in initial) > 1e-3
    base = worker.model.get_base_model().state_dict()
    for name, tensor in plain.state_dict().items():  # the frozen weights did not move a bit
        key = name if name in base else name.replace(".weight", ".base_layer.weight").replace(
            ".bias", ".base_layer.bias")
        assert torch.equal(base[key], tensor), name


def test_merged_weights_are_w0_plus_scaled_ba_and_compute_what_the_adapted_model_computes(tiny_model_path) -> None:
    worker = lora_worker(tiny_model_path)
    train_steps(worker)
    merged = worker.get_weights()
    plain = base_model(tiny_model_path)
    initial = plain.state_dict()
    adapters = {k: v for k, v in worker.model.get_base_model().state_dict().items() if ".lora_" in k}
    q = "model.layers.1.self_attn.q_proj"
    a, b = adapters[f"{q}.lora_A.default.weight"], adapters[f"{q}.lora_B.default.weight"]  # [r, in], [out, r]
    torch.testing.assert_close(merged[f"{q}.weight"], initial[f"{q}.weight"] + (ALPHA / RANK) * b @ a)
    assert set(merged) == set(initial)
    # a plain model loaded with the merged weights (what the engine gets at refit) scores as the worker does
    plain.load_state_dict(merged)
    worker.model.eval()
    torch.testing.assert_close(logits(plain, batch(7)), logits(worker.model, batch(7)), rtol=1e-5, atol=1e-5)


def test_the_reference_is_the_base_model(tiny_model_path) -> None:
    worker = lora_worker(tiny_model_path)
    b = batch(5)
    before = worker.get_logprobs(b, reference=True)
    train_steps(worker)
    assert (worker.get_logprobs(b) - before).abs().max() > 1e-3
    torch.testing.assert_close(worker.get_logprobs(b, reference=True), before, rtol=0, atol=0)
    fresh = make_worker("hf", tiny_model_path)  # full fine-tuning worker: its reference is a plain copy
    torch.testing.assert_close(fresh.get_logprobs(b, reference=True), before, rtol=1e-6, atol=1e-6)


def test_rank_alpha_and_dropout_reach_the_adapters(tiny_model_path) -> None:
    worker = lora_worker(tiny_model_path, rank=2, alpha=3.0, dropout=0.25, target_modules=["q_proj", "v_proj"])
    layers = {n: m for n, m in worker.model.named_modules() if hasattr(m, "lora_A")}
    assert {n.rsplit(".", 1)[-1] for n in layers} == {"q_proj", "v_proj"}
    for layer in layers.values():
        assert layer.lora_A["default"].weight.shape[0] == 2
        assert layer.scaling["default"] == pytest.approx(1.5)
        assert layer.lora_dropout["default"].p == 0.25


def test_dropout_applies_while_training_only(tiny_model_path) -> None:
    worker = lora_worker(tiny_model_path, dropout=0.5)
    train_steps(worker, 1)  # B != 0: dropout on the adapter input changes the output
    b = batch(3)
    worker.model.train()
    assert not torch.equal(logits(worker.model, b), logits(worker.model, b))
    worker.model.eval()
    assert torch.equal(logits(worker.model, b), logits(worker.model, b))


def test_a_checkpoint_holds_the_adapter_only_and_resumes_exactly(tiny_model_path, tmp_path) -> None:
    worker = lora_worker(tiny_model_path)
    train_steps(worker, 2)
    worker.save_checkpoint(str(tmp_path / "ckpt"), tokenizer_path=tiny_model_path)
    files = {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "trainer_state.pt"} <= files
    assert not any(name.startswith("model") for name in files)  # no copy of the base weights
    adapter_bytes = (tmp_path / "ckpt" / "adapter_model.safetensors").stat().st_size
    assert adapter_bytes < 4 * worker.parameter_counts()[0] + 16_000  # fp32 adapters + the names' header
    resumed = lora_worker(tiny_model_path)  # a fresh worker: B = 0
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    torch.testing.assert_close(resumed.get_weights(), worker.get_weights(), rtol=0, atol=0)
    assert resumed.get_weight_version() == 2
    # the next steps agree too: Adam's moments and the lr schedule came back with the adapter
    going, back = train_steps(worker, 2, seed=10), train_steps(resumed, 2, seed=10)
    assert [m["grad_norm"] for m in going] == [m["grad_norm"] for m in back]
    torch.testing.assert_close(resumed.get_weights(), worker.get_weights(), rtol=0, atol=0)


def test_a_checkpoint_whose_adapter_lacks_a_tensor_or_has_one_too_many_is_refused(tiny_model_path, tmp_path) -> None:
    """peft loads whatever tensors it is given: an adapter with one tensor fewer than the policy's
    would leave that adapter at its fresh initialization, in a run that says it resumed."""
    from safetensors.torch import load_file, save_file

    worker = lora_worker(tiny_model_path)
    train_steps(worker, 1)
    worker.save_checkpoint(str(tmp_path / "ckpt"))
    weights = tmp_path / "ckpt" / "adapter_model.safetensors"
    saved = load_file(str(weights))
    first, last = sorted(saved)[0], sorted(saved)[-1]
    resumed = lora_worker(tiny_model_path)
    save_file({k: v for k, v in saved.items() if k != last}, str(weights))
    with pytest.raises(ConfigError, match=rf"^checkpoint '.*ckpt': its adapter lacks 1 of the policy's adapter "
                                          rf"tensors \({last.rsplit('.', 1)[0]}\.default\.weight\)$"):
        resumed.load_checkpoint(str(tmp_path / "ckpt"))
    save_file({**saved, first.replace("layers.0.", "layers.99."): saved[first].clone()}, str(weights))
    with pytest.raises(ConfigError, match=r"its adapter has 1 tensors the policy's adapters do not \(.*layers\.99\."):
        resumed.load_checkpoint(str(tmp_path / "ckpt"))
    save_file(saved, str(weights))  # the adapter as written: it resumes
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    torch.testing.assert_close(resumed.get_weights(), worker.get_weights(), rtol=0, atol=0)


def test_the_export_is_a_plain_model_with_the_merged_weights(tiny_model_path, tmp_path) -> None:
    worker = lora_worker(tiny_model_path)
    train_steps(worker)
    worker.export(str(tmp_path / "final"), tokenizer_path=tiny_model_path)
    exported = base_model(str(tmp_path / "final"))  # loads as a new model.path, no peft needed
    torch.testing.assert_close(exported.state_dict(), worker.get_weights(), rtol=0, atol=1e-6)
    assert (tmp_path / "final" / "adapter" / "adapter_config.json").is_file()
    assert (tmp_path / "final" / "tokenizer_config.json").is_file()


def test_a_target_module_the_model_lacks_is_one_line(tiny_model_path) -> None:
    with pytest.raises(ConfigError, match=r"policy.lora.target_modules: qkv_proj not in the model \(its linear "
                                          r"layers: down_proj, gate_proj, .*v_proj\)$"):
        lora_worker(tiny_model_path, target_modules=["q_proj", "qkv_proj"])


def test_lora_with_the_megatron_backend_is_refused_when_the_config_loads() -> None:
    with pytest.raises(ValueError, match="lora.rank=8 needs backend=hf .* got backend=megatron"):
        PolicyConfig.model_validate({"backend": "megatron", "lora": {"rank": 8}})


QV = ["q_proj", "v_proj"]


@pytest.mark.parametrize(("saved", "rank", "message"), [
    ({"r": 4, "lora_alpha": 8.0, "target_modules": ["v_proj", "q_proj"]}, RANK, None),
    ({"r": 8, "lora_alpha": 8.0, "target_modules": QV}, RANK, "policy.lora.rank=8, the config says 4"),
    ({"r": 4, "lora_alpha": 16.0, "target_modules": QV}, RANK, "alpha=16.0, the config says 8.0"),
    ({"r": 4, "lora_alpha": 8.0, "target_modules": ["q_proj"]}, RANK, r"target_modules=\['q_proj'\]"),  # fewer
    ({"r": 4, "lora_alpha": 8.0, "target_modules": [*QV, "k_proj"]}, RANK,  # and more
     r"target_modules=\['k_proj', 'q_proj', 'v_proj'\], the config says \['q_proj', 'v_proj'\]"),
    (None, RANK, "holds no LoRA adapter"),
    ({"r": 4, "lora_alpha": 8.0, "target_modules": QV}, 0, "holds a LoRA adapter, but policy.lora.rank=0"),
    (None, 0, None),  # full fine-tuning from a full fine-tuning checkpoint
])
def test_a_checkpoint_whose_adapter_differs_from_the_config_is_refused(tmp_path, saved, rank, message) -> None:
    if saved is not None:
        (tmp_path / "adapter_config.json").write_text(json.dumps(saved))
    cfg = LoraConfig.model_validate({"rank": rank, "alpha": ALPHA, "target_modules": QV})
    if message is None:
        check_adapter(tmp_path, cfg)
    else:
        with pytest.raises(ConfigError, match=message):
            check_adapter(tmp_path, cfg)
