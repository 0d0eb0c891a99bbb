"""A step-time yardstick measured in the policy worker's own process: plain torch's forward and
backward of the same model on the same micro-batches, timed right after the train call.

Why a ratio: an absolute step time moves by 2x with the machine and with what else runs on it,
so a bound on seconds is either loose or flaky. The train call and this reference share the
process, the threads, the model, the batch and (within seconds) the load, so their ratio
``timing/train_over_reference`` stays put where the seconds do not, and moves when posttrain's
own train step gets slower (a recompute, a needless copy, a lost fused kernel). NeMo-RL and
Megatron-LM gate step time against an absolute baseline of their own machines; this gate is
relative, so it holds on any machine.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from posttrain.data.batch import TokenBatch


def reference_forward_backward_seconds(model: torch.nn.Module, micro_batches: Sequence[TokenBatch],
                                       autocast: Callable[[], contextlib.AbstractContextManager],
                                       parameters: Sequence[torch.nn.Parameter]) -> float:
    """Seconds (wall clock, ``perf_counter``) of plain torch's language-model forward and backward
    over ``micro_batches``: per micro-batch, ``model(input_ids, attention_mask).logits`` under
    ``autocast()``, the next-token cross entropy (fp32) over the real tokens, ``backward()``.

    No loss function of posttrain's, no logprob or entropy path, no optimizer step. The
    gradients it makes are dropped (``parameters``' ``.grad`` set to None before and after,
    so the next train call starts as it would have), and the RNG states are restored after
    it (``torch.random.fork_rng``), so a run with the reference on trains exactly as one
    without. On CUDA the time includes a synchronize at each end.

    Args:
        model: the trained module (a Hugging Face causal LM: called with ``input_ids`` and
            ``attention_mask``, returns ``.logits`` ``[b, S, V]``).
        micro_batches: the rows the train call trained on, in its micro-batches, on the
            model's device.
        autocast: the worker's precision context (bf16 autocast for bf16-mixed).
        parameters: the parameters whose gradients the backward makes.

    Returns:
        Seconds, > 0.

    Raises:
        ValueError: ``micro_batches`` is empty.
    """
    if not micro_batches:
        raise ValueError("the reference step needs at least one micro-batch")
    device = micro_batches[0].input_ids.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for p in parameters:
        p.grad = None
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        sync()
        start = time.perf_counter()
        for mb in micro_batches:
            with autocast():
                logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
            targets = mb.input_ids[:, 1:].masked_fill(mb.attention_mask[:, 1:] == 0, -100)
            loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), targets.flatten(), ignore_index=-100)
            loss.backward()
        sync()
        seconds = time.perf_counter() - start
    for p in parameters:
        p.grad = None
    return seconds
