"""Refit seconds and GB/s against model size, through the real Ray path, old and new side by side.

    python benchmarks/refit_bench.py [--sizes 25m 0.4b 1.5b] [--placement colocated separate cpu]
        [--precision bf16-mixed] [--refits 5]

For each model size and placement, a policy worker and one Hugging Face engine start on a
local Ray cluster; then refits alternate between three paths:

- ``driver``: the weights come back to the driver (``Policy.get_weights``) and go out to
  the engine again (``update_weights(dict)``): what posttrain did before the weights were
  handed over by reference;
- ``store``: ``weight_sync.refit`` with ``generation.refit_transport=object_store`` - the policy
  worker puts the weights into the object store and the driver passes only the reference on;
- ``direct``: ``weight_sync.refit`` as a run does it (``auto``): CUDA IPC when colocated, else a
  broadcast from the policy worker (NCCL between GPUs, gloo on CPUs).

Both refit paths check the weight version and run the weight-sync probe (it must pass; the
direct path's error is printed). ``colocated``: policy and engine share one GPU (half a GPU
each); ``separate``: one GPU each (needs 2); ``cpu``: both on CPUs. Prints the median seconds
per refit of each path and the direct path's GB/s (bytes of the weights in the engine's
dtype, a tied embedding once), and as the last line the direct/driver ratio of the last row.
The models are Qwen2 of the stated shapes with random weights (25M: hidden 512, 4 layers;
0.4B: the shape of benchmarks/train_step_bench.py; 1.5B: hidden 1536, 28 layers, vocabulary
151,936).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import ray
import torch

from posttrain.config import GenerationWorkerConfig, PolicyConfig, PolicyWorkerConfig, RefitProbeConfig, engine_dtype
from posttrain.distributed.ray_cluster import RayVirtualCluster, init_ray
from posttrain.models.generation.engine_group import EngineGroup
from posttrain.models.generation.hf_generation_worker import HfGenerationWorker
from posttrain.models.policy.lm_policy import Policy
from posttrain.weight_sync.probe import RefitProbe
from posttrain.weight_sync.refit import refit, refit_transport

SHAPES = {
    "25m": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                intermediate_size=1408, vocab_size=32_000),
    "0.4b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=32_000),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151_936),
}


class _Vocab:
    """The probe's view of a tokenizer: ids 3..vocab, 0 the pad."""

    def __init__(self, size: int):
        self.size, self.all_special_ids, self.pad_token_id = size, [0, 1, 2], 0

    def __len__(self) -> int:
        return self.size


def build_model(shape: str, directory: Path) -> int:
    """Save a random Qwen2 of ``shape`` to ``directory``; returns its parameter count."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config.from_dict({**SHAPES[shape], "max_position_embeddings": 4096, "tie_word_embeddings": True,
                                    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def bench(path: Path, shape: str, placement: str, precision: str, refits: int) -> dict[str, Any]:
    """Median seconds of each path over ``refits`` alternating refits, and the probe error."""
    gpus = {"colocated": 1, "separate": 2, "cpu": 0}[placement]
    device: Literal["cpu", "cuda"] = "cpu" if placement == "cpu" else "cuda"
    init_ray(num_gpus=gpus)
    try:
        cluster = RayVirtualCluster(2, num_cpus=1, num_gpus={"colocated": 0.5, "separate": 1.0, "cpu": 0.0}[placement])
        pcfg = PolicyWorkerConfig.of(PolicyConfig.model_validate({"precision": precision}), 1.0, device)
        policy = Policy(cluster, str(path), pcfg, seed=0, bundle_indices=[0])
        gcfg = GenerationWorkerConfig(device=device, dtype=engine_dtype(pcfg.resolved_precision))
        engine = EngineGroup(cluster, HfGenerationWorker, str(path), gcfg, [1])
        policy.wait_ready()
        engine.wait_ready()
        probe = RefitProbe(RefitProbeConfig(), _Vocab(SHAPES[shape]["vocab_size"]), 1.0, pcfg.resolved_precision)
        store_cfg = gcfg.model_copy(update={"refit_transport": "object_store"})
        seconds: dict[str, list[float]] = {"driver": [], "store": [], "direct": []}
        error = 0.0
        for _ in range(refits + 1):  # the first round warms the paths up
            start = time.perf_counter()
            engine.update_weights(policy.get_weights(), policy.weight_version)
            seconds["driver"].append(time.perf_counter() - start)
            engine.group_cfg = store_cfg
            start = time.perf_counter()
            refit(policy, engine, probe)
            seconds["store"].append(time.perf_counter() - start)
            engine.group_cfg = gcfg
            start = time.perf_counter()
            error = refit(policy, engine, probe)["train/refit_logprob_error"]
            seconds["direct"].append(time.perf_counter() - start)
        out: dict[str, Any] = {name: statistics.median(s[1:]) for name, s in seconds.items()}
        out["probe_error"], out["probe_bound"] = error, probe.bound or 0.0
        out["transport"] = refit_transport(policy, engine)
        engine.shutdown()
        policy.shutdown()
        cluster.shutdown()
        return out
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["25m", "0.4b", "1.5b"], choices=sorted(SHAPES))
    parser.add_argument("--placement", nargs="+", default=["colocated", "separate"],
                        choices=["colocated", "separate", "cpu"])
    parser.add_argument("--precision", default="bf16-mixed", choices=["fp32", "bf16", "bf16-mixed"])
    parser.add_argument("--refits", type=int, default=5)
    args = parser.parse_args()
    bytes_per = 4 if args.precision == "fp32" else 2
    print(f"refit of a Qwen2 policy into one HF engine, {args.precision} ({bytes_per} bytes per weight sent)")
    print(f"{'size':<6} {'placement':<10} {'direct via':<10} {'driver s':>9} {'store s':>8} {'direct s':>9} "
          f"{'direct GB/s':>12} {'probe error':>12}")
    ratio = 0.0
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            params = build_model(size, Path(tmp))
            for placement in args.placement:
                r = bench(Path(tmp), size, placement, args.precision, args.refits)
                gbs = params * bytes_per / r["direct"] / 1e9
                print(f"{size:<6} {placement:<10} {r['transport']:<10} {r['driver']:>9.3f} {r['store']:>8.3f} "
                      f"{r['direct']:>9.3f} {gbs:>12.2f} {r['probe_error']:>12.2e}", flush=True)
                ratio = r["direct"] / r["driver"]
    print(f"direct/driver refit seconds ratio (last row): {ratio:.2f}")


if __name__ == "__main__":
    main()
