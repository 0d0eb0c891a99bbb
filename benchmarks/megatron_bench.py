"""Policy train step, Megatron vs Hugging Face backend, side by side on one GPU: step time,
tokens/s, MFU and peak GPU memory of the policy worker's ``train`` at the same shape.

    python benchmarks/megatron_bench.py [--shape 0.4b|1.4b|25m] [--rows 8] [--seq 1024] [--steps 5] [--rounds 3]
        [--variants hf:bf16-mixed,megatron-local:bf16-mixed,megatron-torch:bf16-mixed] [--batch uniform|skewed]

The model is a randomly initialised Qwen2 (``0.4b``: hidden 896, 24 layers, 14 query / 2
key-value heads, ffn 4864, vocab 32k, ~0.39B parameters, tied embeddings; ``1.4b``: hidden
1536, 28 layers, 12 / 2 heads, ffn 8960, vocab 32k, ~1.36B). One ``train`` call = one
optimizer step over ``rows`` sequences of ``seq`` tokens (all completion, GRPO loss), through
the worker classes the library runs (``HfPolicyWorkerImpl``, ``MegatronPolicyWorkerImpl``, in
this process). A variant is ``backend:precision``; ``megatron-local`` and ``megatron-torch``
are the Megatron policy with ``policy.megatron.layer_spec`` local (megatron-core's unfused
attention) and torch (torch's fused attention; the default); a ``+packed`` suffix turns on
``policy.sequence_packing``. ``--batch skewed`` replaces the uniform rows by ``rows`` rows of
GSM8K-like lengths (``packing_bench.skewed_batch``: mostly padding), and tokens/s counts the real
tokens only. The first variant is the
reference: every row prints its speed as a ratio to it, measured in the same invocation:
the median over ``--rounds`` rounds (each variant timed once per round, a fresh worker each time)
of the round's ratio, with the range over the rounds. A variant's time is the median over
``--steps`` calls after two warm-up calls, then over the rounds; MFU = 6 * parameters *
tokens/s / 989e12 (H100 dense bf16 peak; for fp32 rows it is the same yardstick, not the fp32
peak).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness.policy_backends import make_worker  # noqa: E402

from posttrain.algorithms.loss_functions import ClippedPGLoss  # noqa: E402
from posttrain.data.batch import TokenBatch  # noqa: E402

SHAPES: dict[str, dict[str, Any]] = {
    "0.4b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=32000),
    "1.4b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=32000),
    "25m": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                intermediate_size=1536, vocab_size=4096),
}
H100_PEAK_FLOPS = 989e12


def build_model(shape: str, out: Path) -> int:
    """Save a random Qwen2 of ``shape`` to ``out``; returns its parameter count."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=4096, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def make_rows(rows: int, seq: int, vocab: int) -> TokenBatch:
    """``rows`` sequences of one prompt token and ``seq - 1`` completion tokens (no padding)."""
    ids = torch.randint(2, vocab, (rows, seq))
    return TokenBatch(input_ids=ids, attention_mask=torch.ones_like(ids),
                      prompt_lens=torch.ones(rows, dtype=torch.long), completion_lens=torch.full((rows,), seq - 1),
                      completion_mask=torch.ones(rows, seq - 1))


def bench(variant: str, path: str, batch: TokenBatch, steps: int) -> dict[str, float]:
    """Median ``train`` seconds and peak GPU GiB of one variant (``backend[-layer_spec]:precision``)."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    rows = len(batch)
    name, precision = variant.split(":")
    precision, _, packed = precision.partition("+")
    backend, _, layer_spec = name.partition("-")
    spec: dict[str, Any] = {"layer_spec": layer_spec} if backend == "megatron" and layer_spec else {}
    worker = make_worker(backend, path, precision=precision, device="cuda", lr=1e-6, train_global_batch_size=rows,
                         train_micro_batch_size=rows, logprob_batch_size=rows, sequence_packing=packed == "packed",
                         **spec)
    zeros = torch.zeros(batch.completion_mask.shape)
    extra = {"advantages": torch.randn(rows), "old_logprobs": zeros - 10.0, "ref_logprobs": zeros - 10.0}
    times = []
    for i in range(steps + 2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        worker.train(batch, extra, ClippedPGLoss())
        torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - start)
    out = {"step_s": statistics.median(times), "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    del worker
    gc.collect()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.4b")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3,
                        help="every variant is timed once per round, round after round; the ratios are medians over "
                             "the rounds, with their range")
    parser.add_argument("--variants", default="hf:bf16-mixed,megatron-local:bf16-mixed,megatron-torch:bf16-mixed",
                        help="comma-separated backend[-layer_spec]:precision[+packed]; the first is the ratios' "
                        "reference")
    parser.add_argument("--batch", choices=["uniform", "skewed"], default="uniform",
                        help="uniform: rows x seq tokens, no padding; skewed: GSM8K-like lengths, mostly padding")
    args = parser.parse_args()
    variants = args.variants.split(",")
    for v in variants:
        name, _, precision = v.partition(":")
        precision, _, packed = precision.partition("+")
        if name not in ("hf", "megatron", "megatron-local", "megatron-torch") or precision not in (
                "fp32", "bf16-mixed") or packed not in ("", "packed"):
            sys.exit(f"megatron_bench.py: bad variant {v!r} (backend[-layer_spec]:precision[+packed], e.g. "
                     "megatron-torch:fp32+packed)")
    if args.rounds < 1 or args.steps < 1:
        sys.exit(f"megatron_bench.py: --rounds and --steps must be >= 1, got {args.rounds} and {args.steps}")
    if not torch.cuda.is_available():
        sys.exit("megatron_bench.py: needs 1 GPU, found 0")
    with tempfile.TemporaryDirectory() as tmp:
        params = build_model(args.shape, Path(tmp))
        if args.batch == "skewed":
            from packing_bench import skewed_batch  # this folder's (run as a script)

            batch = skewed_batch(args.rows, SHAPES[args.shape]["vocab_size"])
        else:
            batch = make_rows(args.rows, args.seq, SHAPES[args.shape]["vocab_size"])
        tokens = int(batch.attention_mask.sum())
        print(f"{args.shape}: {params / 1e6:.0f}M parameters, {args.rows} rows, {tokens} real tokens of "
              f"{batch.attention_mask.numel()} padded per step, {torch.cuda.get_device_name()}")
        # Round after round, every variant once per round: a drift of the GPU's or the host's speed
        # over the invocation (5-17% seen on the H100/H200 machines) then lands on every variant, and
        # the spread of the per-round ratios shows how far one round's ratio can be trusted.
        runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
        for round_ in range(args.rounds):
            for variant in variants:
                runs[variant].append(bench(variant, tmp, batch, args.steps))
            print(f"round {round_ + 1}: " + ", ".join(f"{v} {runs[v][-1]['step_s']:.3f} s" for v in variants),
                  flush=True)
        header = f"{'variant':<28}{'step s':>8}{'tokens/s':>11}{'MFU %':>7}{'peak GiB':>10}"
        print(header + f"{'speed vs ' + variants[0] + ' [min-max]':>42}")
        reference = [r["step_s"] for r in runs[variants[0]]]
        for variant in variants:
            steps = [r["step_s"] for r in runs[variant]]
            ratios = sorted(ref / s for ref, s in zip(reference, steps, strict=True))  # per round
            tps = tokens / statistics.median(steps)
            print(f"{variant:<28}{statistics.median(steps):>8.3f}{tps:>11,.0f}"
                  f"{100 * 6 * params * tps / H100_PEAK_FLOPS:>7.1f}{max(r['peak_gib'] for r in runs[variant]):>10.2f}"
                  f"{statistics.median(ratios):>28.2f}x [{ratios[0]:.2f}-{ratios[-1]:.2f}]", flush=True)


if __name__ == "__main__":
    main()
