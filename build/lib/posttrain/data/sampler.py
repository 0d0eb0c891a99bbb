"""Which training problems each step uses: every problem once per epoch, a new order each epoch.

Step ``s`` (1-based) belongs to epoch ``e = (s - 1) // steps_per_epoch`` and takes batch
``(s - 1) % steps_per_epoch`` of that epoch. Epoch ``e`` is a permutation of the pool drawn
from ``(seed, e)``, cut into ``steps_per_epoch = len(pool) // batch_size`` consecutive
batches; the ``len(pool) % batch_size`` problems at the end of the permutation sit that epoch
out (the next permutation places them elsewhere). So a batch never holds a problem twice, no
problem repeats within an epoch, and every problem is seen equally often in the long run (as
PyTorch's ``DataLoader(shuffle=True, drop_last=True)`` with a new shuffle each epoch).

The batch of a step is a pure function of ``(pool, batch_size, seed, step)``: a run resumed
at step ``s`` continues with exactly the problems an uninterrupted run would have used.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Generic, TypeVar

from posttrain.errors import ConfigError

T = TypeVar("T")


class EpochSampler(Generic[T]):
    """Batches of ``batch_size`` distinct items of ``pool`` for steps 1, 2, ...

    Args:
        pool: the training problems (any items; the sampler never mutates the sequence).
        batch_size: items per step, ``1 <= batch_size <= len(pool)``.
        seed: seed of the epoch permutations; the same seed gives the same batches.

    Raises:
        ConfigError: ``batch_size`` is below 1 or larger than the pool.
    """

    def __init__(self, pool: Sequence[T], batch_size: int, seed: int):
        if not 1 <= batch_size <= len(pool):
            raise ConfigError(f"cannot draw {batch_size} distinct problems per step from a pool of {len(pool)}")
        self.pool = pool
        self.batch_size = batch_size
        self.seed = seed
        self._order: tuple[int, list[int]] | None = None  # (epoch, its permutation): one epoch cached

    @property
    def steps_per_epoch(self) -> int:
        """Full batches per epoch: ``len(pool) // batch_size`` (>= 1)."""
        return len(self.pool) // self.batch_size

    def epoch_of(self, step: int) -> int:
        """The epoch (0-based) that step ``step`` (1-based) belongs to."""
        return (step - 1) // self.steps_per_epoch

    def _permutation(self, epoch: int) -> list[int]:
        if self._order is None or self._order[0] != epoch:
            # one integer seed per (seed, epoch): str/tuple seeds would hash differently by version
            order = random.Random(self.seed * 1_000_003 + epoch).sample(range(len(self.pool)), len(self.pool))
            self._order = (epoch, order)
        return self._order[1]

    def batch(self, step: int) -> list[T]:
        """The ``batch_size`` items of training step ``step``.

        Raises:
            ValueError: ``step`` is below 1 (training steps count from 1).
        """
        if step < 1:
            raise ValueError(f"training steps count from 1, got step {step}")
        start = (step - 1) % self.steps_per_epoch * self.batch_size
        order = self._permutation(self.epoch_of(step))
        return [self.pool[i] for i in order[start:start + self.batch_size]]
