"""The engines' outputs gathered in order, from engines that must hold the same weights."""

from __future__ import annotations

from collections.abc import Sequence

from posttrain.models.generation.interfaces import GenerationOutput
from posttrain.weight_sync.receipt import agreed_version


def gather_outputs(outs: Sequence[GenerationOutput], who: str) -> GenerationOutput:
    """Concatenate per-shard outputs in shard order; the engines must agree on the weight version.

    Raises:
        StaleWeightsError: see :func:`~posttrain.weight_sync.receipt.agreed_version`.
    """
    return GenerationOutput(
        completion_ids=[c for o in outs for c in o.completion_ids],
        logprobs=[lp for o in outs for lp in o.logprobs],
        weight_version=agreed_version((o.weight_version for o in outs), who),
    )
