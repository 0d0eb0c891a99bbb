"""The learning-signal procedure: a cached SFT warm start, short GRPO runs from it, and a paired
statistic of the held-out gain. Used by ``test_learning_signal.py`` and by its calibration:

    uv run python tests/integration/learning_signal.py --replicates 0-9 --modes sync,async_k1 \
        --jobs 8 --cpus-per-job 2 [--gpu] [--mutant zero_advantages] --out calibration.json

A replicate ``r`` trains its own warm start (model init and SFT seed ``r``: a different warm
start stands in for a different machine, whose float kernels move the SFT trajectory as much
as a seed does) and runs GRPO with seeds ``SEEDS_PER_MODE * r + k`` from it; ``--jobs`` runs
replicates side by side, each pinned to ``--cpus-per-job`` cores of its own. It prints one row
per (replicate, mode) and, per mode, the mean, spread and worst case of the lower bound.

The statistic (see :func:`reference_answer_probability`): a held-out problem's *sampling
accuracy*, the probability that the policy at temperature 1 samples exactly the reference
answer and EOS, computed exactly by teacher forcing. It is GRPO's own objective (expected
reward under the behaviour policy) on problems it never trained on, with no sampling noise;
greedy accuracy, a step function of the logits, moved the verdict of the earlier test by more
than its margin from one CPU to another (docs/testing.md, "The learning-signal test").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
WARM_START_YAML = str(REPO / "examples" / "configs" / "grpo_arithmetic_warm_start.yaml")
GRPO_YAML = str(REPO / "examples" / "configs" / "grpo_arithmetic.yaml")

GRPO_STEPS = 100
SEEDS_PER_MODE = 2
# Accuracy points of sampling accuracy: the one-sided 99% lower bound of the pooled paired gain
# must exceed it. 0: "GRPO raised held-out accuracy at all", at the 1% level.
MIN_GAIN = 0.0
BOOTSTRAP_SAMPLES = 10_000
NUM_VAL = 500
MAX_NEW_TOKENS = 4

# The synchronous loop, and the asynchronous one with the producer one step ahead (k = 1).
MODES = {"sync": [], "async_k1": ["grpo.async.enabled=true", "grpo.async.max_staleness=1"]}
# The negative side (the calibration's --mutant): catalogue mutants under which nothing is learned.
NO_LEARNING_MUTANTS = ("advantages_zeroed",)


# The calibration's --override key=value (e.g. policy.precision=fp32 with --gpu): SFT and GRPO both get them.
EXTRA_OVERRIDES: list[str] = []


def placement(gpu: bool) -> list[str]:
    """Overrides that place the workers: half a CPU each, or half a GPU each (``gpu``)."""
    return [*(["cluster.gpus_per_worker=0.5"] if gpu else ["cluster.cpus_per_worker=0.5"]), *EXTRA_OVERRIDES]


def warm_start_overrides(seed: int, gpu: bool) -> list[str]:
    """The SFT warm start of replicate ``seed`` (the test's is seed 0): ``grpo_arithmetic_warm_start.yaml``
    (SFT until held-out greedy accuracy 0.35), the one ``tests/functional/grpo.sh`` starts from too."""
    return [f"sft.seed={seed}", f"model.tiny.seed={seed}", *placement(gpu)]


def grpo_overrides(model_path: str, mode: str, seed: int, out_dir: Path, gpu: bool) -> list[str]:
    """One GRPO run of the test: ``grpo_arithmetic.yaml`` (lr 3e-4, 16 prompts x 8 completions,
    clip 0.2, no KL) for ``GRPO_STEPS`` steps from ``model_path``, the final model in ``out_dir/model``."""
    return ["generation.backend=hf", *placement(gpu), *MODES[mode], f"model.path={model_path}",
            f"grpo.seed={seed}", f"grpo.num_steps={GRPO_STEPS}", "grpo.val_period=0", "data.max_val=50",
            "logger.print_period=1000", f"logger.log_dir={out_dir / 'logs'}",
            f"checkpoint.save_path={out_dir / 'model'}"]


@dataclass(frozen=True)
class HeldOutScores:
    """Per held-out problem (``[P]`` float lists, the problems' order): ``sampling`` the probability
    of sampling the reference answer at temperature 1; ``greedy`` 1.0 when the greedy answer is right."""

    sampling: list[float]
    greedy: list[float]


def reference_answer_probability(model, batch) -> torch.Tensor:
    """``[B]`` float32: the probability of each row's completion under ``model`` at temperature 1.

    ``exp(sum_t log p(y_t | x, y_<t))`` over the completion's tokens (the reference answer and
    EOS), i.e. the chance that one sample at temperature 1 is exactly that completion: the
    expected exact-match reward of sampling, without sampling noise.
    """
    from posttrain.ops import compute_logprobs

    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
        logprobs = compute_logprobs(logits, batch.input_ids, batch.prompt_lens, batch.completion_mask.shape[1])
    return torch.exp((logprobs * batch.completion_mask).sum(dim=1))


def score_held_out(model_path: str, problems) -> HeldOutScores:
    """Score ``problems`` under the model at ``model_path``, in this process on its CPU."""
    from transformers import AutoTokenizer

    from posttrain.algorithms.evaluation import greedy_outcomes
    from posttrain.data.batch import make_batch
    from posttrain.data.chat import ChatEncoder
    from posttrain.models.generation.hf_generation_worker import HfGenerationWorkerImpl

    chat = ChatEncoder(AutoTokenizer.from_pretrained(model_path))
    engine = HfGenerationWorkerImpl(model_path)
    pairs = [chat.sft_example(p.question, p.solution) for p in problems]
    batch = make_batch([p for p, _ in pairs], [c for _, c in pairs], chat.tokenizer.pad_token_id)
    sampling = reference_answer_probability(engine.model, batch).tolist()
    return HeldOutScores(sampling, greedy_outcomes(engine, chat, problems, MAX_NEW_TOKENS))


def held_out_problems():
    """The arithmetic task's 500 held-out problems (every machine draws the same split)."""
    from posttrain.algorithms import sft
    from posttrain.config import load_config
    from posttrain.data.datasets import load_problems

    cfg = load_config(WARM_START_YAML, [], sft.SFTMasterConfig)
    _, val = load_problems(cfg.data.model_copy(update={"max_val": None}))
    assert len(val) == NUM_VAL
    return val


def paired_gain_lower_bound(before: torch.Tensor, after: torch.Tensor, quantile: float = 0.01,
                            samples: int = BOOTSTRAP_SAMPLES, seed: int = 0) -> float:
    """Bootstrap lower confidence bound of the mean paired gain, resampling problems.

    Args:
        before: ``[P]`` per-problem score of the warm start.
        after: ``[K, P]`` per-problem scores after GRPO, one row per seed.
        quantile: 0.01 gives the one-sided 99% lower bound.

    Returns:
        The ``quantile`` of the bootstrap distribution of ``mean(after - before)``. A problem's
        seeds are resampled together (their outcomes are correlated: one problem, one warm start),
        so the bound is not overconfident about seeds (Efron & Tibshirani 1993, ch. 6; paired
        design: resample the pairs, not the two samples apart).
    """
    gain_per_problem = (after - before[None, :]).mean(dim=0)  # [P], the seeds of one problem together
    gen = torch.Generator().manual_seed(seed)
    index = torch.randint(0, gain_per_problem.numel(), (samples, gain_per_problem.numel()), generator=gen)
    return torch.quantile(gain_per_problem[index].mean(dim=1), quantile).item()


@dataclass(frozen=True)
class Verdict:
    """What one mode's runs measured (accuracy points; ``seconds``: GRPO and scoring)."""

    mode: str
    seeds: list[int]
    warm_greedy: float
    warm_sampling: float
    after_greedy: list[float]
    after_sampling: list[float]
    gain: float
    bound: float
    greedy_gain: float
    seconds: float

    @property
    def passed(self) -> bool:
        return self.bound > MIN_GAIN

    def report(self) -> str:
        return (f"{self.mode}: warm start sampling accuracy {self.warm_sampling:.3f} (greedy {self.warm_greedy:.3f}); "
                f"after {GRPO_STEPS} GRPO steps, seeds {self.seeds}: "
                f"sampling {[round(a, 3) for a in self.after_sampling]} "
                f"(greedy {[round(a, 3) for a in self.after_greedy]}); pooled gain {self.gain:.3f}, "
                f"99% lower bound {self.bound:.3f} (needs > {MIN_GAIN}); greedy gain {self.greedy_gain:.3f} "
                f"(reported, not judged); {self.seconds:.0f} s")


def run_mode(warm_model: str, before: HeldOutScores, problems, mode: str, seeds: list[int], work: Path,
             gpu: bool = False) -> Verdict:
    """GRPO from ``warm_model`` once per seed in ``mode``, each final model scored; the verdict."""
    from posttrain.algorithms import grpo
    from posttrain.config import load_config

    start = time.perf_counter()
    after = []
    for seed in seeds:
        out = work / f"{mode}_seed{seed}"
        cfg = load_config(GRPO_YAML, grpo_overrides(warm_model, mode, seed, out, gpu), grpo.GRPOMasterConfig)
        metrics = grpo.train(cfg)
        if mode == "async_k1":  # it really ran ahead: most steps trained on the previous weights' samples
            staleness = sum(metrics["async/staleness_mean"].values())
            assert staleness >= GRPO_STEPS / 2, f"async_k1 seed {seed}: staleness {staleness} < {GRPO_STEPS / 2}"
        after.append(score_held_out(str(out / "model"), problems))
    b_s, b_g = torch.tensor(before.sampling), torch.tensor(before.greedy)
    a_s = torch.tensor([a.sampling for a in after])
    a_g = torch.tensor([a.greedy for a in after])
    return Verdict(mode, list(seeds), b_g.mean().item(), b_s.mean().item(), a_g.mean(dim=1).tolist(),
                   a_s.mean(dim=1).tolist(), (a_s - b_s).mean().item(), paired_gain_lower_bound(b_s, a_s),
                   (a_g - b_g).mean().item(), time.perf_counter() - start)


def seeds_for(replicate: int) -> list[int]:
    """GRPO seeds of replicate (or ``--repeat`` index) ``replicate``: disjoint between replicates."""
    return [SEEDS_PER_MODE * replicate + k for k in range(SEEDS_PER_MODE)]


# --- calibration (command line) ---------------------------------------------------------------

def replicate(sft_seed: int, modes: list[str], gpu: bool, mutant: str | None, out: Path) -> None:
    """One replicate in this process: its warm start (cached), every mode, a JSON record at ``out``."""
    from posttrain.algorithms import sft
    from posttrain.algorithms.warm_start import MODEL_DIR, warm_start
    from posttrain.config import load_config

    entry = warm_start(load_config(WARM_START_YAML, warm_start_overrides(sft_seed, gpu), sft.SFTMasterConfig))
    problems = held_out_problems()
    before = score_held_out(str(entry.path / MODEL_DIR), problems)
    record = {"sft_seed": sft_seed, "gpu": gpu, "mutant": mutant, "overrides": EXTRA_OVERRIDES,
              "warm_start": entry.info, "cpu": _cpu_model(), "torch": torch.__version__, "verdicts": []}
    with tempfile.TemporaryDirectory() as work:
        for mode in modes:
            verdict = run_mode(str(entry.path / MODEL_DIR), before, problems, mode, seeds_for(sft_seed), Path(work),
                               gpu)
            record["verdicts"].append(asdict(verdict))
            print(verdict.report(), flush=True)
    out.write_text(json.dumps(record, indent=1))


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _parse_range(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def mutated_package(name: str, dest: Path) -> Path:
    """A copy of the ``posttrain`` package in ``dest`` with catalogue mutant ``name`` applied
    (``tests/mutation/catalogue.py``); put ``dest`` first on ``PYTHONPATH`` (Ray workers inherit it).

    Raises:
        ValueError: ``name`` is not a catalogue mutant, or its anchor is not in the sources once.
    """
    import importlib.util

    spec = importlib.util.spec_from_file_location("catalogue", REPO / "tests" / "mutation" / "catalogue.py")
    assert spec is not None and spec.loader is not None
    catalogue = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("catalogue", catalogue)  # dataclasses look their module up there
    spec.loader.exec_module(catalogue)
    mutant = next((m for m in catalogue.MUTANTS if m.name == name), None)
    if mutant is None:
        raise ValueError(f"--mutant {name!r} is not in tests/mutation/catalogue.py")
    import shutil

    shutil.copytree(REPO / "posttrain", dest / "posttrain", ignore=shutil.ignore_patterns("__pycache__"))
    target = dest / mutant.path
    text = target.read_text()
    for old, new in mutant.replacements:
        if text.count(old) != 1:
            raise ValueError(f"mutant {name}: anchor {old!r} occurs {text.count(old)} times in {mutant.path}")
        text = text.replace(old, new)
    target.write_text(text)
    return dest


def calibrate(args: argparse.Namespace) -> int:
    """Run the replicates in parallel subprocesses (each pinned to cores of its own); print the table."""
    out_dir = Path(tempfile.mkdtemp(prefix="learning_signal_"))
    env = dict(os.environ)
    if args.mutant:
        copy = mutated_package(args.mutant, out_dir / "mutated")
        env["PYTHONPATH"] = os.pathsep.join([str(copy), *filter(None, [env.get("PYTHONPATH")])])
    cores = sorted(os.sched_getaffinity(0))
    slots = [cores[i * args.cpus_per_job:(i + 1) * args.cpus_per_job] for i in range(args.jobs)]
    slots = [s for s in slots if len(s) == args.cpus_per_job]
    if not slots:
        sys.exit(f"--jobs {args.jobs} x --cpus-per-job {args.cpus_per_job}: this machine has {len(cores)} cores")
    pending = [(r, out_dir / f"r{r}.json") for r in _parse_range(args.replicates)]
    running: dict[int, tuple[subprocess.Popen, int, Path, float]] = {}
    results = []
    while pending or running:
        for slot in [i for i in range(len(slots)) if i not in running]:
            if not pending:
                break
            r, path = pending.pop(0)
            cmd = [sys.executable, __file__, "--replicate", str(r), "--modes", args.modes, "--record", str(path)]
            cmd += ["--gpu"] * args.gpu + (["--mutant", args.mutant] if args.mutant else [])
            cmd += [f"--override={o}" for o in args.override]
            log = open(out_dir / f"r{r}.log", "w")
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    preexec_fn=lambda s=slots[slot]: os.sched_setaffinity(0, s))
            running[slot] = (proc, r, path, time.perf_counter())
        time.sleep(1)
        for slot, (proc, r, path, started) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[slot]
            if proc.returncode != 0 or not path.exists():
                print(f"replicate {r}: exit {proc.returncode}, see {out_dir / f'r{r}.log'}", flush=True)
                continue
            record = json.loads(path.read_text())
            record["wall_seconds"] = time.perf_counter() - started
            results.append(record)
            for v in record["verdicts"]:
                print(f"r{r:<3} {v['mode']:9} warm {record['warm_start']['sft_steps']:>5} SFT steps | sampling "
                      f"{v['warm_sampling']:.3f} -> {v['after_sampling']} gain {v['gain']:+.3f} "
                      f"bound {v['bound']:+.3f} | "
                      f"greedy {v['warm_greedy']:.3f} gain {v['greedy_gain']:+.3f} | {v['seconds']:.0f} s", flush=True)
    summarize(results)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


def summarize(results: list[dict]) -> None:
    """Per mode: the bound's mean, spread (sample sd), worst case, and margin / spread."""
    modes = sorted({v["mode"] for r in results for v in r["verdicts"]})
    for mode in modes:
        bounds = torch.tensor([v["bound"] for r in results for v in r["verdicts"] if v["mode"] == mode])
        secs = torch.tensor([v["seconds"] for r in results for v in r["verdicts"] if v["mode"] == mode])
        sd = bounds.std().item() if len(bounds) > 1 else float("nan")
        print(f"{mode}: {len(bounds)} replicates: bound mean {bounds.mean():+.4f}, sd {sd:.4f}, "
              f"min {bounds.min():+.4f}, "
              f"(mean - {MIN_GAIN}) / sd {(bounds.mean().item() - MIN_GAIN) / sd:.1f}, passed "
              f"{int((bounds > MIN_GAIN).sum())}/{len(bounds)}; GRPO + scoring {secs.median():.0f} s (median)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", default="0-9", help="replicate ids: '0-9', '0,3,5'")
    parser.add_argument("--modes", default="sync,async_k1")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--cpus-per-job", type=int, default=2)
    parser.add_argument("--gpu", action="store_true", help="workers on a GPU (cluster.gpus_per_worker=0.5)")
    parser.add_argument("--mutant", default=None,
                        help=f"run under a catalogue mutant, e.g. {NO_LEARNING_MUTANTS[0]} (the test must fail)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for the SFT and GRPO runs, e.g. policy.precision=fp32")
    parser.add_argument("--out", default=None, help="write every replicate's record here (JSON)")
    parser.add_argument("--replicate", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--record", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    EXTRA_OVERRIDES.extend(args.override)
    if args.replicate is not None:
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        replicate(args.replicate, args.modes.split(","), args.gpu, args.mutant, args.record)
        return 0
    return calibrate(args)


if __name__ == "__main__":  # the engines spawn processes: keep the guard
    sys.exit(main())
