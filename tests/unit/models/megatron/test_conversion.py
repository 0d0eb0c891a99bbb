"""Hugging Face Qwen2 <-> megatron-core GPTModel weights: layouts and round trips (CPU, no megatron).

The expected megatron layouts are built here head by head, with loops, from what megatron-core
does with the tensors (``Attention.get_query_key_value_tensors`` splits each key/value group's
rows into its query heads, then k, then v; SwiGLU chunks ``linear_fc1``'s output into gate,
then up); the converter builds them with reshapes. That a real ``GPTModel`` computes the HF
model's logits from these tensors is the mcore tier's ``test_logits_equal_the_hf_models``.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from posttrain.errors import ConfigError
from posttrain.models.megatron.conversion import GPTShape, hf_to_megatron, megatron_to_hf

HEAD_DIM, N_Q, N_KV = 4, 8, 4


def qwen2(tied: bool = True, vocab: int = 37, **overrides) -> Qwen2ForCausalLM:
    """A small Qwen2 with every weight random (biases and norms too) and an odd vocabulary."""
    config = Qwen2Config(vocab_size=vocab, hidden_size=N_Q * HEAD_DIM, intermediate_size=24, num_hidden_layers=2,
                         num_attention_heads=N_Q, num_key_value_heads=N_KV, tie_word_embeddings=tied, **overrides)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
    return model


def heads(weight: torch.Tensor, n: int) -> list[torch.Tensor]:
    return [weight[h * HEAD_DIM:(h + 1) * HEAD_DIM] for h in range(n)]


def expected_qkv(hf: dict[str, torch.Tensor], layer: int, kind: str, rank: int, tp: int) -> torch.Tensor:
    """Rank ``rank``'s linear_qkv rows, group by group: the group's query heads, then k, then v."""
    q, k, v = (heads(hf[f"model.layers.{layer}.self_attn.{p}_proj.{kind}"], n) for p, n in (("q", N_Q), ("k", N_KV),
                                                                                           ("v", N_KV)))
    per_group, groups_per_rank = N_Q // N_KV, N_KV // tp
    rows = []
    for g in range(rank * groups_per_rank, (rank + 1) * groups_per_rank):
        rows += q[g * per_group:(g + 1) * per_group] + [k[g], v[g]]
    return torch.cat(rows)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_shards_hold_megatrons_layouts(tp: int) -> None:
    model = qwen2()
    hf = model.state_dict()
    shape = GPTShape.from_hf_config(model.config)
    ffn, hidden = 24 // tp, N_Q * HEAD_DIM
    for rank in range(tp):
        shard = hf_to_megatron(hf, shape, rank, tp)
        for layer in range(2):
            m, h = f"decoder.layers.{layer}.", f"model.layers.{layer}."
            for kind in ("weight", "bias"):
                qkv = shard[f"{m}self_attention.linear_qkv.{kind}"]
                assert torch.equal(qkv, expected_qkv(hf, layer, kind, rank, tp))
            gate = hf[f"{h}mlp.gate_proj.weight"][rank * ffn:(rank + 1) * ffn]
            up = hf[f"{h}mlp.up_proj.weight"][rank * ffn:(rank + 1) * ffn]
            assert torch.equal(shard[f"{m}mlp.linear_fc1.weight"], torch.cat([gate, up]))
            cols = slice(rank * hidden // tp, (rank + 1) * hidden // tp)
            proj = shard[f"{m}self_attention.linear_proj.weight"]
            assert torch.equal(proj, hf[f"{h}self_attn.o_proj.weight"][:, cols])
            cols = slice(rank * ffn, (rank + 1) * ffn)
            assert torch.equal(shard[f"{m}mlp.linear_fc2.weight"], hf[f"{h}mlp.down_proj.weight"][:, cols])
            assert torch.equal(shard[f"{m}input_layernorm.weight"], hf[f"{h}input_layernorm.weight"])
            assert torch.equal(shard[f"{m}pre_mlp_layernorm.weight"], hf[f"{h}post_attention_layernorm.weight"])
        assert torch.equal(shard["decoder.final_layernorm.weight"], hf["model.norm.weight"])
        assert "output_layer.weight" not in shard  # tied: the output layer reads the embedding


def test_vocabulary_is_padded_with_zero_rows_to_split_evenly() -> None:
    model = qwen2(vocab=37)
    hf = model.state_dict()
    shape = GPTShape.from_hf_config(model.config)
    assert shape.padded_vocab_size(4) == 40
    shards = [hf_to_megatron(hf, shape, r, 4)["embedding.word_embeddings.weight"] for r in range(4)]
    assert [s.shape[0] for s in shards] == [10] * 4
    full = torch.cat(shards)
    assert torch.equal(full[:37], hf["model.embed_tokens.weight"]) and not full[37:].any()


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_round_trip_is_bit_exact_with_hf_names(tied: bool, tp: int) -> None:
    model = qwen2(tied=tied)
    hf = model.state_dict()
    shape = GPTShape.from_hf_config(model.config)
    shards = [hf_to_megatron(hf, shape, r, tp) for r in range(tp)]
    if not tied:
        assert torch.equal(torch.cat([s["output_layer.weight"] for s in shards])[:37], hf["lm_head.weight"])
    back = megatron_to_hf(shards, shape)
    assert back.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name
    if tied:
        assert back["lm_head.weight"] is back["model.embed_tokens.weight"]


def test_a_missing_weight_is_a_key_error() -> None:
    model = qwen2()
    hf = model.state_dict()
    del hf["model.layers.1.self_attn.k_proj.bias"]
    with pytest.raises(KeyError, match="k_proj.bias"):
        hf_to_megatron(hf, GPTShape.from_hf_config(model.config))


@pytest.mark.parametrize(("config", "message"), [
    (Qwen2Config(num_attention_heads=8, num_key_value_heads=4, hidden_size=32, rope_scaling={"rope_type": "linear",
                                                                                              "factor": 2.0}),
     "plain RoPE only"),
    (Qwen2Config(num_attention_heads=8, num_key_value_heads=4, hidden_size=32, use_sliding_window=True),
     "sliding-window"),
    (Qwen2Config(num_attention_heads=8, num_key_value_heads=4, hidden_size=32, hidden_act="gelu"), "SwiGLU"),
])
def test_architectures_the_converter_does_not_map_are_refused(config, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        GPTShape.from_hf_config(config)


def test_other_model_types_are_refused() -> None:
    from transformers import LlamaConfig

    with pytest.raises(ConfigError, match="converts Qwen2 models only, got model_type 'llama'"):
        GPTShape.from_hf_config(LlamaConfig())


@pytest.mark.parametrize(("tp", "what"), [(3, "num_attention_heads"), (8, "num_key_value_heads")])
def test_a_tensor_parallel_size_that_does_not_divide_the_heads_is_refused(tp: int, what: str) -> None:
    shape = GPTShape.from_hf_config(qwen2().config)
    with pytest.raises(ConfigError, match=f"tensor_model_parallel_size={tp} does not divide the model's {what}"):
        shape.check_tensor_parallel(tp)
