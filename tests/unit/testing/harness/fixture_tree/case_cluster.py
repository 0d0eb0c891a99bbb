"""Inner test of test_harness_coverage.py: records which Ray cluster this process's tests got."""

import os

import pytest
import ray


def record_cluster(tracker) -> None:
    """Into unit_results.json: the cluster's GCS address, session directory and CPUs, the xdist worker,
    this process's torch threads and the niceness of the cluster's worker processes."""
    import torch

    tracker.track("gcs", ray.get_runtime_context().gcs_address)
    tracker.track("session_dir", ray._private.worker._global_node.get_session_dir_path())
    tracker.track("cpus", ray.cluster_resources()["CPU"])
    tracker.track("worker", os.environ.get("PYTEST_XDIST_WORKER", "none"))
    tracker.track("torch_threads", torch.get_num_threads())
    tracker.track("actor_niceness", ray.get(niceness.remote()))


@ray.remote(num_cpus=0)
def niceness() -> int:
    """The niceness of the Ray worker process that runs this task (Ray's default for workers: 15)."""
    return os.nice(0)


@pytest.mark.slow(reason="a Ray task on the cluster, under coverage in the inner run")
def test_records_its_ray_cluster(ray_cluster, tracker):
    record_cluster(tracker)
