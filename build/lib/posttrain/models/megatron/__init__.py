"""The Megatron-core side of the Megatron policy backend.

``conversion`` maps Hugging Face Qwen2 weights to megatron-core ``GPTModel`` tensor-parallel
shards and back (pure torch: no megatron import); ``model`` builds the ``GPTModel``, its
parallel state, DDP wrapper and optimizer. The policy worker that uses them is
``posttrain.models.policy.megatron_policy_worker``.
"""
