"""Code that only a Ray actor runs: the coverage test checks these lines count as covered."""

import ray


def doubled_plus_one(x: int) -> int:
    y = 2 * x  # ACTOR-ONLY LINE
    return y + 1


@ray.remote(num_cpus=0.1)
class Doubler:
    def run(self, x: int) -> int:
        return doubled_plus_one(x)
