"""Refit over a gloo broadcast on CPUs, real Ray: a policy and two Hugging Face engines.

``generation.refit_transport=auto`` on CPUs broadcasts; the weights travel in buckets of
``generation.refit_bucket_mb`` (1 MiB here: the tiny model takes several), every engine then
scores exactly as the trainer, and ``object_store`` sends no broadcast at all. With several
engines, a refit that one of them only pretends to load fails, whichever one it is.
"""

from __future__ import annotations

import pytest
import ray
from unit.models.generation.refit_helpers import train_step

from posttrain.algorithms.runtime import setup_runtime
from posttrain.config import ClusterConfig, GenerationConfig, ModelConfig, PolicyConfig, RefitProbeConfig
from posttrain.errors import RefitProbeError, StaleWeightsError
from posttrain.weight_sync.refit import refit, refit_transport


def runtime(tiny_model_path: str, num_workers: int = 2, **generation):
    return setup_runtime(ModelConfig(path=tiny_model_path), PolicyConfig(lr=1e-2),
                         GenerationConfig(backend="hf", num_workers=num_workers, **generation),
                         ClusterConfig(cpus_per_worker=0.5), seed=0)


@pytest.mark.parametrize("bucket_mb", [1, 512])
@pytest.mark.slow(reason="real engines on Ray refit over a torch.distributed broadcast")
def test_a_cpu_refit_is_a_broadcast_in_buckets_and_every_engine_serves_the_new_weights(
        ray_cluster, tiny_model_path, bucket_mb):
    rt = runtime(tiny_model_path, refit_bucket_mb=bucket_mb)
    try:
        assert refit_transport(rt.policy, rt.generation) == "broadcast"
        for _ in range(2):  # the second refit reuses the group
            train_step(rt)
            stale = rt.probe.measure(rt.policy, rt.generation)["train/refit_logprob_error"]
            assert stale > 1e-2, stale
            error = refit(rt.policy, rt.generation, rt.probe)["train/refit_logprob_error"]
            assert error < 1e-6, error  # the probe's sequences are shared out over both engines
            assert rt.generation.weight_version() == rt.policy.weight_version
        buckets, sent = rt.policy.last_broadcast
        # fp32, a tied embedding once: the model's bytes; 1 MiB buckets split them
        assert sent >= 4 * sum(p.numel() for p in _unique_params(tiny_model_path))
        assert (buckets > 1) == (bucket_mb == 1) and buckets <= sent // 2**20 + 2
    finally:
        rt.shutdown()


@pytest.mark.slow(reason="real engines on Ray refit through the object store")
def test_refit_transport_object_store_sends_no_broadcast(ray_cluster, tiny_model_path):
    rt = runtime(tiny_model_path, refit_transport="object_store")
    try:
        assert refit_transport(rt.policy, rt.generation) == "object_store"
        train_step(rt)
        error = refit(rt.policy, rt.generation, rt.probe)["train/refit_logprob_error"]
        assert error < 1e-6
        assert rt.policy.last_broadcast is None
    finally:
        rt.shutdown()


@pytest.mark.slow(reason="real engines on Ray refit over a torch.distributed broadcast")
def test_a_refit_that_one_engine_only_pretends_to_load_fails_whichever_engine_it_is(ray_cluster, tiny_model_path):
    """Three engines, a probe configured with 2 sequences (fewer than the engines): each engine in
    turn takes the new version number without loading the weights. The refit must fail for every
    one of them, the third (which a 2-row probe shared over 3 engines would leave unprobed) too.
    Then each in turn loads nothing and keeps its old version: the version check names the split,
    whichever engine lags (not only the first)."""
    rt = runtime(tiny_model_path, num_workers=3, refit_transport="object_store",
                 refit_probe=RefitProbeConfig(num_sequences=2))
    try:
        workers = rt.generation.group.workers
        for index in range(3):
            train_step(rt)
            # inside that engine actor (lambdas travel by value): its loads take the version, copy nothing
            ray.get(workers[index].__ray_call__.remote(
                lambda engine: setattr(engine, "_load_weights", lambda tensors, version: setattr(engine, "version",
                                                                                                         version))))
            with pytest.raises(RefitProbeError, match="weight-sync probe failed"):
                refit(rt.policy, rt.generation, rt.probe)
            ray.get(workers[index].__ray_call__.remote(lambda engine: delattr(engine, "_load_weights")))  # its own
            assert refit(rt.policy, rt.generation, rt.probe)["train/refit_logprob_error"] < 1e-6  # all loaded
        for index in range(3):  # an engine that loads nothing and keeps its old version: the versions disagree
            train_step(rt)
            ray.get(workers[index].__ray_call__.remote(
                lambda engine: setattr(engine, "_load_weights", lambda tensors, version: None)))
            with pytest.raises(StaleWeightsError, match=r"disagree on the weight version: \[\d+, \d+\]"):
                refit(rt.policy, rt.generation, rt.probe)
            ray.get(workers[index].__ray_call__.remote(lambda engine: delattr(engine, "_load_weights")))
            refit(rt.policy, rt.generation, rt.probe)
    finally:
        rt.shutdown()


def _unique_params(path: str):
    from transformers import AutoModelForCausalLM

    return list(AutoModelForCausalLM.from_pretrained(path).parameters())  # tied ones once
