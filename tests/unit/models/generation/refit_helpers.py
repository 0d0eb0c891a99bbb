"""Shared by the refit tests of both backends: a training step that moves the weights, a
policy wrapper that loses one tensor during refit, long prompts sharing a prefix, and the
engine-vs-trainer logprob gap, engines that skip loading a refit."""

import contextlib
from collections.abc import Iterator
from typing import Any

import ray
import torch

from posttrain.algorithms.loss_functions import NLLLoss
from posttrain.data.batch import make_batch


def answer_batch(rt: Any, answer: str = "77") -> Any:
    """16 SFT rows answering ``answer`` to "a+1=" (a = 0..15)."""
    pairs = [rt.chat.sft_example(f"{a}+1=", answer) for a in range(16)]
    return make_batch([p for p, _ in pairs], [c for _, c in pairs], rt.tokenizer.pad_token_id)


def train_step(rt: Any, answer: str = "77") -> dict[str, float]:
    """One NLL step towards answering ``answer`` to "a+1=": the weights move measurably."""
    return rt.policy.train(answer_batch(rt, answer), {}, NLLLoss()).metrics


@contextlib.contextmanager
def engines_skip(rt: Any, method: str) -> Iterator[None]:
    """Inside the block, every engine actor's ``method`` (e.g. its weight loading) does
    nothing: an instance attribute over the class's, removed again on leaving. A refit
    then reaches the engines and loads nothing, and what they report comes from their own
    code, not from a double on the driver."""
    workers = rt.generation.group.workers
    ray.get([w.__ray_call__.remote(lambda self: setattr(self, method, lambda *a, **k: None)) for w in workers])
    try:
        yield
    finally:
        ray.get([w.__ray_call__.remote(lambda self: delattr(self, method)) for w in workers])


@contextlib.contextmanager
def engines_drop(rt: Any, name: str) -> Iterator[None]:
    """Inside the block, every engine's loader silently skips tensor ``name`` after the refit
    passed its checks (a loader bug: the names and shapes were right, one tensor never lands)."""
    workers = rt.generation.group.workers

    def install(worker: Any) -> None:
        load = type(worker)._load_weights
        worker._load_weights = lambda tensors, version: load(worker, ((n, t) for n, t in tensors if n != name),
                                                             version)

    ray.get([w.__ray_call__.remote(install) for w in workers])
    try:
        yield
    finally:
        ray.get([w.__ray_call__.remote(lambda self: delattr(self, "_load_weights")) for w in workers])


def answer_nll(rt: Any, answer: str = "77") -> float:
    """Token-mean NLL of :func:`answer_batch` under the policy's current weights: what a
    memorization loop stops on (a train call's own loss is measured before its update,
    which at lr 1e-2 can overshoot, so the weights a refit then sends may not have learned)."""
    batch = answer_batch(rt, answer)
    return float(-rt.policy.get_logprobs(batch)[batch.completion_mask.bool()].mean())


class DropOneTensor:
    """A policy whose refit weights lose tensor ``name`` on the way: a partial refit (refit it
    with ``transport="object_store"``: the weights pass through :meth:`put_weights`, where one
    is dropped)."""

    def __init__(self, policy: Any, name: str):
        self.policy, self.name = policy, name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.policy, attr)

    def put_weights(self, probe: Any = None, cuda_ipc: bool = False) -> tuple[Any, Any]:
        import ray

        ref, probe_logprobs = self.policy.put_weights(probe)  # through the object store, to edit it
        weights = dict(ray.get(ref))
        del weights[self.name]
        return ray.put(weights), probe_logprobs


def shared_prefix_prompts(rt: Any, min_prefix_tokens: int) -> tuple[list[list[int]], list[list[int]]]:
    """Two sets of 4 prompts of equal length that all start with the same arithmetic text
    ("1+4=5 2+5=7 ..." of at least ``min_prefix_tokens`` tokens) and end with different
    questions ("a+1=" in the first set, "a+2=" in the second).

    A prefix longer than a KV block is what a prefix cache keeps: an engine that served
    the first set before a refit holds the shared prefix's blocks when the second set
    (or the first again) arrives after it.
    """
    facts = ""
    n = 1
    while len(rt.chat.prompt(facts)) < min_prefix_tokens:
        facts += f"{n}+{n + 3}={2 * n + 3} "
        n += 1
    return ([list(rt.chat.prompt(f"{facts}{a}+1=")) for a in range(4)],
            [list(rt.chat.prompt(f"{facts}{a}+2=")) for a in range(4)])


def max_logprob_gap(rt: Any, prompts: list[list[int]], completions: list[list[int]],
                    engine_rows: list[list[float]]) -> float:
    """max |engine - trainer| over the completion tokens, nats; the trainer scores the
    same tokens with its current weights (``engine_rows``: per row, one logprob a token)."""
    batch = make_batch(prompts, completions, rt.tokenizer.pad_token_id)
    trainer = rt.policy.get_logprobs(batch)  # [B, L]
    engine = torch.zeros_like(trainer)
    for b, row in enumerate(engine_rows):
        engine[b, : len(row)] = torch.tensor(row)
    return float((engine - trainer)[batch.completion_mask.bool()].abs().max())
