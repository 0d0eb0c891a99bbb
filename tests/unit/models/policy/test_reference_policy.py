"""A policy worker built without a reference policy (``reference=false``: GRPO at kl_coef 0,
SFT) holds no copy of it and refuses, in one line, to score one."""

from __future__ import annotations

import pytest
import torch

from posttrain.config import PolicyWorkerConfig
from posttrain.data.batch import make_batch
from posttrain.models.policy.hf_policy_worker import HfPolicyWorkerImpl


@pytest.mark.parametrize("reference", [True, False])
def test_a_worker_keeps_a_reference_copy_only_when_asked(tiny_model_path, reference: bool) -> None:
    cfg = PolicyWorkerConfig.model_validate({"reference": reference})
    worker = HfPolicyWorkerImpl(tiny_model_path, cfg)
    batch = make_batch([[3, 4, 5]], [[6, 7]], pad_id=0)
    if reference:
        torch.testing.assert_close(worker.get_logprobs(batch, reference=True), worker.get_logprobs(batch))
        assert worker.reference is not None and worker.reference is not worker.model
        return
    assert worker.reference is None
    with pytest.raises(ValueError, match="without a reference policy") as err:
        worker.get_logprobs(batch, reference=True)
    assert "\n" not in str(err.value)
    assert worker.get_logprobs(batch).shape == batch.completion_mask.shape  # the trained model still scores
