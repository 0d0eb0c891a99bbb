"""Inner test of test_harness_coverage.py: runs actor_only.py's code in a Ray actor only."""

import ray
from actor_only import Doubler

from posttrain.distributed.ray_cluster import init_ray


def test_actor_runs_code(ray_cluster):
    actor = Doubler.remote()
    try:
        assert ray.get(actor.run.remote(3)) == 7
    finally:
        ray.kill(actor)
