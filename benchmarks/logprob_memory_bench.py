"""Peak memory and time of the logprob pass: the full ``[N, V]`` logits against
``policy.logprob_chunk_tokens`` (``ops.chunked_completion_logprobs``), side by side.

    python benchmarks/logprob_memory_bench.py [--vocab 32000 151936] [--tokens 1024] [--hidden 896]
        [--chunk 1024] [--device cpu|cuda]

One pass is what a train step does with the output layer: logits of N completion positions from
their ``[N, H]`` hidden states and the ``[V, H]`` output layer, fp32 log-softmax, the sampled
tokens' logprobs and the entropies, then the backward pass of the logprobs' sum into the hidden
states and the layer. ``full`` builds the whole ``[N, V]`` logits (posttrain's path without the
key, ``ops.compute_logprobs_and_entropy``); ``chunked`` holds ``[chunk, V]`` at a time and
recomputes each chunk in the backward pass. Each variant runs in a fresh process. Peak memory is
what the pass adds over its inputs: ``torch.cuda.max_memory_allocated`` on a GPU, the peak RSS
(``ru_maxrss``) less the RSS before the pass on a CPU, where glibc is told to map every
buffer over 64 KiB on its own (``MALLOC_MMAP_THRESHOLD_``), so a freed buffer leaves the RSS
instead of staying in the heap for reuse. Prints MB and seconds for each, and the
full/chunked ratio of the peak at each vocabulary size. Random weights and tokens, fp32.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def one_pass(variant: str, vocab: int, tokens: int, hidden: int, chunk: int, device: str) -> dict[str, float]:
    """Run one pass in this process; returns ``{"peak_mb", "seconds"}``."""
    import torch

    from posttrain.ops import chunked_completion_logprobs, compute_logprobs_and_entropy

    gen = torch.Generator().manual_seed(0)
    h = (torch.randn(1, tokens, hidden, generator=gen) / hidden**0.5).to(device).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=gen) * 0.02).to(device).requires_grad_()
    targets = torch.randint(0, vocab, (1, tokens), generator=gen).to(device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/statm") as f:
            before = int(f.read().split()[1]) * resource.getpagesize()
    start = time.perf_counter()
    if variant == "full":
        # the full path's shapes: [B, S, V] logits with S = N + 1 (position j predicts token j + 1)
        logits = torch.nn.functional.pad(h, (0, 0, 0, 1)) @ w.T
        ids = torch.nn.functional.pad(targets, (1, 0))
        logp, _ = compute_logprobs_and_entropy(logits, ids, torch.ones(1, dtype=torch.long, device=device), tokens)
    else:
        logp, _ = chunked_completion_logprobs(h, w, targets, chunk, with_entropy=True)
    logp.sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    return {"peak_mb": peak / 2**20, "seconds": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[32_000, 151_936])
    parser.add_argument("--tokens", type=int, default=1024, help="completion positions N (8 x 1024 on a GPU)")
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--chunk", type=int, default=1024, help="tokens per chunk (policy.logprob_chunk_tokens)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--one", nargs=2, metavar=("VARIANT", "VOCAB"), help=argparse.SUPPRESS)  # a child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_pass(args.one[0], int(args.one[1]), args.tokens, args.hidden, args.chunk, args.device)))
        return
    print(f"N={args.tokens} positions, H={args.hidden}, chunk={args.chunk}, {args.device}, fp32")
    print(f"{'vocab':>8} {'full MB':>9} {'chunked MB':>11} {'full/chunked':>13} {'full s':>8} {'chunked s':>10}")
    for vocab in args.vocab:
        got = {}
        for variant in ("full", "chunked"):
            cmd = [sys.executable, __file__, "--one", variant, str(vocab), "--tokens", str(args.tokens),
                   "--hidden", str(args.hidden), "--chunk", str(args.chunk), "--device", args.device]
            env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
            got[variant] = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout)
        full, chunked = got["full"], got["chunked"]
        print(f"{vocab:>8} {full['peak_mb']:>9.0f} {chunked['peak_mb']:>11.0f} "
              f"{full['peak_mb'] / chunked['peak_mb']:>12.2f}x {full['seconds']:>8.2f} {chunked['seconds']:>10.2f}")


if __name__ == "__main__":
    main()
