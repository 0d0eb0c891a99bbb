"""The cached SFT warm start: what its key covers, a real build reused, the command line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import posttrain
from posttrain.algorithms import sft
from posttrain.algorithms import warm_start as ws
from posttrain.config import load_config
from posttrain.errors import ConfigError

YAML = Path(__file__).resolve().parents[3] / "examples" / "configs" / "grpo_arithmetic_warm_start.yaml"
# A warm start that costs seconds: 2 SFT steps, no engine (no accuracy to stop on).
QUICK = ["sft.num_steps=2", "sft.val_accuracy=false", "sft.stop_at_val_accuracy=null", "cluster.cpus_per_worker=0.5"]


def key(*overrides: str) -> str:
    return ws.warm_start_key(load_config(YAML, list(overrides), sft.SFTMasterConfig))


def test_the_key_follows_what_the_weights_depend_on() -> None:
    base = key()
    for changed in ("sft.seed=1", "model.tiny.seed=1", "sft.stop_at_val_accuracy=0.4", "policy.lr=1e-3",
                    "data.arithmetic.num_val=400", "cluster.gpus_per_worker=0.5"):
        assert key(changed) != base, changed
    for placement_or_output in ("cluster.cpus_per_worker=0.5", "cluster.num_cpus=8", "logger.log_dir=/elsewhere",
                                "logger.print_period=1", "checkpoint.save_path=/elsewhere"):
        assert key(placement_or_output) == base, placement_or_output


def test_the_key_follows_the_code_that_trains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "posttrain"
    shutil.copytree(Path(posttrain.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(posttrain, "__file__", str(copy / "__init__.py"))
    base = key()
    (copy / "testing" / "check_metrics.py").write_text("# the toolkit trains nothing\n", encoding="utf-8")
    assert key() == base
    sft_py = copy / "algorithms" / "sft.py"
    sft_py.write_text(sft_py.read_text() + "\n# an edit\n", encoding="utf-8")
    assert key() != base


def test_a_warm_start_with_periodic_checkpoints_is_refused(tmp_path: Path) -> None:
    cfg = load_config(YAML, QUICK + [f"checkpoint.dir={tmp_path}"], sft.SFTMasterConfig)
    with pytest.raises(ConfigError, match="checkpoint.dir must be null"):
        ws.warm_start(cfg, tmp_path / "cache")


@pytest.mark.slow(reason="an SFT warm start built, then reused")
def test_a_built_warm_start_is_reused_without_training(ray_cluster, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(YAML, QUICK, sft.SFTMasterConfig)
    lines: list[str] = []
    first = ws.warm_start(cfg, tmp_path / "cache", lines.append)
    assert first.built and first.info["sft_steps"] == 2 and first.info["val_accuracy"] is None
    assert (first.path / ws.MODEL_DIR / "config.json").exists()
    assert (first.path / ws.LOG_DIR / "metrics.json").exists()

    def no_training(_cfg):
        raise AssertionError("a cached warm start was trained again")

    monkeypatch.setattr(sft, "train", no_training)
    again = ws.warm_start(cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"cpus_per_worker": 1.0})}),
                          tmp_path / "cache", lines.append)
    assert not again.built and again.path == first.path and again.info == first.info
    assert lines[-1].startswith(f"warm start reused: {first.path} (2 SFT steps")

    out = tmp_path / "copy"
    assert ws.main(["--config", str(YAML), "--cache-dir", str(tmp_path / "cache"), "--copy-to", str(out),
                    *QUICK[:-1]]) == 0
    assert (out / "config.json").read_bytes() == (first.path / ws.MODEL_DIR / "config.json").read_bytes()


def test_the_command_line_refuses_a_bad_key_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert ws.main(["--config", str(YAML), "--cache-dir", str(tmp_path), "sft.num_stepz=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "num_stepz" in err[0]
