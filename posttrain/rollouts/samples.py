"""One rollout sample as it travels producer -> buffer -> filter -> trainer.

A sample is a plain ``dict`` (it crosses the Ray boundary and is checked at run time by
the filters: a tag that is missing or mistyped raises, it is never guessed).
"""

from __future__ import annotations

from typing import TypedDict


class RolloutSample(TypedDict):
    """One sampled completion of one prompt, with its tags.

    Tags:
        sample_id: unique over the run (``batch_index * N + row``).
        group_id: the prompt's GRPO group, unique over the run (``batch_index * P + prompt``);
            the G samples of a group are produced, kept, dropped and sharded together.
        weight_version: the engine's weight version when it sampled (``int``, never bool).
        seq_len: prompt + completion tokens.
        batch_index: the training step this sample was produced for (1-based).

    Payload:
        prompt_ids, completion_ids: token ids (completion without padding).
        generation_logprobs: the engine's (behaviour policy's) logprob of each completion
            token at the sampling temperature, ``len == len(completion_ids)``.
        reward: the verifier's 1.0 / 0.0.
        question, answer: the problem's text and the reference answer the reward was judged against.
    """

    sample_id: int
    group_id: int
    weight_version: int
    seq_len: int
    batch_index: int
    prompt_ids: list[int]
    completion_ids: list[int]
    generation_logprobs: list[float]
    reward: float
    question: str
    answer: str


TAGS = ("sample_id", "group_id", "weight_version", "seq_len", "batch_index")
