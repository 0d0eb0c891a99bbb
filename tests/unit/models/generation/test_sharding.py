"""Sharding shared by both generation backends: order kept, nothing dropped, versions must agree."""

import pytest

from posttrain.distributed.sharding import contiguous_shards
from posttrain.models.generation.interfaces import GenerationOutput
from posttrain.models.generation.sharding import gather_outputs
from posttrain.weight_sync.receipt import RefitReceipt, agreed_version, gather_receipts


@pytest.mark.parametrize(("n_items", "n"), [(10, 3), (3, 4), (0, 2), (16, 1)])
def test_shards_are_contiguous_balanced_and_complete(n_items: int, n: int) -> None:
    items = list(range(n_items))
    shards = contiguous_shards(items, n)
    assert len(shards) == n
    assert [x for s in shards for x in s] == items
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_gather_keeps_shard_order() -> None:
    outs = [GenerationOutput([[1], [2]], [[-0.1], [-0.2]], 3), GenerationOutput([[3]], [[-0.3]], 3)]
    out = gather_outputs(outs, "engines")
    assert out.completion_ids == [[1], [2], [3]] and out.logprobs == [[-0.1], [-0.2], [-0.3]]
    assert out.weight_version == 3


def test_engines_on_different_weights_raise() -> None:
    with pytest.raises(RuntimeError, match=r"engines disagree on the weight version: \[2, 3\]"):
        gather_outputs([GenerationOutput([], [], 3), GenerationOutput([], [], 2)], "engines")
    with pytest.raises(RuntimeError, match="disagree"):
        agreed_version([5, 4], "engines")


def test_receipts_gather_probe_rows_in_shard_order_and_never_drop_an_engines_answer() -> None:
    rows = gather_receipts([RefitReceipt(4, [[-0.1], [-0.2]]), RefitReceipt(4, []), RefitReceipt(4, [[-0.3]])], "e")
    assert rows == RefitReceipt(4, [[-0.1], [-0.2], [-0.3]])  # an empty shard adds no row
    assert gather_receipts([RefitReceipt(4), RefitReceipt(4)], "e") == RefitReceipt(4)  # no probe asked
    # one engine answered without its rows: the probe comes out short (measure refuses it),
    # not as "no probe", which would have the driver score the engines a second time
    assert gather_receipts([RefitReceipt(4, [[-0.1]]), RefitReceipt(4)], "e") == RefitReceipt(4, [[-0.1]])
    with pytest.raises(RuntimeError, match=r"e disagree on the weight version: \[3, 4\]"):
        gather_receipts([RefitReceipt(4, []), RefitReceipt(3, [])], "e")
