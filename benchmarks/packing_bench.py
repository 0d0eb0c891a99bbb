"""The HF policy worker's train step on padded rows against the same step with sequence packing.

    python benchmarks/packing_bench.py [--shape small|0.4b|tiny] [--rows 16] [--steps 5]
        [--precision fp32] [--device cpu|cuda]

One GRPO train step (``HfPolicyWorkerImpl.train``: forward, fp32 logprobs, clipped loss,
backward, clip, AdamW) of three workers built from the same directory, alternating step by step
after one warm-up step each, so clock and load drift hit all: ``padded`` (sdpa, the padding mask),
``packed`` (``policy.sequence_packing=true``: the varlen attention, ``models.packed_attention``)
and ``dense`` (the same packed rows through sdpa and transformers' dense block-diagonal mask).
The rows have skewed lengths, as GRPO rollouts on GSM8K do:
prompts of 60-140 tokens, completions drawn from an exponential of mean 120 tokens capped at
512; ``make_batch`` pads every row to the longest prompt plus the completion bucket (512), so
most of a padded row is padding. Prints the real and padded token counts, seconds per step
(median of ``--steps``), real tokens/s on each side and the speed-ups over padded.

Shapes: ``small`` (hidden 256, 4 layers, vocabulary 32,000: minutes on 2 CPU cores), ``0.4b``
(train_step_bench's Qwen2 shape, for a GPU), ``tiny`` (seconds; no meaningful numbers).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from train_step_bench import SHAPES, build_model  # this folder's (run as a script)

from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.config import PolicyWorkerConfig
from posttrain.data.batch import TokenBatch, make_batch
from posttrain.models import packed_attention
from posttrain.models.policy.hf_policy_worker import HfPolicyWorkerImpl


def skewed_batch(rows: int, vocab: int, seed: int = 0) -> TokenBatch:
    """Rows of GSM8K-like lengths (module docstring), right-padded by ``make_batch``."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(60, 141, (rows,), generator=g)
    completion_lens = (torch.empty(rows).exponential_(1 / 120, generator=g).long() + 1).clamp(max=512)
    prompts = [torch.randint(3, vocab, (int(n),), generator=g).tolist() for n in prompt_lens]
    comps = [torch.randint(3, vocab, (int(n),), generator=g).tolist() for n in completion_lens]
    return make_batch(prompts, comps, pad_id=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="small", choices=sorted(SHAPES))
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per side (after 1 warm-up step)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16-mixed", "bf16"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        build_model(args.shape, Path(tmp))
        batch = skewed_batch(args.rows, SHAPES[args.shape]["vocab_size"])
        advantages = torch.linspace(-1.0, 1.0, args.rows)
        workers = {}
        for name, packing in (("padded", False), ("packed", True), ("dense", True)):
            cfg = PolicyWorkerConfig.model_validate({
                "precision": args.precision, "device": args.device, "lr": 1e-6, "num_threads": args.threads,
                "train_global_batch_size": args.rows, "train_micro_batch_size": args.rows,
                "logprob_batch_size": args.rows, "reference": False, "sequence_packing": packing})
            workers[name] = HfPolicyWorkerImpl(tmp, cfg)
        # "dense": packed rows attended through sdpa and transformers' dense block-diagonal mask, which it
        # builds from the restarting position ids (the packing worker before the varlen attention)
        workers["dense"].model.set_attn_implementation("sdpa")
        times: dict[str, list[float]] = {name: [] for name in workers}
        for i in range(args.steps + 1):
            for name, worker in workers.items():
                start = time.perf_counter()
                worker.train(batch, {"advantages": advantages}, ClippedPGLoss())  # .item() metrics: synchronised
                if i >= 1:
                    times[name].append(time.perf_counter() - start)
    real, padded = int(batch.attention_mask.sum()), batch.attention_mask.numel()
    flash = packed_attention._flash_varlen() is not None and args.device == "cuda" and args.precision != "fp32"
    kernel = ("torch flash varlen kernel" if flash else "sdpa per sequence length" if args.device == "cpu"
              else "sdpa, a block-diagonal mask")
    print(f"shape {args.shape}, {args.rows} rows, {args.precision} on {args.device} ({args.threads} threads): "
          f"{real} real tokens of {padded} padded ({real / padded:.0%}); packed attention: "
          f"{kernel}, dense: one [T, T] block-diagonal mask")
    median = {name: statistics.median(seconds) for name, seconds in times.items()}
    for name, seconds in times.items():
        print(f"  {name:6s} {median[name]:.3f} s/step (min {min(seconds):.3f}, max {max(seconds):.3f}), "
              f"{real / median[name]:,.0f} real tokens/s")
    print(f"  packed / padded speed-up: {median['padded'] / median['packed']:.2f}x "
          f"(dense-mask packing: {median['padded'] / median['dense']:.2f}x)")


if __name__ == "__main__":
    main()
