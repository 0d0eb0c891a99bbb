"""Tests for posttrain.config: YAML + overrides, validated by the algorithm schemas.

A config typo that is silently ignored is the classic way to run a job with the wrong
hyperparameters; every bad input must be a ConfigError with one line naming the key.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from posttrain.algorithms.grpo import GRPOMasterConfig
from posttrain.algorithms.sft import SFTMasterConfig
from posttrain.config import load_config
from posttrain.errors import ConfigError, PosttrainError

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "examples" / "configs"
GRPO_YAML = CONFIGS / "grpo_arithmetic.yaml"
SFT_YAML = CONFIGS / "sft_arithmetic.yaml"


def _error(path, overrides, schema=GRPOMasterConfig) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides, schema)
    message = str(info.value)
    assert "\n" not in message, message
    assert message.strip() == message and message
    return message


# --- the shipped configs ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "schema"),
    [("grpo_arithmetic.yaml", GRPOMasterConfig), ("grpo_arithmetic_warm_start.yaml", SFTMasterConfig),
     ("sft_arithmetic.yaml", SFTMasterConfig), ("sft_gsm8k.yaml", SFTMasterConfig)],
)
def test_example_configs_load_with_their_schema(name: str, schema) -> None:
    cfg = load_config(CONFIGS / name, [], schema)
    assert isinstance(cfg, schema)


def test_every_example_config_is_covered() -> None:
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == [
        "grpo_arithmetic.yaml", "grpo_arithmetic_warm_start.yaml", "sft_arithmetic.yaml", "sft_gsm8k.yaml"]


def test_yaml_values_reach_the_config() -> None:
    raw = yaml.safe_load(GRPO_YAML.read_text())
    grpo = load_config(GRPO_YAML, [], GRPOMasterConfig)
    assert grpo.grpo.completions_per_prompt == raw["grpo"]["completions_per_prompt"]
    assert grpo.policy.lr == pytest.approx(raw["policy"]["lr"])
    raw = yaml.safe_load((CONFIGS / "sft_gsm8k.yaml").read_text())
    sft = load_config(CONFIGS / "sft_gsm8k.yaml", [], SFTMasterConfig)
    assert sft.data.dataset == "gsm8k"
    assert sft.model.tiny.charset == "ascii"
    assert sft.model.tiny.max_position_embeddings == raw["model"]["tiny"]["max_position_embeddings"]
    assert sft.sft.val_accuracy is False
    assert sft.policy.train_global_batch_size == raw["policy"]["train_global_batch_size"]


def test_grpo_yaml_does_not_load_as_sft() -> None:
    message = _error(GRPO_YAML, [], SFTMasterConfig)
    assert "grpo" in message


# --- overrides ----------------------------------------------------------------------------


def test_override_changes_a_value() -> None:
    in_yaml = yaml.safe_load(GRPO_YAML.read_text())["grpo"]["num_steps"]
    assert load_config(GRPO_YAML, [], GRPOMasterConfig).grpo.num_steps == in_yaml != 7
    cfg = load_config(GRPO_YAML, ["grpo.num_steps=7"], GRPOMasterConfig)
    assert cfg.grpo.num_steps == 7
    assert isinstance(cfg.grpo.num_steps, int)


def test_nested_and_multiple_overrides() -> None:
    cfg = load_config(GRPO_YAML, ["policy.lr=1e-4", "model.tiny.seed=3", "grpo.advantage_estimator=dr_grpo"],
                      GRPOMasterConfig)
    assert cfg.policy.lr == pytest.approx(1e-4)
    assert cfg.model.tiny.seed == 3
    assert cfg.grpo.advantage_estimator == "dr_grpo"
    # the untouched neighbours keep their YAML values
    assert cfg.policy.max_grad_norm == 1.0
    assert cfg.model.tiny.charset == "arithmetic"


def test_later_override_wins() -> None:
    cfg = load_config(GRPO_YAML, ["grpo.num_steps=7", "grpo.num_steps=9"], GRPOMasterConfig)
    assert cfg.grpo.num_steps == 9


def test_override_of_a_key_absent_from_the_yaml_uses_the_schema() -> None:
    cfg = load_config(GRPO_YAML, ["checkpoint.save_path=/tmp/x", "cluster.num_cpus=2"], GRPOMasterConfig)
    assert cfg.checkpoint.save_path == "/tmp/x"
    assert cfg.cluster.num_cpus == 2


def test_list_override() -> None:
    cfg = load_config(GRPO_YAML, ["data.arithmetic.operators=[+,-]"], GRPOMasterConfig)
    assert cfg.data.arithmetic.operators == ["+", "-"]


def test_overrides_do_not_touch_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("grpo:\n  num_steps: 5\n")
    load_config(path, ["grpo.num_steps=6"], GRPOMasterConfig)
    assert path.read_text() == "grpo:\n  num_steps: 5\n"


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("override", ["grpo.foo=1", "foo=1", "model.tiny.hidden_sz=8", "policy.learning_rate=1e-3"])
def test_unknown_key_in_an_override_names_the_key(override: str) -> None:
    key = override.split("=")[0]
    message = _error(GRPO_YAML, [override])
    assert f"'{key}'" in message
    assert "unknown" in message


def test_typo_in_a_yaml_file_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text("grpo:\n  num_step: 10\npolicy:\n  lr: 1.0e-3\n")
    message = _error(path, [])
    assert "grpo.num_step" in message


def test_bad_type_names_the_key_and_the_value() -> None:
    message = _error(GRPO_YAML, ["grpo.num_steps=abc"])
    assert "grpo.num_steps" in message
    assert "abc" in message


@pytest.mark.parametrize(
    ("override", "key"),
    [("grpo.completions_per_prompt=1", "grpo.completions_per_prompt"), ("policy.lr=0", "policy.lr"),
     ("grpo.num_steps=0", "grpo.num_steps"), ("generation.top_p=1.5", "generation.top_p"),
     ("grpo.clip_eps=-0.1", "grpo.clip_eps"), ("cluster.gpus_per_worker=-1", "cluster.gpus_per_worker")],
)
def test_out_of_range_value_raises(override: str, key: str) -> None:
    message = _error(GRPO_YAML, [override])
    assert key in message
    assert override.split("=")[1] in message


@pytest.mark.parametrize(("gpus", "device"), [(0, "cpu"), (0.5, "cuda"), (1, "cuda")])
def test_workers_hold_their_models_on_cuda_only_with_gpus(gpus: float, device: str) -> None:
    cfg = load_config(GRPO_YAML, [f"cluster.gpus_per_worker={gpus}"], GRPOMasterConfig)
    assert cfg.cluster.device == device


@pytest.mark.parametrize("override", ["grpo.num_steps", "=3", "grpo.num_steps:7"])
def test_malformed_override_raises(override: str) -> None:
    message = _error(GRPO_YAML, [override])
    assert override in message


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "missing.yaml"
    message = _error(missing, [])
    assert str(missing) in message
    message = _error(tmp_path, [])  # a directory is not a config file
    assert str(tmp_path) in message


@pytest.mark.parametrize(("global_bs", "micro_bs"), [(64, 48), (10, 4)])
def test_global_batch_not_a_multiple_of_micro_raises(global_bs: int, micro_bs: int) -> None:
    message = _error(GRPO_YAML, [f"policy.train_global_batch_size={global_bs}",
                                 f"policy.train_micro_batch_size={micro_bs}"])
    assert "train_global_batch_size" in message and "train_micro_batch_size" in message
    assert str(global_bs) in message and str(micro_bs) in message


def test_global_batch_multiple_of_micro_is_accepted() -> None:
    cfg = load_config(GRPO_YAML, ["policy.train_global_batch_size=64", "policy.train_micro_batch_size=16"],
                      GRPOMasterConfig)
    assert cfg.policy.train_micro_batch_size == 16


def test_bad_literal_names_the_key_and_the_value() -> None:
    message = _error(GRPO_YAML, ["grpo.advantage_estimator=ppo"])
    assert "grpo.advantage_estimator" in message
    assert "ppo" in message


def test_bad_charset_is_rejected() -> None:
    message = _error(SFT_YAML, ["model.tiny.charset=unicode"], SFTMasterConfig)
    assert "model.tiny.charset" in message


def test_config_error_is_a_posttrain_error() -> None:
    with pytest.raises(PosttrainError):
        load_config(GRPO_YAML, ["grpo.foo=1"], GRPOMasterConfig)


def test_unresolvable_interpolation_is_a_one_line_config_error() -> None:
    message = _error(GRPO_YAML, ["grpo.num_steps=${nope}"])
    assert "nope" in message
    cfg = load_config(GRPO_YAML, ["grpo.seed=5", "grpo.num_steps=${grpo.seed}"], GRPOMasterConfig)
    assert cfg.grpo.num_steps == 5


@pytest.mark.parametrize(
    ("text", "overrides"),
    [("grpo:\n  num_steps: [1, 2\n", []),  # unclosed bracket: yaml ParserError
     ("grpo:\n\tnum_steps: 3\n", []),  # tab indentation: yaml ScannerError
     ("- 1\n- 2\n", []),  # a list at the top level: TypeError
     ("3\n", []),  # a scalar at the top level: OSError
     ("grpo:\n  num_steps: 3\n", ["grpo.num_steps=[1,2"])],  # unparsable override value
    ids=["unclosed-bracket", "tab", "top-level-list", "top-level-scalar", "bad-override-value"],
)
def test_unparsable_yaml_is_a_config_error(tmp_path: Path, text: str, overrides: list[str]) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    _error(path, overrides)


# --- the command line ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def grpo_cli():
    """``run_grpo.py`` with an unknown key, as a real process (~7 s, mostly importing torch).

    Started by the first test that asks for it, so the in-process CLI test below overlaps with it.
    """
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    proc = subprocess.Popen([sys.executable, "examples/run_grpo.py", "grpo.nonexistent=1"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def _last_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def test_cli_missing_data_file_exits_2_naming_the_path(grpo_cli, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    """The real ``run_sft.py`` script, run in-process: the data loads (and fails) before Ray starts."""
    import runpy

    import posttrain.algorithms.sft as sft

    def no_runtime(*args, **kwargs):
        raise AssertionError("the runtime (Ray, workers) started before the data was loaded")

    monkeypatch.setattr(sft, "open_run", no_runtime)
    monkeypatch.setenv("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", ["run_sft.py", "data.dataset=gsm8k", "data.gsm8k_train_path=/nonexistent.jsonl"])
    with pytest.raises(SystemExit) as info:
        runpy.run_path(str(REPO / "examples" / "run_sft.py"), run_name="__main__")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = _last_line(err)
    assert last.startswith("error:"), err
    assert "/nonexistent.jsonl" in last


def test_cli_unknown_key_exits_2_with_one_error_line(grpo_cli) -> None:
    try:
        out, err = grpo_cli.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        grpo_cli.kill()
        out, err = grpo_cli.communicate()
    assert grpo_cli.returncode == 2, err
    assert "Traceback" not in err
    last = _last_line(err)
    assert last.startswith("error:"), err
    assert "grpo.nonexistent" in last


@pytest.mark.parametrize(("override", "key"), [("grpo.num_steps=true", "grpo.num_steps"),
                                               ("policy.lr='1e-3'", "policy.lr"),
                                               ("grpo.drop_zero_variance_groups=1", "grpo.drop_zero_variance_groups")])
def test_values_are_not_coerced_across_types(override: str, key: str) -> None:
    assert key in _error(GRPO_YAML, [override])


def test_an_int_is_accepted_where_a_float_is_expected() -> None:
    cfg = load_config(GRPO_YAML, ["grpo.clip_eps=1", "policy.lr=1"], GRPOMasterConfig)
    assert cfg.grpo.clip_eps == 1.0 and cfg.policy.lr == 1.0


@pytest.mark.parametrize(("overrides", "other"), [
    (["policy.backend=megatron"], r"backend=megatron \(its parallelism is megatron.\*\)"),
    (["policy.lora.rank=4"], r"lora.rank=4 \(adapters are not sharded yet\)"),
    (["policy.compile=true"], r"compile=true \(a compiled forward is not sharded yet\)"),
])
def test_data_parallelism_refuses_what_it_cannot_shard_in_one_line(overrides: list[str], other: str) -> None:
    with pytest.raises(ConfigError, match=rf"data_parallel_size=2 cannot be combined with {other}") as err:
        load_config(GRPO_YAML, ["policy.data_parallel_size=2", *overrides], GRPOMasterConfig)
    assert "\n" not in str(err.value)
    load_config(GRPO_YAML, ["policy.data_parallel_size=1", *overrides], GRPOMasterConfig)  # one rank: no sharding
