"""Inner test of test_harness_coverage.py: runs actor_only.py's code in a Ray actor only."""

import actor_only
import pytest
import ray
from case_cluster import record_cluster

# Ray workers do not have this directory on sys.path: ship the module's code by value
# (its code objects keep their file name, so coverage attributes the lines to actor_only.py).
ray.cloudpickle.register_pickle_by_value(actor_only)


@pytest.mark.slow(reason="a Ray actor started under coverage")
def test_actor_runs_code(ray_cluster, tracker):
    record_cluster(tracker)
    actor = actor_only.Doubler.remote()
    try:
        assert ray.get(actor.run.remote(3)) == 7
    finally:
        ray.kill(actor)
