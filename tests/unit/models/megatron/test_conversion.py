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
from posttrain.models.megatron.conversion import (
    GPTShape,
    hf_to_megatron,
    megatron_to_hf,
    merge_pipeline_stages,
    split_pipeline_stage,
    stage_layers,
)

HEAD_DIM, N_Q, N_KV = 4, 8, 4


def qwen2(tied: bool = True, vocab: int = 37, **overrides) -> Qwen2ForCausalLM:
    """A small Qwen2 with every weight random (biases and norms too) and an odd vocabulary."""
    sizes = {"num_hidden_layers": 2, **overrides}
    config = Qwen2Config(vocab_size=vocab, hidden_size=N_Q * HEAD_DIM, intermediate_size=24, num_attention_heads=N_Q,
                         num_key_value_heads=N_KV, tie_word_embeddings=tied, **sizes)
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


# -- pipeline stages ---------------------------------------------------------------------------


@pytest.mark.parametrize("pp", [2, 3, 6])
@pytest.mark.parametrize("tied", [True, False])
def test_each_pipeline_stage_holds_its_own_layers_renumbered_from_zero(pp: int, tied: bool) -> None:
    """Stage ``s`` of 6 layers in ``pp`` stages holds global layers ``[6s/pp, 6(s+1)/pp)`` as
    ``decoder.layers.0..``, the first stage the embedding, the last the final norm and the output
    layer (a copy of the embedding when tied). Checked layer by layer against the whole model."""
    model = qwen2(tied=tied, num_hidden_layers=6)
    shape = GPTShape.from_hf_config(model.config)
    whole = hf_to_megatron(model.state_dict(), shape)
    per_stage = 6 // pp
    for stage in range(pp):
        part = split_pipeline_stage(whole, shape, stage, pp)
        layers = {int(k.split(".")[2]) for k in part if k.startswith("decoder.layers.")}
        assert layers == set(range(per_stage)), (stage, sorted(layers))
        for k, v in part.items():
            if k.startswith("decoder.layers."):
                local = int(k.split(".")[2])
                global_key = k.replace(f"decoder.layers.{local}.", f"decoder.layers.{stage * per_stage + local}.", 1)
                assert torch.equal(v, whole[global_key]), k
        assert ("embedding.word_embeddings.weight" in part) == (stage == 0)
        assert ("decoder.final_layernorm.weight" in part) == (stage == pp - 1)
        assert ("output_layer.weight" in part) == (stage == pp - 1)
        if stage == pp - 1:
            expected = whole["embedding.word_embeddings.weight"] if tied else whole["output_layer.weight"]
            assert torch.equal(part["output_layer.weight"], expected)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (1, 2), (2, 3), (2, 6)])
def test_stages_of_every_rank_round_trip_bit_exact_with_hf_names(tied: bool, tp: int, pp: int) -> None:
    model = qwen2(tied=tied, num_hidden_layers=6)
    hf = model.state_dict()
    shape = GPTShape.from_hf_config(model.config)
    ranks = [[split_pipeline_stage(hf_to_megatron(hf, shape, r, tp), shape, s, pp) for s in range(pp)]
             for r in range(tp)]
    back = megatron_to_hf([merge_pipeline_stages(stages, shape) for stages in ranks], shape)
    assert back.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def test_a_tied_output_layer_that_drifted_from_the_embedding_is_refused() -> None:
    """With tied embeddings over two stages, the last stage's copy must still equal the first
    stage's embedding when the model is merged; otherwise the export would silently keep one of
    two matrices the model trained apart."""
    model = qwen2(tied=True, num_hidden_layers=6)
    shape = GPTShape.from_hf_config(model.config)
    whole = hf_to_megatron(model.state_dict(), shape)
    stages = [split_pipeline_stage(whole, shape, s, 2) for s in range(2)]
    merge_pipeline_stages(stages, shape)  # equal: merges
    stages[1]["output_layer.weight"] = stages[1]["output_layer.weight"] + 1e-3
    with pytest.raises(ValueError, match=r"^tied embeddings: the last pipeline stage's output layer differs from "
                                         r"the first stage's embedding by up to 0.001"):
        merge_pipeline_stages(stages, shape)


@pytest.mark.parametrize(("pp", "rank", "message"), [
    (4, 0, "policy.megatron.pipeline_model_parallel_size=4 does not divide the model's num_hidden_layers (6)"),
    (0, 0, "policy.megatron.pipeline_model_parallel_size=0 does not divide the model's num_hidden_layers (6)"),
    (2, 2, "pipeline stage 2 of 2: expected 0 .. 1"),
])
def test_a_stage_split_that_does_not_fit_the_layers_is_one_line(pp: int, rank: int, message: str) -> None:
    shape = GPTShape.from_hf_config(qwen2(num_hidden_layers=6).config)
    with pytest.raises(ConfigError) as err:
        stage_layers(shape, rank, pp)
    assert str(err.value) == message
