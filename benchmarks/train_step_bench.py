"""The policy worker's train step against plain torch on the same model and GPU, side by side.

    python benchmarks/train_step_bench.py [--precision bf16-mixed bf16 fp32] [--steps 10]
        [--rows 8] [--seq-len 1024] [--shape 0.4b|tiny] [--device cuda] [--compile]

For each precision, one GRPO train step (``HfPolicyWorkerImpl.train`` with the clipped
policy-gradient loss: forward, fp32 logprobs, loss, backward, clip, AdamW; plus the
entropy metric the worker reports) is timed against the simplest trainer that does the
same arithmetic in plain transformers + torch: the same model built from the same
directory, the same batch, AdamW, gradient clipping, fp32 logprobs from the logits.
``bf16`` holds the weights in bfloat16 on both sides; ``bf16-mixed`` runs the forward pass
under bf16 autocast over fp32 weights and optimizer state; ``fp32`` holds and computes in
float32 with TF32 matmuls on both sides. The two alternate step by step (after 2 warm-up
steps each), so clock and thermal drift hit both. ``--compile`` compiles both models' forward
(``policy.compile=true`` on the worker, ``nn.Module.compile`` on the plain model); the
compilation happens in the warm-up steps. Both sides use torch's fused AdamW, as the
worker does. The plain side passes the attention mask, as a transformers user does; on a GPU the
worker attends its right-padded rows causally without it (``models.policy.causal_attention``),
which under ``--compile`` is the difference in the attention kernels (transformers builds the
dense mask for every batch of a compiled model).

Prints tokens/s, MFU and the posttrain/plain ratio per precision. MFU counts 6 x parameters
FLOPs per token (forward and backward; attention left out) against 989 TFLOP/s, the H100
SXM's dense bf16 peak, in every precision, so the modes compare on one scale. The model is
a Qwen2 of the 0.39B shape (hidden 896, 24 layers, 14 query / 2 key-value heads, ffn 4864,
vocabulary 32,000) with random weights; ``--shape tiny`` runs the same code on a CPU in
seconds (no meaningful numbers).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.config import PolicyWorkerConfig
from posttrain.data.batch import TokenBatch, make_batch
from posttrain.models.policy.hf_policy_worker import HfPolicyWorkerImpl
from posttrain.ops import compute_logprobs

H100_BF16_PEAK = 989e12
SHAPES = {
    "0.4b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=32_000),
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=704, vocab_size=32_000),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=512),
}


def build_model(shape: str, directory: Path) -> int:
    """Save a randomly initialised Qwen2 of ``shape`` to ``directory``; returns its parameter count."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config.from_dict({**SHAPES[shape], "max_position_embeddings": 4096, "tie_word_embeddings": True,
                                    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def make_inputs(rows: int, seq_len: int, vocab: int) -> tuple[TokenBatch, torch.Tensor]:
    """Half prompt, half completion per row; advantages of mixed sign."""
    g = torch.Generator().manual_seed(0)
    half = seq_len // 2
    prompts = [torch.randint(3, vocab, (half,), generator=g).tolist() for _ in range(rows)]
    completions = [torch.randint(3, vocab, (seq_len - half,), generator=g).tolist() for _ in range(rows)]
    return make_batch(prompts, completions, pad_id=0), torch.linspace(-1.0, 1.0, rows)


class PlainTorchStep:
    """The reference: transformers + torch, no posttrain code on the timed path."""

    def __init__(self, path: Path, precision: str, device: str, lr: float, compile_: bool = False):
        from transformers import AutoModelForCausalLM

        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        # transformers wraps PreTrainedModel.to in a decorator that mypy reads as unbound.
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).train()  # type: ignore[arg-type]
        if compile_:
            self.model.compile()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, fused=True)
        self.autocast = precision == "bf16-mixed"
        self.device = device

    def __call__(self, batch: TokenBatch, advantages: torch.Tensor) -> None:
        batch = batch.to(self.device)
        with torch.autocast(torch.device(self.device).type, dtype=torch.bfloat16, enabled=self.autocast):
            logits = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        width = batch.completion_mask.shape[1]
        logprobs = compute_logprobs(logits, batch.input_ids, batch.prompt_lens, width)  # fp32
        mask = batch.completion_mask
        loss = -(logprobs * advantages.to(self.device)[:, None] * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.device == "cuda":
            torch.cuda.synchronize()


def bench(path: Path, params: int, precision: str, args: argparse.Namespace) -> dict[str, float]:
    """Median seconds per step of each side, alternating; returns tokens/s and MFU."""
    rows, vocab = args.rows, SHAPES[args.shape]["vocab_size"]
    batch, advantages = make_inputs(rows, args.seq_len, vocab)
    cfg = PolicyWorkerConfig.model_validate({"precision": precision, "device": args.device, "lr": 1e-6,
                                             "train_global_batch_size": rows, "train_micro_batch_size": rows,
                                             "logprob_batch_size": rows, "compile": args.compile,
                                             "reference": False})
    worker = HfPolicyWorkerImpl(str(path), cfg)
    plain = PlainTorchStep(path, precision, args.device, lr=1e-6, compile_=args.compile)
    extra = {"advantages": advantages}  # as the GRPO loop sends: one optimizer step scores its own old logprobs
    loss = ClippedPGLoss()
    times: dict[str, list[float]] = {"posttrain": [], "plain": []}
    steps = {"posttrain": lambda: worker.train(batch, extra, loss), "plain": lambda: plain(batch, advantages)}
    for i in range(args.steps + 2):
        for name, step in steps.items():
            start = time.perf_counter()
            step()  # the worker's train returns .item() metrics: the GPU is synchronised
            if i >= 2:
                times[name].append(time.perf_counter() - start)
    tokens = rows * args.seq_len
    out = {}
    for name, seconds in times.items():
        tps = tokens / statistics.median(seconds)
        out[f"{name}_tps"], out[f"{name}_mfu"] = tps, 6 * params * tps / H100_BF16_PEAK
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", nargs="+", default=["bf16-mixed", "bf16", "fp32"],
                        choices=["fp32", "bf16", "bf16-mixed"])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per side (after 2 warm-up steps)")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--shape", default="0.4b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action="store_true", help="compile both models' forward (torch.compile)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        params = build_model(args.shape, Path(tmp))
        name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        compiled = ", compiled forward" if args.compile else ""
        print(f"{params / 1e9:.2f}B parameters, {args.rows} x {args.seq_len} tokens per step, {name}{compiled}")
        print(f"{'precision':<11} {'posttrain tok/s':>16} {'MFU':>6} {'plain torch tok/s':>18} {'MFU':>6} "
              f"{'ratio':>6}")
        ratios = []
        for precision in args.precision:
            r = bench(Path(tmp), params, precision, args)
            if args.device == "cuda":
                torch.cuda.empty_cache()  # the previous precision's models are gone with bench()
            ratios.append(r["posttrain_tps"] / r["plain_tps"])
            print(f"{precision:<11} {r['posttrain_tps']:>16,.0f} {100 * r['posttrain_mfu']:>5.1f}% "
                  f"{r['plain_tps']:>18,.0f} {100 * r['plain_mfu']:>5.1f}% {ratios[-1]:>6.2f}")
    pairs = zip(args.precision, ratios, strict=True)
    print("posttrain/plain torch tokens/s ratio: " + " ".join(f"{p} {x:.2f}" for p, x in pairs))


if __name__ == "__main__":
    main()
