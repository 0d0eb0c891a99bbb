"""A loaded config records the keys read through it (posttrain/config_reads.py): by dotted key, in
every copy it is sent as, and through the worker configs built from it; validation, copying and
dumping read nothing."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from posttrain.algorithms.grpo_config import GRPOMasterConfig
from posttrain.config import ClusterConfig, GenerationWorkerConfig, PolicyConfig, PolicyWorkerConfig, load_config
from posttrain.config_reads import reads_of, record_of, untracked

ROOT = Path(__file__).resolve().parents[2]
GRPO_YAML = str(ROOT / "examples" / "configs" / "grpo_arithmetic.yaml")


@pytest.fixture
def cfg() -> GRPOMasterConfig:
    return load_config(GRPO_YAML, ["policy.lr=0.01", "policy.lora.alpha=2.5", "grpo.async.max_staleness=2",
                                   "policy.max_grad_norm=1.0"], GRPOMasterConfig)


def test_a_loaded_config_has_read_nothing_and_knows_the_keys_set_off_their_default(cfg) -> None:
    record = record_of(cfg)
    assert record is not None and record.read == set()  # the validators' reads come before the record
    # the file's and the overrides' keys, but not those at their default (max_grad_norm, the file's seed: 0)
    assert {"policy.lr", "policy.lora.alpha", "grpo.async.max_staleness", "grpo.num_steps"} <= record.set_keys.keys()
    assert not {"policy.max_grad_norm", "grpo.seed", "grpo.clip_eps"} & record.set_keys.keys()
    assert record.set_keys["policy.lora.alpha"] == 2.5


def test_reading_a_field_records_its_dotted_key_and_nothing_else_does(cfg) -> None:
    assert cfg.policy.lr == 0.01 and cfg.grpo.async_.max_staleness == 2 and cfg.model.tiny.hidden_size == 128
    cfg.model_dump()
    _ = cfg.policy.lora, cfg == cfg, untracked(cfg.policy).warmup_steps  # a section, a comparison, an untracked copy
    assert record_of(cfg).read == {"policy.lr", "grpo.async.max_staleness", "model.tiny.hidden_size"}  # type: ignore[union-attr]


def test_a_pickled_copy_records_into_its_own_record(cfg) -> None:
    copy = pickle.loads(pickle.dumps(cfg))  # what Ray sends an actor
    assert copy.policy.betas == [0.9, 0.999]
    assert reads_of(copy) == {"policy.betas"} and reads_of(cfg) == frozenset()
    assert copy == cfg  # the record is no field: equality, dumps and hashes are the sections' own


def test_a_workers_config_reads_the_run_keys_it_copies_and_building_it_reads_none(cfg) -> None:
    worker = PolicyWorkerConfig.of(cfg.policy, 0.7, "cpu", top_k=3)
    engine = GenerationWorkerConfig.of(cfg.generation, cfg.cluster, seed=1, precision="bf16")
    assert record_of(cfg).read == set()  # type: ignore[union-attr]
    _ = worker.lr, worker.temperature, worker.lora.alpha, worker.reference, engine.dtype, engine.max_num_seqs
    assert record_of(cfg).read == {"policy.lr", "generation.temperature", "policy.lora.alpha",  # type: ignore[union-attr]
                                   "policy.precision", "generation.max_num_seqs"}


def test_a_built_config_records_nothing() -> None:
    worker = PolicyWorkerConfig.of(PolicyConfig(), 1.0, "cpu")
    assert worker.lr > 0 and reads_of(worker) == frozenset() and record_of(ClusterConfig()) is None
