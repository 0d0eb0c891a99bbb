"""Shared by the probe tests of both backends: a training step that moves the weights, and
a policy wrapper that loses one tensor during refit."""

from typing import Any

from posttrain.algorithms.loss_functions import NLLLoss
from posttrain.data.batch import make_batch


def train_step(rt: Any, answer: str = "77") -> dict[str, float]:
    """One NLL step towards answering ``answer`` to "a+1=": the weights move measurably."""
    pairs = [rt.chat.sft_example(f"{a}+1=", answer) for a in range(16)]
    batch = make_batch([p for p, _ in pairs], [c for _, c in pairs], rt.tokenizer.pad_token_id)
    return rt.policy.train(batch, {}, NLLLoss())


class DropOneTensor:
    """A policy whose ``get_weights`` loses tensor ``name`` on the way: a partial refit."""

    def __init__(self, policy: Any, name: str):
        self.policy, self.name = policy, name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.policy, attr)

    def get_weights(self) -> dict[str, Any]:
        weights = self.policy.get_weights()
        del weights[self.name]
        return weights
