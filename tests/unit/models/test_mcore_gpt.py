"""megatron-core: a tiny GPTModel with the local (non-Transformer-Engine) layer spec trains a step on CUDA.

Selected by ``--mcore-only`` (extra ``mcore``); megatron-core's forward needs CUDA
(DESIGN.md), hence ``gpu(1)``:
    uv run --extra mcore --group test bash tests/run_unit.sh --mcore-only
"""

from __future__ import annotations

import math

import pytest

VOCAB, SEQ, BATCH = 128, 16, 4


@pytest.fixture
def model_parallel(tmp_path):
    """A 1-process NCCL group with tensor/pipeline parallel size 1, torn down after the test."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    model_parallel_cuda_manual_seed(0)
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.mark.mcore
@pytest.mark.gpu(1)
def test_gpt_forward_backward_on_cuda(model_parallel):
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.manual_seed(0)
    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True)
    model = GPTModel(config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=VOCAB,
                     max_sequence_length=SEQ).cuda()
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda")
    positions = torch.arange(SEQ, device="cuda").expand(BATCH, SEQ)
    causal = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool, device="cuda"), diagonal=1)[None, None]  # True = masked

    logits = model(tokens, positions, causal)  # [B, S, V]
    assert logits.shape == (BATCH, SEQ, VOCAB)
    loss = model(tokens[:, :-1], positions[:, :-1], causal[..., :-1, :-1], labels=tokens[:, 1:]).mean()  # [B, S-1]
    # Random init predicts roughly uniformly: the loss starts near ln(VOCAB).
    assert abs(loss.item() - math.log(VOCAB)) < 1.0, loss.item()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.embedding.word_embeddings.weight.grad.abs().sum() > 0
