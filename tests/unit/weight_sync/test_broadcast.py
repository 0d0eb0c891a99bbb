"""The refit broadcast (``posttrain.weight_sync.broadcast``) on gloo, sender and receivers in
threads of this process: the bucket plan, exact bytes in the engine's dtype, tied names sent
once and received as one tensor, a receiver that stops early still taking every bucket, and
the Hugging Face engine refusing a broadcast whose names do not fit without leaving the
sender waiting."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from posttrain.errors import StaleWeightsError
from posttrain.weight_sync.broadcast import ALIGN, WeightBroadcast, connect_store, plan_buckets, serve_store

TIMEOUT_S = 60.0


def weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    embed = torch.randn(40, 6, generator=g)
    return {"embed": embed, "a": torch.randn(3, 5, generator=g), "b": torch.randn(7, generator=g),
            "lm_head": embed, "big": torch.randn(64, 8, generator=g), "c": torch.randn(2, 2, generator=g)}


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` in a thread; its result or exception lands in the returned dict."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 -- handed back to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def group(receivers: int) -> tuple[WeightBroadcast, list[WeightBroadcast]]:
    """A sender and ``receivers`` receivers of one gloo group (they must join at once)."""
    store = serve_store("127.0.0.1", TIMEOUT_S)
    joins = [in_thread(lambda r=r: WeightBroadcast(connect_store("127.0.0.1", store.port, TIMEOUT_S), r,
                                                   1 + receivers, "cpu", TIMEOUT_S))
             for r in range(1, receivers + 1)]
    sender = WeightBroadcast(store, 0, 1 + receivers, "cpu", TIMEOUT_S)
    for thread, _ in joins:
        thread.join(TIMEOUT_S)
    return sender, [out["result"] for _, out in joins]


def test_the_plan_sends_every_tensor_once_in_aligned_buckets_with_tied_names_as_aliases():
    w = weights()
    plan = plan_buckets(w, torch.bfloat16, bucket_bytes=300)
    slots = [slot for bucket in plan.buckets for slot in bucket.slots]
    assert sorted(s.name for s in slots) == sorted(w)
    assert plan.shapes == {name: tuple(t.shape) for name, t in w.items()}
    [tied] = [s for s in slots if s.alias_of]
    assert (tied.name, tied.alias_of, tied.nbytes) == ("lm_head", "embed", 0)
    for bucket in plan.buckets:
        sent = sorted((s for s in bucket.slots if not s.alias_of), key=lambda s: s.offset)
        assert all(s.offset % ALIGN == 0 for s in sent)
        assert all(a.offset + a.nbytes <= b.offset for a, b in zip(sent, sent[1:], strict=False))  # no overlap
        assert sent[-1].offset + sent[-1].nbytes <= bucket.nbytes
        # a bucket over the limit holds one tensor that alone is over it ("big": 64 x 8 x 2 bytes)
        assert bucket.nbytes <= 300 or len(sent) == 1
        assert any(s.name == tied.alias_of for s in bucket.slots) == (tied in bucket.slots)
    assert len(plan.buckets) >= 3
    with pytest.raises(ValueError, match="bucket_bytes=0"):
        plan_buckets(w, torch.float32, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_receiver_gets_the_exact_tensors_in_the_engines_dtype_refit_after_refit(dtype):
    sender, receivers = group(2)
    for refit in range(2):  # a second refit: sender and receivers stay in step
        w = {name: t + refit for name, t in weights().items()}
        w["lm_head"] = w["embed"]
        receiving = [in_thread(lambda r=r: [(n, t.clone(), t.data_ptr()) for n, t in r.receive()]) for r in receivers]
        sender.send(w, dtype, bucket_bytes=200)
        for thread, out in receiving:
            thread.join(TIMEOUT_S)
            got = {name: (t, ptr) for name, t, ptr in out["result"]}
            assert sorted(got) == sorted(w)
            for name, tensor in w.items():
                assert got[name][0].dtype == dtype
                assert torch.equal(got[name][0], tensor.to(dtype)), name
            assert got["lm_head"][1] == got["embed"][1]  # one tensor under both names


def test_a_receiver_that_stops_early_still_takes_every_bucket():
    sender, [receiver] = group(1)
    w = weights()

    def take_one_then_close():
        with receiver.receive() as reception:
            return next(iter(reception))[0]

    thread, out = in_thread(take_one_then_close)
    sender.send(w, torch.float32, bucket_bytes=64)  # returns only once every bucket was received
    thread.join(TIMEOUT_S)
    assert out["result"] == "embed"
    thread, out = in_thread(lambda: {n: t.clone() for n, t in receiver.receive()})
    sender.send(w, torch.float32, bucket_bytes=64)
    thread.join(TIMEOUT_S)
    assert torch.equal(out["result"]["c"], w["c"])


def test_the_hf_engine_refuses_a_broadcast_missing_a_tensor_and_takes_the_next_one(tiny_model_path):
    from transformers import AutoModelForCausalLM

    from posttrain.models.generation.hf_generation_worker import HfGenerationWorkerImpl

    engine = HfGenerationWorkerImpl(tiny_model_path)
    store = serve_store("127.0.0.1", TIMEOUT_S)
    thread, out = in_thread(lambda: WeightBroadcast(store, 0, 2, "cpu", TIMEOUT_S))
    engine.join_weight_broadcast("127.0.0.1", store.port, 2, TIMEOUT_S)
    thread.join(TIMEOUT_S)
    sender = out["result"]
    new = {n: t + 0.5 for n, t in AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict().items()}
    partial = {n: t for n, t in new.items() if n != "model.norm.weight"}
    thread, _ = in_thread(lambda: sender.send(partial, torch.float32, bucket_bytes=4096))
    with pytest.raises(StaleWeightsError, match=r"cannot load weight version 5: missing \['model.norm.weight'\]"):
        engine.receive_weights(5)
    thread.join(TIMEOUT_S)
    assert not thread.is_alive()  # the engine took every bucket: the sender is not left waiting
    assert engine.weight_version() == 0
    thread, _ = in_thread(lambda: sender.send(new, torch.float32, bucket_bytes=4096))
    engine.receive_weights(6)
    thread.join(TIMEOUT_S)
    assert engine.weight_version() == 6
    loaded = engine.model.state_dict()
    assert all(torch.equal(loaded[n], t) for n, t in new.items())
