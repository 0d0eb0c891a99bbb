"""Every config key reaches the code it configures: vary it, and the run changes as it should.

A key that is silently dropped on its way from the YAML file to the code (a default used
instead, a field not passed on to a worker) trains the wrong job with every test green. Here
each key of the GRPO and SFT schemas has a proof: a run of the real loop, in this process
(``in_process.py``), with the key set off its default, and an observation of what the key
must change — the update the optimizer made (against an independent replay), the tokens the
engine sampled, the prompts and rows the loop built, the files it wrote. The list of keys
is derived from the pydantic schemas: a new key without a proof fails
:func:`test_every_config_key_has_a_proof`, unless it is in ``NOTHING_TO_OBSERVE`` with the
reason it changes nothing a run can observe.
"""

from __future__ import annotations

import inspect
import json
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import get_args

import pytest
import torch
from in_process import InProcess, Run
from learnable_reward import low_digit_reward
from pydantic import BaseModel
from replay import ReplayTrainer, TrainerSpec, max_weight_gap

from posttrain.algorithms import grpo, grpo_step, sft
from posttrain.config import leaf_fields, load_config
from posttrain.errors import ConfigError, RefitProbeError
from posttrain.models.generation import backends
from posttrain.models.generation.interfaces import GenerationOutput

ROOT = Path(__file__).resolve().parents[2]
GRPO_YAML = str(ROOT / "examples" / "configs" / "grpo_arithmetic.yaml")
SFT_YAML = str(ROOT / "examples" / "configs" / "sft_arithmetic.yaml")


def leaf_keys(schema: type[BaseModel]) -> set[str]:
    """Dotted names of every leaf field of a pydantic schema (sections are walked into)."""
    return {key for key, _ in leaf_fields(schema)}



class Runner:
    """Short in-process GRPO / SFT runs from the example configs, with overrides."""

    def __init__(self, ip: InProcess, model_path: str, tmp: Path, tokenizer):
        self.ip, self.model_path, self.tmp, self.tok = ip, model_path, tmp, tokenizer
        self.runs = 0

    def _log_dir(self) -> str:
        self.runs += 1
        return f"logger.log_dir={self.tmp / f'run{self.runs}'}"

    def grpo(self, *overrides: str, transforms=None) -> Run:
        base = [f"model.path={self.model_path}", self._log_dir(), "grpo.num_steps=2", "grpo.num_prompts_per_step=4",
                "grpo.completions_per_prompt=4", "generation.max_new_tokens=3", "data.arithmetic.num_val=6",
                "grpo.val_period=0", "policy.train_global_batch_size=16", "policy.train_micro_batch_size=16"]
        return self.ip.run(grpo, GRPO_YAML, [*base, *overrides], transforms)

    def sft(self, *overrides: str, transforms=None) -> Run:
        base = [f"model.path={self.model_path}", self._log_dir(), "sft.num_steps=2", "sft.batch_size=8",
                "sft.val_period=0", "sft.val_loss_size=6", "data.arithmetic.num_val=6", "generation.max_new_tokens=3",
                "policy.train_global_batch_size=8", "policy.train_micro_batch_size=8"]
        return self.ip.run(sft, SFT_YAML, [*base, *overrides], transforms)

    def sampled(self, run: Run) -> list[tuple[list[str], GenerationOutput]]:
        """Per step, the questions of the sampling call and the engine's output."""
        return [([self.tok.decode(p) for p in c.args[0]], c.result) for c in run.calls("generation", "generate")
                if not c.kwargs["params"].greedy]

    def validated(self, run: Run) -> list[list[str]]:
        """The questions of each greedy (validation) call."""
        return [[self.tok.decode(p) for p in c.args[0]] for c in run.calls("generation", "generate")
                if c.kwargs["params"].greedy]


@pytest.fixture(scope="module")
def runner(tiny_model_path, tmp_path_factory):
    from transformers import AutoTokenizer

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grpo_step, "math_reward", low_digit_reward)
        yield Runner(InProcess(), tiny_model_path, tmp_path_factory.mktemp("plumbing"),
                     AutoTokenizer.from_pretrained(tiny_model_path))


def steps_logged(run: Run, metric: str) -> list[int]:
    return sorted(int(s) for s in run.metrics[metric])


def groups(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


# --- the trainer: replayed independently, once with the run's values and once with the key at its default --

TRAINER_KEYS: dict[str, object] = {
    "policy.lr": 5e-3,
    "policy.weight_decay": 0.5,
    "policy.betas": [0.5, 0.9],
    "policy.warmup_steps": 3,
    "policy.max_grad_norm": 0.3,
    "policy.train_global_batch_size": 4,
    "grpo.clip_eps": 0.05,
    "grpo.kl_coef": 2.5,
    "generation.temperature": 0.6,
    "generation.top_k": 5,
    "generation.top_p": 0.9,
}


@pytest.fixture(scope="module")
def trainer_run(runner):
    """One GRPO run with every trainer key off its default (3 steps, several optimizer steps each)."""
    overrides = [f"{k}={json.dumps(v)}" for k, v in TRAINER_KEYS.items()]
    run = runner.grpo(*overrides, "policy.train_micro_batch_size=2", "grpo.num_steps=3")
    return run, TrainerSpec.of(run.cfg, "grpo")


def replay_agrees(run: Run, model_path: str, spec: TrainerSpec) -> bool:
    """Does an independent replay with ``spec`` reproduce the run's weights and metrics?"""
    from transformers import AutoModelForCausalLM

    replay = ReplayTrainer(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32), spec)
    for step, call in enumerate(run.calls("policy", "train"), start=1):
        if max_weight_gap(call.weights_before, replay.weights()) > 1e-4:
            return False
        batch, extra, _ = call.args
        metrics = replay.train(batch, extra)
        for key in ("loss", "kl", "clip_fraction", "grad_norm", "lr", "entropy", "num_optimizer_steps"):
            logged = run.metrics[f"train/{key}"][str(step)]
            if abs(logged - metrics[key]) > 1e-4 * max(1.0, abs(metrics[key])):
                return False
    return True


def trainer_key(key: str) -> Callable[[Runner, object], None]:
    def proof(runner: Runner, trainer_run) -> None:
        run, spec = trainer_run
        assert replay_agrees(run, runner.model_path, spec), "the run does not match a replay with its own config"
        default = load_config(GRPO_YAML, [], grpo.GRPOMasterConfig)  # the value the key would fall back to
        fallback = replace(spec, **{SPEC_FIELD[key]: SPEC_OF[key](default)})
        assert fallback != spec
        assert not replay_agrees(run, runner.model_path, fallback), f"{key} at its default trains the same"
    proof.__doc__ = f"{key}: the run trains as a replay with its value does, and not as one with the default."
    return proof


SPEC_FIELD = {"policy.lr": "lr", "policy.weight_decay": "weight_decay", "policy.betas": "betas",
              "policy.warmup_steps": "warmup_steps", "policy.max_grad_norm": "max_grad_norm",
              "policy.train_global_batch_size": "global_batch_size", "grpo.clip_eps": "clip_eps",
              "grpo.kl_coef": "kl_coef", "generation.temperature": "temperature", "generation.top_k": "top_k",
              "generation.top_p": "top_p"}
SPEC_OF = {key: (lambda cfg, f=field: getattr(TrainerSpec.of(cfg, "grpo"), f)) for key, field in SPEC_FIELD.items()}


# --- the engine ------------------------------------------------------------------------------


def top_k(runner: Runner, _) -> None:
    """top_k=1 samples the argmax: a group's completions are identical; top_k=0 they differ.
    SFT, which never samples, refuses the key in one line."""
    for value, identical in ((1, True), (0, False)):
        outs = runner.sampled(runner.grpo(f"generation.top_k={value}"))
        same = all(all(c == g[0] for c in g) for _, out in outs for g in groups(out.completion_ids, 4))
        assert same == identical, value
    with pytest.raises(ConfigError, match="SFT never samples"):
        runner.sft("generation.top_k=5")


def top_p(runner: Runner, _) -> None:
    """top_p=0.01 keeps only the most likely token: a group's completions are identical. SFT
    refuses the key."""
    for value, identical in ((0.01, True), (1.0, False)):
        outs = runner.sampled(runner.grpo(f"generation.top_p={value}"))
        same = all(all(c == g[0] for c in g) for _, out in outs for g in groups(out.completion_ids, 4))
        assert same == identical, value
    with pytest.raises(ConfigError, match="SFT never samples"):
        runner.sft("generation.top_p=0.5")


def truncated_agreement(runner: Runner, trainer_run) -> None:
    """Under top-k and top-p (the trainer run's 5 and 0.9, at T 0.6) the engine's logprobs of the
    sampled tokens and the trainer's agree on every step: both are of the truncated distribution."""
    run, _ = trainer_run
    assert max(run.metrics["train/token_mult_prob_error"].values()) == pytest.approx(1.0, abs=1e-4)


def max_new_tokens(runner: Runner, _) -> None:
    """Completions stop at max_new_tokens (the untrained model often runs to the cap)."""
    for value in (2, 5):
        lengths = [len(c) for _, out in runner.sampled(runner.grpo(f"generation.max_new_tokens={value}"))
                   for c in out.completion_ids]
        assert max(lengths) == value, (value, lengths)


def temperature_sampling(runner: Runner, _) -> None:
    """The engine samples at the temperature (colder: likelier tokens), and the trainer scores
    at the same one (the engine/trainer disagreement stays exp(0) = 1)."""
    mean_logprob = {}
    for value in (0.3, 3.0):
        run = runner.grpo(f"generation.temperature={value}")
        mean_logprob[value] = statistics.fmean(lp for _, out in runner.sampled(run) for row in out.logprobs
                                               for lp in row)
        assert max(run.metrics["train/token_mult_prob_error"].values()) == pytest.approx(1.0, abs=1e-4)
    assert mean_logprob[0.3] > mean_logprob[3.0] + 0.5, mean_logprob


def num_workers(runner: Runner, _) -> None:
    """Two generation workers, each sampling its contiguous half of the rollouts."""
    run = runner.grpo("generation.num_workers=2")
    assert [w.rank for w in run.workers("generation")] == [0, 1]
    first_step = [c for c in run.calls("generation", "generate") if not c.kwargs["params"].greedy][:2]
    assert [c.rank for c in first_step] == [0, 1] and [len(c.args[0]) for c in first_step] == [8, 8]


def precision(runner: Runner, _) -> None:
    """policy.precision sets the dtype the policy holds and computes in, and the engine's; on a
    CPU ``auto`` is fp32 (bf16-mixed on CUDA: tests/unit/models/policy/test_precision.py)."""
    run = runner.grpo("policy.precision=bf16")
    dtypes = {role: {p.dtype for w in run.workers(role) for p in w.impl.model.parameters()}
              for role in ("policy", "generation")}
    assert dtypes == {"policy": {torch.bfloat16}, "generation": {torch.bfloat16}}
    run = runner.grpo("policy.precision=auto")
    assert {p.dtype for w in run.workers("generation") for p in w.impl.model.parameters()} == {torch.float32}


def tf32(runner: Runner, _) -> None:
    """policy.tf32 reaches the TF32 switch of the policy worker and of the engine alike (on a CPU
    the switch changes nothing: CUDA only; what it asks for is recorded here)."""
    from posttrain.models.generation import hf_generation_worker
    from posttrain.models.policy import hf_policy_worker

    for value in (True, False):
        asked: list[bool] = []
        with pytest.MonkeyPatch.context() as mp:
            for module in (hf_policy_worker, hf_generation_worker):
                mp.setattr(module, "use_tf32_for_fp32", lambda device, enabled, asked=asked: asked.append(enabled))
            runner.grpo(f"policy.tf32={str(value).lower()}", "policy.precision=fp32")
        assert asked == [value, value], (value, asked)


def generation_threads(runner: Runner, _) -> None:
    run = runner.grpo("generation.num_threads=2")
    assert [w.num_threads for w in run.workers("generation")] == [2]


def backend(runner: Runner, _) -> None:
    """backend=hf gives Hugging Face workers; backend=vllm reaches the backend check (here told
    vLLM is missing: the run stops before Ray with the line naming the extra to install)."""
    from posttrain.models.generation.hf_generation_worker import HfGenerationWorkerImpl

    run = runner.grpo("generation.backend=hf")
    assert all(isinstance(w.impl, HfGenerationWorkerImpl) for w in run.workers("generation"))
    runner.ip.recorder.ray_init.clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backends, "module_importable", lambda module: module != "vllm")
        with pytest.raises(ConfigError, match="generation.backend=vllm but vllm is not installed"):
            runner.ip.run(grpo, GRPO_YAML, [f"model.path={runner.model_path}", "generation.backend=vllm"])
    assert runner.ip.recorder.ray_init == []  # refused before Ray starts


def policy_backend(runner: Runner, _) -> None:
    """backend=hf gives a Hugging Face policy worker; backend=megatron reaches the Megatron
    checks (here, without a GPU or megatron-core, the run stops before Ray with their line)."""
    from posttrain.models.policy.hf_policy_worker import HfPolicyWorkerImpl

    run = runner.sft("policy.backend=hf")
    assert all(isinstance(w.impl, HfPolicyWorkerImpl) for w in run.workers("policy"))
    runner.ip.recorder.ray_init.clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "device_count", lambda: 0)
        refused = "policy.backend=megatron (but megatron-core is not installed|needs 1 GPU)"
        with pytest.raises(ConfigError, match=refused):
            runner.sft("policy.backend=megatron")
    assert runner.ip.recorder.ray_init == []


def lora(runner: Runner, _) -> None:
    """policy.lora.* reach peft through a loaded config: adapters of that rank, scaling and
    dropout on exactly the named layers, and only they train; the weights the engine gets
    differ from the base model's after training (rank 0: no adapters). Alpha 1.5 over rank 2
    scales by 0.75: an alpha cast to int on its way would scale by 0.5."""
    run = runner.sft("policy.lora.rank=2", "policy.lora.alpha=1.5", "policy.lora.dropout=0.25",
                     "policy.lora.target_modules=[q_proj,v_proj]")
    impl = run.workers("policy")[0].impl
    layers = {n: m for n, m in impl.model.named_modules() if hasattr(m, "lora_A")}
    assert {n.rsplit(".", 1)[-1] for n in layers} == {"q_proj", "v_proj"}
    for layer in layers.values():
        assert layer.lora_A["default"].weight.shape[0] == 2
        assert layer.scaling["default"] == pytest.approx(0.75) and layer.lora_dropout["default"].p == 0.25
    assert impl.parameter_counts()[0] == sum(p.numel() for m in layers.values()
                                             for p in (*m.lora_A.parameters(), *m.lora_B.parameters()))
    assert max_weight_gap(impl.get_weights(), run.calls("policy", "train")[0].weights_before) > 0
    plain = runner.sft("policy.lora.rank=0").workers("policy")[0].impl
    assert not any(hasattr(m, "lora_A") for m in plain.model.modules())


# --- the weight-sync probe -------------------------------------------------------------------


def probe_shape(runner: Runner, _) -> None:
    """The probe scores num_sequences sequences of prompt_tokens + completion_tokens; 0 turns it off."""
    run = runner.grpo("generation.refit_probe.num_sequences=3", "generation.refit_probe.prompt_tokens=5",
                      "generation.refit_probe.completion_tokens=2")
    scores = run.calls("generation", "score")
    assert len(scores) == 2  # one per refit
    prompts, completions = scores[0].args
    assert [len(p) for p in prompts] == [5, 5, 5] and [len(c) for c in completions] == [2, 2, 2]
    off = runner.grpo("generation.refit_probe.num_sequences=0")
    assert not off.calls("generation", "score") and "train/refit_logprob_error" not in off.metrics


def probe_seed(runner: Runner, _) -> None:
    tokens = [runner.grpo(f"generation.refit_probe.seed={s}").calls("generation", "score")[0].args for s in (0, 1)]
    assert tokens[0] != tokens[1]


def probe_bound(runner: Runner, _) -> None:
    """An engine 0.02 nats off on every probe token: a bound of 0.01 stops the run, 0.05 does
    not; ``auto`` is 1e-3 in fp32 (stops it), ``null`` only logs (an engine 0.5 off runs on)."""
    shifted = {("generation", "score"): lambda call, rows: [[lp + 0.02 for lp in row] for row in rows]}
    with pytest.raises(RefitProbeError, match="0.02 > generation.refit_probe.max_logprob_error = 0.01"):
        runner.grpo("generation.refit_probe.max_logprob_error=0.01", transforms=shifted)
    run = runner.grpo("generation.refit_probe.max_logprob_error=0.05", transforms=shifted)
    assert max(run.metrics["train/refit_logprob_error"].values()) == pytest.approx(0.02, rel=1e-3)
    with pytest.raises(RefitProbeError, match="0.02 > generation.refit_probe.max_logprob_error = 0.001"):
        runner.grpo("generation.refit_probe.max_logprob_error=auto", "policy.precision=fp32", transforms=shifted)
    far = {("generation", "score"): lambda call, rows: [[lp + 0.5 for lp in row] for row in rows]}
    run = runner.grpo("generation.refit_probe.max_logprob_error=null", transforms=far)
    assert max(run.metrics["train/refit_logprob_error"].values()) == pytest.approx(0.5, rel=1e-3)


# --- the GRPO loop ------------------------------------------------------------------------------


def grpo_num_steps(runner: Runner, _) -> None:
    assert steps_logged(runner.grpo("grpo.num_steps=3"), "train/loss") == [1, 2, 3]


def num_prompts_per_step(runner: Runner, _) -> None:
    questions, _ = runner.sampled(runner.grpo("grpo.num_prompts_per_step=3"))[0]
    assert len(questions) == 3 * 4 and len(set(questions)) == 3


def completions_per_prompt(runner: Runner, _) -> None:
    """G copies of each prompt, contiguous."""
    questions, _ = runner.sampled(runner.grpo("grpo.completions_per_prompt=3"))[0]
    assert len(questions) == 4 * 3 and all(len(set(g)) == 1 for g in groups(questions, 3))


def step_rewards(runner: Runner, out: GenerationOutput) -> list[float]:
    """The rewards of a sampling call's rollouts, recomputed from their text."""
    texts = runner.tok.batch_decode(out.completion_ids, skip_special_tokens=True)
    return [low_digit_reward(t, "") for t in texts]


def advantage_estimator(runner: Runner, _) -> None:
    """grpo: (r - mean) / (std + eps) per group; dr_grpo: r - mean, no std division."""
    for estimator in ("grpo", "dr_grpo"):
        run = runner.grpo(f"grpo.advantage_estimator={estimator}", "grpo.drop_zero_variance_groups=false")
        (_, out), train = runner.sampled(run)[0], run.calls("policy", "train")[0]
        expected = []
        for g in groups(step_rewards(runner, out), 4):
            mean, std = statistics.fmean(g), statistics.stdev(g)
            expected += [(r - mean) / (std + 1e-6) if estimator == "grpo" else r - mean for r in g]
        assert train.args[1]["advantages"].tolist() == pytest.approx(expected, abs=1e-4), estimator


def drop_zero_variance_groups(runner: Runner, _) -> None:
    """True: only groups whose rewards differ are trained on; False: every rollout."""
    for drop in (True, False):
        run = runner.grpo(f"grpo.drop_zero_variance_groups={str(drop).lower()}", "grpo.completions_per_prompt=2",
                          "grpo.num_prompts_per_step=8")
        (_, out), train = runner.sampled(run)[0], run.calls("policy", "train")[0]
        varied = [len(set(g)) > 1 for g in groups(step_rewards(runner, out), 2)]
        assert 0 < sum(varied) < len(varied), "needs both kinds of group to tell"
        assert len(train.args[0]) == (2 * sum(varied) if drop else 16), drop


def grpo_val_period(runner: Runner, _) -> None:
    assert steps_logged(runner.grpo("grpo.num_steps=3", "grpo.val_period=2"), "val/accuracy") == [0, 2, 3]
    assert steps_logged(runner.grpo("grpo.num_steps=3", "grpo.val_period=0"), "val/accuracy") == [0, 3]


def grpo_seed(runner: Runner, _) -> None:
    first = [runner.sampled(runner.grpo(f"grpo.seed={s}"))[0][0] for s in (0, 0, 1)]
    assert first[0] == first[1] != first[2]


# --- the SFT loop ----------------------------------------------------------------------------------


def sft_num_steps(runner: Runner, _) -> None:
    assert steps_logged(runner.sft("sft.num_steps=3"), "train/loss") == [1, 2, 3]


def sft_batch_size(runner: Runner, _) -> None:
    run = runner.sft("sft.batch_size=5", "policy.train_global_batch_size=5", "policy.train_micro_batch_size=5")
    assert [len(c.args[0]) for c in run.calls("policy", "train")] == [5, 5]


def sft_val_period(runner: Runner, _) -> None:
    assert steps_logged(runner.sft("sft.num_steps=3", "sft.val_period=2"), "val/loss") == [0, 2, 3]


def val_loss_size(runner: Runner, _) -> None:
    run = runner.sft("sft.val_loss_size=4")
    assert sorted({len(c.args[0]) for c in run.calls("policy", "get_logprobs")}) == [4, 8]  # val batch, probe


def val_accuracy(runner: Runner, _) -> None:
    """Off, SFT never generates: no engine starts and none is reserved; on, it validates twice."""
    off = runner.sft("sft.val_accuracy=false")
    assert not runner.validated(off) and "val/accuracy" not in off.metrics
    assert off.workers("generation") == [] and [c.num_bundles for c in off.recorder.clusters] == [1]
    on = runner.sft("sft.val_accuracy=true")
    assert len(runner.validated(on)) == 2
    assert len(on.workers("generation")) == 1 and [c.num_bundles for c in on.recorder.clusters] == [2]


def stop_at_val_accuracy(runner: Runner, _) -> None:
    """From the second validation on, 4 of the 6 held-out answers are right (accuracy 2/3): a
    target of 0.65 stops the run after step 1, one of 0.7 never does (a target cast, rounded or
    clamped on its way would land on the other side)."""
    for override, trained in (("sft.stop_at_val_accuracy=0.65", [1]), ("sft.stop_at_val_accuracy=0.7", [1, 2, 3, 4])):
        seen = []

        def four_of_six_after_first(call, out, seen=seen):
            seen.append(1)
            if len(seen) == 1:
                return out
            sums = [sum(int(x) for x in runner.tok.decode(p).rstrip("=").split("+")) for p in call.args[0]]
            ids = [runner.tok.encode(str(s if i < 4 else s + 1)) + [runner.tok.eos_token_id]
                   for i, s in enumerate(sums)]
            return GenerationOutput(ids, [[-1.0] * len(i) for i in ids], out.weight_version)

        run = runner.sft("sft.num_steps=4", "sft.val_period=1", override,
                         transforms={("generation", "generate"): four_of_six_after_first})
        assert steps_logged(run, "train/loss") == trained, override
        assert run.metrics["val/accuracy"]["0"] == 0.0 and run.metrics["val/accuracy"]["1"] == pytest.approx(4 / 6)


def sft_seed(runner: Runner, _) -> None:
    rows = []
    for seed in (0, 0, 1):
        batch = runner.sft(f"sft.seed={seed}").calls("policy", "train")[0].args[0]
        rows.append(batch.input_ids.tolist())
    assert rows[0] == rows[1] != rows[2]


# --- data ------------------------------------------------------------------------------------


def operand_digits(runner: Runner, _) -> None:
    questions = [q for qs, _ in runner.sampled(runner.grpo("data.arithmetic.operand_digits=1")) for q in qs]
    assert all(len(q) == 4 for q in questions)  # "a+b=" with one-digit operands
    questions = [q for qs, _ in runner.sampled(runner.grpo("data.arithmetic.operand_digits=2")) for q in qs]
    assert max(len(q) for q in questions) == 6


def operators(runner: Runner, _) -> None:
    questions = [q for qs, _ in runner.sampled(runner.grpo("data.arithmetic.operators=[-]")) for q in qs]
    assert all("-" in q and "+" not in q for q in questions)


def num_val(runner: Runner, _) -> None:
    assert [len(v) for v in runner.validated(runner.grpo("data.arithmetic.num_val=5"))] == [5, 5]


def arithmetic_seed(runner: Runner, _) -> None:
    held_out = [set(runner.validated(runner.grpo(f"data.arithmetic.seed={s}"))[0]) for s in (0, 1)]
    assert held_out[0] != held_out[1]


def max_val(runner: Runner, _) -> None:
    assert [len(v) for v in runner.validated(runner.grpo("data.max_val=3"))] == [3, 3]


def gsm8k_paths(runner: Runner, _) -> None:
    """Problems come from the files named (small GSM8K-format files written here)."""
    lines = {"train": [("How many is 2 and 3?", "2 + 3 = 5\n#### 5"), ("What is 4 and 4?", "#### 8")],
             "val": [("Half of 10?", "10 / 2 = 5\n#### 5")]}
    paths = {}
    for split, records in lines.items():
        paths[split] = runner.tmp / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in records))
    run = runner.ip.run(sft, SFT_YAML, [
        "model.path=null", "model.tiny.charset=ascii", f"logger.log_dir={runner.tmp / 'gsm8k'}", "sft.num_steps=1",
        "sft.batch_size=2", "policy.train_global_batch_size=2", "policy.train_micro_batch_size=2",
        "sft.val_loss_size=1", "data.dataset=gsm8k", f"data.gsm8k_train_path={paths['train']}",
        f"data.gsm8k_val_path={paths['val']}", "generation.max_new_tokens=2"])
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(run.workers("policy")[0].impl.model.name_or_path)
    batch = run.calls("policy", "train")[0].args[0]
    trained = {tok.decode(batch.input_ids[b, : int(batch.prompt_lens[b])].tolist()) for b in range(2)}
    validated = {tok.decode(p) for c in run.calls("generation", "generate") for p in c.args[0]}
    assert trained == {q for q, _ in lines["train"]} and validated == {"Half of 10?"}


# --- the model ---------------------------------------------------------------------------


def model_path(runner: Runner, _) -> None:
    """The policy starts from the weights in model.path."""
    from transformers import AutoModelForCausalLM

    from posttrain.models.tiny import TinyModelConfig, build_tiny_model

    other = build_tiny_model(TinyModelConfig(seed=7))
    for path in (runner.model_path, str(other)):
        run = runner.sft(f"model.path={path}", "sft.num_steps=1")
        expected = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
        assert max_weight_gap(run.calls("policy", "train")[0].weights_before, expected) == 0.0, path


TINY = {"model.tiny.charset": "ascii", "model.tiny.hidden_size": 64, "model.tiny.intermediate_size": 96,
        "model.tiny.num_hidden_layers": 2, "model.tiny.num_attention_heads": 2, "model.tiny.num_key_value_heads": 1,
        "model.tiny.max_position_embeddings": 128, "model.tiny.seed": 3}


def tiny_model(runner: Runner, _) -> None:
    """With no model.path the run trains a tiny model of exactly the shape configured."""
    run = runner.sft("model.path=null", *(f"{k}={v}" for k, v in TINY.items()), "sft.num_steps=1")
    config = run.workers("policy")[0].impl.model.config
    for key, value in TINY.items():
        field = key.rsplit(".", 1)[1]
        if field in ("charset", "seed"):
            continue
        assert getattr(config, field) == value, key
    assert config.vocab_size > 200  # the ascii charset (the arithmetic one has 17 symbols)
    from posttrain.models.tiny import TinyModelConfig, build_tiny_model

    same_but_seed = TinyModelConfig(**{k.rsplit(".", 1)[1]: v for k, v in TINY.items()} | {"seed": 0})
    from transformers import AutoModelForCausalLM

    seed0 = AutoModelForCausalLM.from_pretrained(build_tiny_model(same_but_seed)).state_dict()
    assert max_weight_gap(run.calls("policy", "train")[0].weights_before, seed0) > 0.01  # seed 3, not 0


# --- the policy worker's batching and threads --------------------------------------------------


def micro_batch(runner: Runner, _) -> None:
    """Each forward pass of a train call holds train_micro_batch_size rows."""
    run = runner.sft("policy.train_micro_batch_size=2")
    assert run.calls("policy", "train")[0].forward_rows == [2, 2, 2, 2]


def logprob_batch(runner: Runner, _) -> None:
    run = runner.sft("policy.logprob_batch_size=4", "sft.val_loss_size=6")
    val = [c for c in run.calls("policy", "get_logprobs") if len(c.args[0]) == 6]
    assert val[0].forward_rows == [4, 2]


def policy_threads(runner: Runner, _) -> None:
    assert [w.num_threads for w in runner.sft("policy.num_threads=2").workers("policy")] == [2]


# --- cluster, logger, checkpoint -----------------------------------------------------------------


def ray_start(runner: Runner, _) -> None:
    """address, num_cpus and num_gpus are what Ray is started (or joined) with."""
    run = runner.sft("cluster.address=10.0.0.1:6379", "cluster.num_cpus=3", "cluster.num_gpus=0")
    assert run.recorder.ray_init == [{"address": "10.0.0.1:6379", "num_cpus": 3, "num_gpus": 0}]


def cpus_per_worker(runner: Runner, _) -> None:
    run = runner.sft("cluster.cpus_per_worker=0.25")
    assert [c.bundle for c in run.recorder.clusters] == [{"CPU": 0.25}]


def placement_strategy(runner: Runner, _) -> None:
    """The placement group strategy reaches the reservation (tests/unit/distributed/test_node_placement.py
    follows it into Ray's placement group, tests/integration/test_multinode.py across real nodes)."""
    run = runner.sft("cluster.placement_strategy=SPREAD")
    assert [c.strategy for c in run.recorder.clusters] == ["SPREAD"]


def gpus_per_worker(runner: Runner, _) -> None:
    """GPUs reserved per worker, and both workers (policy and generation) put their models on
    CUDA. Moves of a model are recorded instead of done, so the workers start on a machine
    without a GPU; the run then stops at the first batch it sends to CUDA."""
    if torch.cuda.is_available():
        pytest.skip("checked on a machine without CUDA: there a tensor's move to CUDA must fail")
    moved_to: list[str] = []

    def record_move(module, *args, **kwargs):
        moved_to.append(str(args[0] if args else kwargs.get("device")))
        return module

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.Module, "to", record_move)
        with pytest.raises((RuntimeError, AssertionError), match="(?i)cuda|nvidia"):
            runner.sft("cluster.gpus_per_worker=0.5")
    assert [c.bundle for c in runner.ip.recorder.clusters] == [{"CPU": 1.0, "GPU": 0.5}]
    assert [w.role for w in runner.ip.recorder.workers] == ["policy", "generation"]
    assert moved_to == ["cuda", "cuda"], moved_to  # the policy's model, then the engine's


def reference_timing_period(runner: Runner, _) -> None:
    """Every period-th train call is timed against plain torch's step and its ratio logged, the
    others not (tests/unit/models/policy/test_reference_timing.py: the gate and its exactness)."""
    run = runner.sft("policy.reference_timing_period=2", "sft.num_steps=4")
    ratio = run.metrics["timing/train_over_reference"]
    assert sorted(ratio, key=int) == ["2", "4"] and all(value > 0 for value in ratio.values())
    assert sorted(run.metrics["timing/step_over_reference"], key=int) == ["2", "4"]
    assert "timing/train_over_reference" not in runner.sft("sft.num_steps=2").metrics


def log_dir(runner: Runner, _) -> None:
    where = runner.tmp / "chosen_log_dir"
    run = runner.sft(f"logger.log_dir={where}")
    assert json.loads((where / "metrics.json").read_text()) == run.metrics
    assert list((where / "tensorboard").glob("events.out.tfevents.*"))


def print_period(runner: Runner, capsys) -> None:
    """Every period-th step and the last one, each with its place in the run (step N/T)."""
    for period, printed in ((1, ["0/3", "1/3", "2/3", "3/3"]), (2, ["0/3", "2/3", "3/3"])):
        runner.sft(f"logger.print_period={period}", "sft.num_steps=3")
        lines = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
        assert lines == printed, period


def save_path(runner: Runner, _) -> None:
    """The final policy is written to save_path, loadable as a Hugging Face model."""
    from transformers import AutoModelForCausalLM

    where = runner.tmp / "final_model"
    run = runner.sft(f"checkpoint.save_path={where}")
    saved = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32).state_dict()
    assert max_weight_gap(saved, run.workers("policy")[0].impl.get_weights()) == 0.0


# --- the registry ------------------------------------------------------------------------------

def both(*proofs: Callable) -> Callable:
    """A key with more than one effect to prove (the temperature: training and sampling)."""
    def proof(runner: Runner, context) -> None:
        for p in proofs:
            p(runner, context)
    return proof


PROOFS: dict[str, Callable] = {
    **{key: trainer_key(key) for key in TRAINER_KEYS},
    "generation.temperature": both(trainer_key("generation.temperature"), temperature_sampling),
    "generation.top_k": both(trainer_key("generation.top_k"), truncated_agreement, top_k),
    "generation.top_p": both(trainer_key("generation.top_p"), truncated_agreement, top_p),
    "generation.max_new_tokens": max_new_tokens,
    "generation.num_workers": num_workers, "generation.num_threads": generation_threads, "generation.backend": backend,
    "generation.refit_probe.num_sequences": probe_shape, "generation.refit_probe.prompt_tokens": probe_shape,
    "generation.refit_probe.completion_tokens": probe_shape, "generation.refit_probe.seed": probe_seed,
    "generation.refit_probe.max_logprob_error": probe_bound,
    "grpo.num_steps": grpo_num_steps, "grpo.num_prompts_per_step": num_prompts_per_step,
    "grpo.completions_per_prompt": completions_per_prompt, "grpo.advantage_estimator": advantage_estimator,
    "grpo.drop_zero_variance_groups": drop_zero_variance_groups, "grpo.val_period": grpo_val_period,
    "grpo.seed": grpo_seed,
    "sft.num_steps": sft_num_steps, "sft.batch_size": sft_batch_size, "sft.val_period": sft_val_period,
    "sft.val_loss_size": val_loss_size, "sft.val_accuracy": val_accuracy,
    "sft.stop_at_val_accuracy": stop_at_val_accuracy, "sft.seed": sft_seed,
    "data.arithmetic.operand_digits": operand_digits, "data.arithmetic.operators": operators,
    "data.arithmetic.num_val": num_val, "data.arithmetic.seed": arithmetic_seed, "data.max_val": max_val,
    "data.gsm8k_train_path": gsm8k_paths, "data.gsm8k_val_path": gsm8k_paths,
    "model.path": model_path, **{key: tiny_model for key in TINY},
    "policy.train_micro_batch_size": micro_batch, "policy.logprob_batch_size": logprob_batch,
    "policy.num_threads": policy_threads, "policy.reference_timing_period": reference_timing_period,
    "policy.backend": policy_backend, "policy.precision": precision, "policy.tf32": tf32,
    **{f"policy.lora.{key}": lora for key in ("rank", "alpha", "dropout", "target_modules")},
    "cluster.address": ray_start, "cluster.num_cpus": ray_start, "cluster.num_gpus": ray_start,
    "cluster.cpus_per_worker": cpus_per_worker, "cluster.gpus_per_worker": gpus_per_worker,
    "cluster.placement_strategy": placement_strategy,
    "logger.log_dir": log_dir, "logger.print_period": print_period, "checkpoint.save_path": save_path,
}

# Proven by a test elsewhere: key -> its node id (it sets the key and observes the effect).
MCORE = "tests/unit/models/megatron/test_megatron_policy.py::"
RESUME = "tests/integration/test_checkpoint_resume.py::"
ASYNC = "tests/integration/test_async_grpo.py::"
ASYNC_KEYS = "tests/integration/test_async_grpo_keys_and_errors.py::"
RECORDING = "tests/integration/test_rollout_recording.py::"
BROADCAST = "tests/unit/models/generation/test_refit_broadcast.py::"
PROVEN_ELSEWHERE: dict[str, str] = {
    "checkpoint.dir": RESUME + "test_a_resumed_run_logs_what_the_uninterrupted_run_logged",
    "checkpoint.save_period": RESUME + "test_resume_auto_takes_the_newest_complete_checkpoint_and_never_starts_over",
    "checkpoint.keep_last": RESUME + "test_keep_last_keeps_the_newest",
    "checkpoint.resume": RESUME + "test_resume_auto_takes_the_newest_complete_checkpoint_and_never_starts_over",
    # the Megatron keys act on a GPU (the mcore tier); on CPU the run stops at the backend check
    "policy.megatron.tensor_model_parallel_size": MCORE + "test_tensor_parallel_2_matches_the_hf_worker",
    "policy.megatron.pipeline_model_parallel_size": MCORE + "test_pipeline_parallel_2_matches_the_hf_worker",
    "policy.fused_rms_norm": "tests/unit/models/policy/test_fused_rms_norm.py::"
                             "test_the_key_reaches_the_policy_and_its_reference",
    "policy.megatron.layer_spec": "tests/unit/models/megatron/test_layer_specs.py::"
                                  "test_the_layer_spec_key_builds_its_attention",
    "policy.megatron.context_parallel_size": "tests/unit/models/megatron/test_backend_checks.py::"
                                             "test_megatron_layouts_not_built_yet_are_refused_in_one_line",
    "policy.megatron.sequence_parallel": "tests/unit/models/megatron/test_backend_checks.py::"
                                         "test_megatron_layouts_not_built_yet_are_refused_in_one_line",
    "data.dataset": "tests/integration/test_loop_data.py::test_grpo_on_gsm8k_trains_on_the_train_file_and_validates_"
                    "on_the_test_file",
    # the asynchronous loop runs real Ray actors (a producer, a buffer): proven with real Ray
    "grpo.async.enabled": ASYNC + "test_max_staleness_0_reproduces_the_synchronous_run",
    "grpo.async.max_staleness": ASYNC + "test_max_staleness_0_reproduces_the_synchronous_run",  # 1 is the default
    "grpo.async.buffer_size": ASYNC_KEYS + "test_max_staleness_buffer_size_and_the_weight_cap_reach_the_loop",
    "grpo.async.importance_weight_cap": ASYNC_KEYS + "test_max_staleness_buffer_size_and_the_weight_cap_reach_the_loop",
    "grpo.async.claim_timeout_s": ASYNC_KEYS + "test_a_claim_timeout_is_one_line_naming_the_key",
    # two ranks form a real process group (Ray): their step equals the single worker's
    "policy.data_parallel_size": "tests/integration/test_data_parallel.py::"
                                 "test_two_data_parallel_ranks_take_the_single_workers_step",
    # a recording is proven by what it holds and by its replay, which starts no engine
    "grpo.save_rollouts": RECORDING + "test_a_replay_trains_exactly_as_the_recorded_run_and_starts_no_engine",
    "grpo.load_rollouts": RECORDING + "test_a_replay_trains_exactly_as_the_recorded_run_and_starts_no_engine",
    # the broadcast needs its members to run at once: real Ray (in-process runs use object_store)
    # a compiled forward needs a C compiler on a CPU (inductor); the loop hands every policy key
    # to the worker unchanged (PolicyWorkerConfig.of), the worker test observes the compile
    "policy.compile": "tests/unit/models/policy/test_compile.py::"
                      "test_policy_compile_compiles_the_trained_models_forward",
    # likewise: the worker test varies the key and compares both scorings (and the refusals)
    "policy.sequence_packing": "tests/unit/models/policy/test_sequence_packing.py::"
                               "test_a_packing_worker_scores_and_trains_as_the_padded_worker",
    "policy.logprob_chunk_tokens": "tests/unit/models/policy/test_logprob_chunks.py::"
                                   "test_a_chunked_worker_scores_and_trains_as_the_full_logits_worker",
    "generation.refit_transport": BROADCAST + "test_refit_transport_object_store_sends_no_broadcast",
    "generation.refit_bucket_mb": BROADCAST + "test_a_cpu_refit_is_a_broadcast_in_buckets_and_every_engine_serves_"
                                              "the_new_weights",
}

# Keys that change nothing a run can observe in this tier, and why. Keep this list short.
NOTHING_TO_OBSERVE: dict[str, str] = {
    # vLLM only (the in-process runs drive the hf backend): where engines are placed, and how
    # much KV cache they reserve. Results do not change; the vLLM tier and grpo.sh /
    # grpo_non_colocated.sh run both placements, test_refit_probe.py counts the bundles.
    "generation.colocated": "vLLM placement (bundles), not results",
    "generation.max_model_len": "vLLM engine capacity (KV cache), not results",
    "generation.max_num_seqs": "vLLM engine capacity (KV cache), not results",
}


def test_every_config_key_has_a_proof() -> None:
    keys = leaf_keys(grpo.GRPOMasterConfig) | leaf_keys(sft.SFTMasterConfig)
    covered = PROOFS.keys() | PROVEN_ELSEWHERE.keys() | NOTHING_TO_OBSERVE.keys()
    missing = sorted(keys - covered)
    assert not missing, (f"config keys no test proves to reach their code: {missing}; add a proof to PROOFS "
                         "(vary the key, observe its effect) or, if nothing observable changes, to NOTHING_TO_OBSERVE")
    assert not sorted(covered - keys), "entries for keys the schemas no longer have"
    assert len(covered) == len(PROOFS) + len(PROVEN_ELSEWHERE) + len(NOTHING_TO_OBSERVE), "a key listed twice"


def test_every_proof_elsewhere_names_a_test_that_exists() -> None:
    for key, node in PROVEN_ELSEWHERE.items():
        path, name = node.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(), f"{key}: {node} does not exist"


# The value each float key's proof sets, where the proof is not a trainer replay (TRAINER_KEYS
# holds those). Every float key must be proven with a value that a cast, a rounding or a clamp to
# a "usual" range on its way would change: not a whole number, and not the default.
FRACTIONAL: dict[str, float] = {
    "policy.lora.alpha": 1.5, "policy.lora.dropout": 0.25, "generation.refit_probe.max_logprob_error": 0.01,
    "cluster.cpus_per_worker": 0.25, "cluster.gpus_per_worker": 0.5, "sft.stop_at_val_accuracy": 0.65,
    "grpo.async.importance_weight_cap": 2.5, "grpo.async.claim_timeout_s": 0.5,
}


def test_every_float_key_is_proven_with_a_fractional_value() -> None:
    fields = {key: field for schema in (grpo.GRPOMasterConfig, sft.SFTMasterConfig)
              for key, field in leaf_fields(schema)}
    floats = {key for key, field in fields.items() if field.annotation is float or float in get_args(field.annotation)}
    assert not FRACTIONAL.keys() & TRAINER_KEYS.keys(), "a key listed in both"
    values = {**{key: TRAINER_KEYS[key] for key in floats & TRAINER_KEYS.keys()}, **FRACTIONAL}
    assert sorted(floats - values.keys()) == [], "a float key without a fractional value in its proof"
    assert sorted(values.keys() - floats) == [], "FRACTIONAL lists a key that holds no float"
    for key, value in values.items():
        assert all(v != int(v) for v in (value if isinstance(value, list) else [value])), (key, value)
        assert value != fields[key].default, (key, value)
        if key in FRACTIONAL:  # the proof itself sets the value (in PROOFS, or the test named elsewhere)
            source = (inspect.getsource(PROOFS[key]) if key in PROOFS
                      else (ROOT / PROVEN_ELSEWHERE[key].split("::")[0]).read_text())
            assert f"{key}={value}" in source, f"{key}: its proof does not set {value}"


@pytest.mark.parametrize("key", sorted(PROOFS))
def test_config_key_reaches_its_code(key: str, runner, capsys, request) -> None:
    PROOFS[key](runner, request.getfixturevalue("trainer_run") if key in TRAINER_KEYS else capsys)
