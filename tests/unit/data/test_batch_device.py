"""TokenBatch.to: workers on a GPU move whole batches; every field must travel, none be dropped."""

import dataclasses

import torch

from posttrain.data.batch import TokenBatch


def _batch() -> TokenBatch:
    return TokenBatch(
        input_ids=torch.tensor([[3, 4, 5, 0]]), attention_mask=torch.tensor([[1, 1, 1, 0]]),
        prompt_lens=torch.tensor([2]), completion_lens=torch.tensor([1]), completion_mask=torch.tensor([[1.0, 0.0]]),
    )


def test_to_moves_every_field_and_keeps_values() -> None:
    batch = _batch()
    moved = batch.to("meta")  # a device without data: proves each field was moved
    for field in dataclasses.fields(TokenBatch):
        assert getattr(moved, field.name).device.type == "meta", field.name
    back = batch.to("cpu")
    for field in dataclasses.fields(TokenBatch):
        assert torch.equal(getattr(back, field.name), getattr(batch, field.name)), field.name
