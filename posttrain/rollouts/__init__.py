"""Asynchronous rollouts: samples tagged with the weights that drew them, the buffer that
holds them between the producer and the trainer, the filters the driver applies, and the
fan-out to data-parallel ranks. See ``posttrain.algorithms.async_grpo`` for the loop."""
