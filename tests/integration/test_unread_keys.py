"""A run fails on a config key it was given and never read (posttrain/algorithms/unread_keys.py):
at the end of set-up, before a step, in one line and exit 2; or, for a key only the loop would
read, at the end of the run, its metrics written. Real short SFT runs in this process
(``in_process.py``), workers' reads included; tests/integration/test_config_plumbing.py runs both
checks on every key's proof, tests/unit/algorithms/test_loops.py through real Ray actors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from in_process import Recorder, RecordingTransport

from posttrain.algorithms import sft
from posttrain.algorithms.sft import SFTConfig, SFTMasterConfig
from posttrain.config_reads import ReadsConfig
from posttrain.distributed.transport import use_transport
from posttrain.errors import ConfigError
from posttrain.utils.cli import run_main

ROOT = Path(__file__).resolve().parents[2]
SFT_YAML = str(ROOT / "examples" / "configs" / "sft_arithmetic.yaml")


class PlantedSFTConfig(SFTConfig):
    resume_from_checkpoint: str | None = None  # declared, and no code reads it


class PlantedSFTMasterConfig(SFTMasterConfig):
    sft: PlantedSFTConfig = PlantedSFTConfig()


@pytest.fixture
def base(tiny_model_path, tmp_path) -> list[str]:
    return [f"model.path={tiny_model_path}", f"logger.log_dir={tmp_path / 'logs'}", "sft.num_steps=1",
            "sft.batch_size=8", "sft.val_period=0", "sft.val_loss_size=6", "data.arithmetic.num_val=6",
            "generation.max_new_tokens=3", "policy.train_global_batch_size=8", "policy.train_micro_batch_size=8",
            # in this process a refit cannot broadcast (in_process.py): a run that got past set-up ends fast
            "generation.backend=hf", "generation.refit_transport=object_store"]


def test_a_planted_key_no_code_reads_stops_the_run_at_set_up_in_one_line_with_exit_2(base, capsys) -> None:
    recorder = Recorder()
    with use_transport(RecordingTransport(recorder)):
        code = run_main("SFT", SFT_YAML, PlantedSFTMasterConfig, sft.train,
                        ["--config", SFT_YAML, *base, "sft.resume_from_checkpoint=ckpt/step_9"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: config keys set but read by nothing by the end of set-up: "
                             "sft.resume_from_checkpoint=ckpt/step_9 ("), err
    assert recorder.workers and not [c for c in recorder.calls if c.method == "train"]  # set up, never trained


def test_the_workers_reads_reach_the_driver_and_the_loops_keys_are_checked_at_the_end(in_process, base,
                                                                                      tmp_path) -> None:
    # fused_rms_norm and generation.num_threads: read only inside the policy worker and the engine;
    # keep_last: read only by a checkpoint, which a run without checkpoint.dir never writes
    worker_keys = ["policy.fused_rms_norm=false", "generation.num_threads=2"]
    with pytest.raises(ConfigError, match=r"in the whole run: checkpoint\.keep_last=3 \("):
        in_process.run(sft, SFT_YAML, [*base, *worker_keys, "checkpoint.keep_last=3"])
    logged = json.loads((tmp_path / "logs" / "metrics.json").read_text())
    assert sorted(logged["train/loss"]) == ["1"]  # the run trained, and its metrics are written
    with pytest.MonkeyPatch.context() as mp:  # the workers' reads lost on their way back
        mp.setattr(ReadsConfig, "config_reads", lambda self: frozenset())
        # every key the file or the overrides set that only a worker reads (lr and betas: the optimizer's)
        unread = "policy.lr=0.003, policy.betas=[0.9,0.98], policy.fused_rms_norm=false, generation.num_threads=2"
        with pytest.raises(ConfigError, match=re.escape(f"by the end of set-up: {unread} (")):
            in_process.run(sft, SFT_YAML, [*base, *worker_keys])
