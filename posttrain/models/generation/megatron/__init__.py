"""The megatron engine (``generation.backend=megatron``): megatron-core's inference loop in a Ray
actor of its own; its worker is imported only when the backend is used (megatron-core is the
``mcore`` extra)."""
