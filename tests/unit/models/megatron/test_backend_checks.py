"""``policy.backend=megatron`` where it cannot run fails before Ray starts, in one line, exit 2
(CPU, no megatron-core needed): the config schema, ``check_backend``, the placement, the entry
point and the Megatron functional scripts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.config import GenerationConfig, PolicyConfig
from posttrain.errors import ConfigError
from posttrain.models.generation.backends import check_engine_placement, num_bundles
from posttrain.models.policy import lm_policy
from posttrain.models.policy.lm_policy import check_backend, num_policy_workers

ROOT = Path(__file__).resolve().parents[4]


def megatron(tp: int = 1) -> PolicyConfig:
    return PolicyConfig.model_validate({"backend": "megatron",
                                        "megatron": {"tensor_model_parallel_size": tp}})


def test_the_backend_is_hf_unless_asked_and_names_are_strict() -> None:
    assert PolicyConfig().backend == "hf"
    with pytest.raises(ValueError, match="backend"):
        PolicyConfig.model_validate({"backend": "mcore"})
    with pytest.raises(ValueError, match="precision"):
        PolicyConfig.model_validate({"megatron": {"precision": "fp16"}})


@pytest.mark.parametrize(("megatron_keys", "message"), [
    ({"context_parallel_size": 2}, "context_parallel_size=2 is not supported: megatron-core splits attention over "
                                   "GPUs only with Transformer Engine's attention"),
    ({"sequence_parallel": True}, "sequence_parallel=true needs tensor_model_parallel_size > 1 (it splits the "
                                  "sequence over the tensor-parallel ranks), got 1"),
    ({"sequence_parallel": True, "tensor_model_parallel_size": 2}, "sequence_parallel=true is not supported: "
                                                                   "megatron-core's torch norms"),
])
def test_megatron_layouts_not_built_yet_are_refused_in_one_line(megatron_keys, message) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        PolicyConfig.model_validate({"backend": "megatron", "megatron": megatron_keys})
    PolicyConfig.model_validate({"backend": "megatron", "megatron": {"context_parallel_size": 1,
                                                                     "sequence_parallel": False}})


@pytest.mark.slow(reason="the entry point as a real process")
def test_the_entry_point_refuses_context_parallelism_in_one_line(tmp_path) -> None:
    result = run(sys.executable, "examples/run_grpo.py", "policy.backend=megatron",
                 "policy.megatron.context_parallel_size=2", f"logger.log_dir={tmp_path}", CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "context_parallel_size=2 is not supported" in lines[0], lines


def test_pipeline_stages_take_a_worker_each_and_a_whole_gpu(monkeypatch) -> None:
    """A Megatron policy of TP x PP ranks takes TP x PP workers (bundles); two or more ranks need
    a whole GPU each, refused in one line naming both sizes before Ray starts."""
    monkeypatch.setattr(lm_policy.importlib.util, "find_spec", lambda name: object())  # megatron "installed"
    layout = PolicyConfig.model_validate({"backend": "megatron", "megatron": {"tensor_model_parallel_size": 2,
                                                                              "pipeline_model_parallel_size": 3}})
    assert num_policy_workers(layout) == 6
    assert num_policy_workers(PolicyConfig.model_validate({"backend": "megatron",
                                                           "megatron": {"pipeline_model_parallel_size": 2}})) == 2
    with pytest.raises(ValueError, match="megatron.pipeline_model_parallel_size=2 needs backend=megatron"):
        PolicyConfig.model_validate({"megatron": {"pipeline_model_parallel_size": 2}})  # hf: refused, not ignored
    with pytest.raises(ConfigError, match=re.escape(
            "policy.megatron.tensor_model_parallel_size=2 x pipeline_model_parallel_size=3 (6 ranks) needs a whole "
            "GPU per rank, but cluster.gpus_per_worker=0.5")):
        check_backend(layout, gpus_per_worker=0.5, gpus_found=6)
    check_backend(layout, gpus_per_worker=1.0, gpus_found=6)
    with pytest.raises(ValueError, match="pipeline_model_parallel_size"):
        PolicyConfig.model_validate({"megatron": {"pipeline_model_parallel_size": 0}})


def test_hf_needs_nothing() -> None:
    check_backend(PolicyConfig(), gpus_per_worker=0.0, gpus_found=0)


@pytest.mark.parametrize("gpus_per_worker", [0.5, 0.25])
def test_data_parallel_ranks_that_would_share_a_gpu_are_refused(gpus_per_worker) -> None:
    """Ray packs bundles of a fraction of a GPU onto one device (two 0.5-GPU bundles on a 2-GPU
    node both got GPU 0), where NCCL refuses the second rank: refused before Ray starts."""
    dp2 = PolicyConfig(data_parallel_size=2)
    with pytest.raises(ConfigError, match=rf"^policy.data_parallel_size=2 needs a whole GPU per rank, "
                                          rf"but cluster.gpus_per_worker={gpus_per_worker:g}$"):
        check_backend(dp2, gpus_per_worker=gpus_per_worker, gpus_found=2)
    check_backend(dp2, gpus_per_worker=1.0, gpus_found=2)  # a GPU each
    check_backend(dp2, gpus_per_worker=0.0, gpus_found=0)  # CPU ranks
    check_backend(PolicyConfig(), gpus_per_worker=0.5, gpus_found=1)  # one rank may take half a GPU


@pytest.mark.slow(reason="the entry point as a real process")
def test_the_entry_point_refuses_data_parallel_ranks_on_half_a_gpu_in_one_line(tmp_path) -> None:
    result = run(sys.executable, "examples/run_grpo.py", "policy.data_parallel_size=2", "cluster.gpus_per_worker=0.5",
                 f"logger.log_dir={tmp_path}", POSTTRAIN_VERBOSE="1")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == ["error: policy.data_parallel_size=2 needs a whole GPU per rank, but cluster.gpus_per_worker=0.5"]
    assert "Started a local Ray instance" not in result.stdout + result.stderr  # refused before Ray


def test_megatron_without_megatron_core_names_the_extra(monkeypatch) -> None:
    monkeypatch.setattr(lm_policy.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"megatron-core is not installed: run with `uv run --extra mcore"):
        check_backend(megatron(), gpus_per_worker=1.0, gpus_found=1)


@pytest.mark.parametrize(("tp", "gpus_per_worker", "found", "message"), [
    (1, 1.0, 0, "needs 1 GPU, found 0"),
    (1, 0.0, 1, "set cluster.gpus_per_worker > 0"),
    (2, 0.5, 2, "tensor_model_parallel_size=2 needs a whole GPU per rank, but cluster.gpus_per_worker=0.5"),
])
def test_megatron_without_the_gpus_it_needs_is_refused(monkeypatch, tp, gpus_per_worker, found, message) -> None:
    monkeypatch.setattr(lm_policy.importlib.util, "find_spec", lambda name: object())  # megatron "installed"
    with pytest.raises(ConfigError, match=message):
        check_backend(megatron(tp), gpus_per_worker=gpus_per_worker, gpus_found=found)
    check_backend(megatron(tp), gpus_per_worker=1.0, gpus_found=tp)  # and with them it passes


@pytest.mark.parametrize(("gpus_per_worker", "found", "message"), [
    (0.5, 0, "generation.backend=megatron needs 1 GPU, found 0 (its engines run on CUDA only)"),
    (0.0, 1, "generation.backend=megatron needs GPUs for its workers: set cluster.gpus_per_worker > 0"),
])
def test_megatron_engines_without_the_gpus_they_need_are_refused(gpus_per_worker, found, message) -> None:
    with pytest.raises(ConfigError, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
        check_engine_placement("megatron", gpus_per_worker, found)
    check_engine_placement("megatron", 0.5, 1)  # with them it passes
    check_engine_placement("hf", 0.0, 0)  # and a CPU engine needs none


def test_each_tensor_parallel_rank_takes_a_bundle_and_engines_come_after() -> None:
    assert num_policy_workers(PolicyConfig()) == 1
    assert num_policy_workers(megatron(2)) == 2
    hf_engines = GenerationConfig(num_workers=2)
    assert num_bundles(hf_engines, "hf", policy_workers=2) == 4
    assert num_bundles(GenerationConfig(colocated=True, num_workers=2), "vllm", policy_workers=2) == 2


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAY_ADDRESS": "", **env})


@pytest.mark.slow(reason="the entry point as a real process")
def test_the_entry_point_refuses_megatron_on_a_cpu_machine_in_one_line(tmp_path) -> None:
    # POSTTRAIN_VERBOSE: Ray's start-up banner would show if Ray started (it is quiet otherwise).
    result = run(sys.executable, "examples/run_grpo.py", "policy.backend=megatron", f"logger.log_dir={tmp_path}",
                 CUDA_VISIBLE_DEVICES="", POSTTRAIN_VERBOSE="1")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: policy.backend=megatron"), lines
    assert "Started a local Ray instance" not in result.stdout + result.stderr  # refused before Ray


@pytest.mark.slow(reason="the entry point as a real process")
def test_the_entry_point_refuses_megatron_generation_where_it_cannot_run_in_one_line(tmp_path) -> None:
    """Without megatron-core the missing extra is named; with it but no GPU, the missing GPU:
    either way one line, exit 2, before Ray starts."""
    result = run(sys.executable, "examples/run_grpo.py", "generation.backend=megatron", f"logger.log_dir={tmp_path}",
                 CUDA_VISIBLE_DEVICES="", POSTTRAIN_VERBOSE="1")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: generation.backend=megatron"), lines
    assert ("megatron.core is not installed" in lines[0]) or ("needs 1 GPU, found 0" in lines[0]), lines
    assert "Started a local Ray instance" not in result.stdout + result.stderr


@pytest.mark.parametrize("script", ["grpo_megatron.sh", "grpo_megatron_generation.sh", "sft_megatron.sh"])
def test_the_megatron_functional_scripts_exit_2_without_a_gpu(script, tmp_path) -> None:
    before = set((ROOT / "tests" / "functional").iterdir())
    result = run("bash", f"tests/functional/{script}", POSTTRAIN_NUM_GPUS="0")
    assert result.returncode == 2
    assert result.stderr.strip() == f"{script}: needs 1 GPU, found 0"
    assert set((ROOT / "tests" / "functional").iterdir()) == before  # nothing run, nothing written


def test_grpo_megatron_at_tensor_parallel_2_asks_for_2_gpus() -> None:
    """Each tensor-parallel rank takes a whole GPU: TP=2 on one GPU exits 2 before anything runs."""
    result = run("bash", "tests/functional/grpo_megatron.sh", "policy.megatron.tensor_model_parallel_size=2",
                 POSTTRAIN_NUM_GPUS="1")
    assert (result.returncode, result.stderr.strip()) == (2, "grpo_megatron.sh: needs 2 GPUs, found 1")


def test_the_megatron_engine_row_names_a_worker_that_imports_without_megatron_core_and_refuses_a_cpu(
        monkeypatch) -> None:
    from posttrain.models.generation.backends import BACKENDS
    from posttrain.models.generation.megatron.megatron_generation_worker import (
        MegatronGenerationWorker,
        MegatronGenerationWorkerImpl,
    )

    # the row's "module:Class" resolves, megatron-core not needed
    assert BACKENDS["megatron"].worker_class() is MegatronGenerationWorker

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"^generation.backend=megatron needs a GPU: megatron-core's forward "
                                           r"pass is CUDA-only$"):
        MegatronGenerationWorkerImpl("unused")


def test_a_colocated_megatron_engine_over_a_megatron_policy_takes_no_bundle_of_its_own() -> None:
    from posttrain.models.generation.backends import serves_in_place

    colocated, own = GenerationConfig(backend="megatron"), GenerationConfig(backend="megatron", colocated=False)
    assert serves_in_place(colocated, "megatron", "megatron")
    assert num_bundles(colocated, "megatron", policy_workers=1, policy_backend="megatron") == 1
    # not in place: an HF policy, or colocated=false -> an engine with a bundle of its own
    assert not serves_in_place(colocated, "megatron", "hf")
    assert num_bundles(colocated, "megatron", policy_workers=1, policy_backend="hf") == 2
    assert not serves_in_place(own, "megatron", "megatron")
    assert num_bundles(own, "megatron", policy_workers=1, policy_backend="megatron") == 2
    assert not serves_in_place(GenerationConfig(backend="auto"), "auto", "megatron")
    assert num_bundles(colocated, "hf", policy_workers=1, policy_backend="hf") == 2


@pytest.mark.parametrize(("args", "message"), [
    ((2,), "tensor_model_parallel_size=1 only, got 2"),
    ((1, 2), "generation.num_workers=2"),
    ((1, 1, True), "async GRPO generates while it trains"),
    ((1, 1, False, 2), "pipeline_model_parallel_size=1 only, got 2"),
])
def test_an_in_place_engine_this_code_does_not_serve_is_refused_in_one_line(args, message) -> None:
    from posttrain.models.generation.megatron.in_place import check_in_place

    with pytest.raises(ConfigError, match=message) as err:
        check_in_place(*args)
    assert "\n" not in str(err.value) and "generation.colocated=false" in str(err.value)
    check_in_place(1, 1)  # what it serves passes


@pytest.mark.slow(reason="the entry point as a real process")
def test_async_grpo_with_an_in_place_megatron_engine_is_refused_before_ray_starts(tmp_path) -> None:
    result = run(sys.executable, "examples/run_grpo.py", "grpo.async.enabled=true", "policy.backend=megatron",
                 "generation.backend=megatron", f"logger.log_dir={tmp_path}", CUDA_VISIBLE_DEVICES="",
                 POSTTRAIN_VERBOSE="1")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "async GRPO generates while it trains" in lines[0], lines
    assert "Started a local Ray instance" not in result.stdout + result.stderr
