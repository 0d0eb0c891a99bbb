"""The SFT warm start of a GRPO run, trained once and reused from a verified on-disk cache.

A GRPO job on a tiny model starts from an SFT checkpoint that stopped on a measured held-out
accuracy (``sft.stop_at_val_accuracy``): from a random model every reward is 0 and GRPO has
nothing to learn from. That SFT run costs tens of seconds to minutes, and every learning test
and functional script needs one. :func:`warm_start` trains it once per config, code and library
version, and hands out the cached copy afterwards (``posttrain.utils.artifact_cache``: a
partial, corrupt or stale entry is rebuilt, never trusted).

The key covers what determines the weights: the whole config except where the run writes
(``logger``, ``checkpoint``) and where its workers are placed (cluster keys other than
``gpus_per_worker``), the source of the ``posttrain`` package (its ``testing`` toolkit
aside: it trains nothing), and the torch and transformers versions. The machine is not in the
key: the cache lives on the machine's own disk (``$POSTTRAIN_CACHE``).

Command line (the functional scripts' warm start)::

    python -m posttrain.algorithms.warm_start --config examples/configs/sft_arithmetic.yaml \
        --copy-to DIR sft.stop_at_val_accuracy=0.35 ...     # prints the entry; DIR gets the model
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import posttrain
from posttrain.algorithms import sft
from posttrain.config import load_config
from posttrain.errors import PosttrainError
from posttrain.models.tiny import default_cache_dir
from posttrain.utils.artifact_cache import CacheEntry, fingerprint, get_or_build, source_digest

MODEL_DIR = "model"  # the entry's Hugging Face directory (a model.path for GRPO)
LOG_DIR = "logs"  # the SFT run's metrics.json and TensorBoard events
NOT_IN_KEY = {"logger", "checkpoint"}  # where the run writes, not what it learns
# cluster keys that place the workers without changing a number they compute (gpus_per_worker does:
# it moves the model to CUDA)
PLACEMENT_ONLY = ("address", "num_cpus", "num_gpus", "cpus_per_worker")


def warm_start_key(cfg: sft.SFTMasterConfig) -> str:
    """The cache key of the warm start ``cfg`` trains (see the module doc for what it covers)."""
    import torch
    import transformers

    package = Path(posttrain.__file__).parent
    config = cfg.model_dump(mode="json", exclude=NOT_IN_KEY)
    for key in PLACEMENT_ONLY:
        config["cluster"].pop(key)
    return fingerprint({
        "config": config,
        "code": source_digest(package, exclude=["testing"]),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    })


def warm_start(cfg: sft.SFTMasterConfig, cache_dir: Path | None = None,
               log: Callable[[str], None] = print) -> CacheEntry:
    """The SFT run ``cfg`` describes, from the cache or trained now.

    The model is ``entry.path / MODEL_DIR`` (load it as ``model.path``; never write into it:
    copy it first), the run's metrics ``entry.path / LOG_DIR / "metrics.json"``;
    ``entry.info`` holds ``sft_steps`` (the last step), ``val_accuracy`` (its last
    measurement, or None without ``sft.val_accuracy``) and ``seconds`` (the build's).

    Args:
        cfg: an SFT config; its ``logger.log_dir`` and ``checkpoint`` are replaced by the entry's.
        cache_dir: default ``$POSTTRAIN_CACHE/warm_start`` (``~/.cache/posttrain/warm_start``).

    Raises:
        ConfigError: ``cfg.checkpoint.dir`` is set (a warm start is one uninterrupted run).
        CacheError: the cache's lock was held for too long. Training errors propagate.
    """
    if cfg.checkpoint.dir is not None:
        from posttrain.errors import ConfigError

        raise ConfigError(f"a cached warm start is one uninterrupted run: checkpoint.dir must be null, "
                          f"got {cfg.checkpoint.dir!r}")
    root = cache_dir or default_cache_dir() / "warm_start"

    def build(directory: Path) -> dict[str, Any]:
        run = cfg.model_copy(update={
            "logger": cfg.logger.model_copy(update={"log_dir": str(directory / LOG_DIR)}),
            "checkpoint": cfg.checkpoint.model_copy(update={"save_path": str(directory / MODEL_DIR)}),
        })
        start = time.perf_counter()
        metrics = sft.train(run)
        last = max(int(s) for s in metrics["train/loss"])
        accuracy = metrics.get("val/accuracy", {}).get(str(last))
        return {"sft_steps": last, "val_accuracy": accuracy, "seconds": round(time.perf_counter() - start, 1)}

    entry = get_or_build(root, warm_start_key(cfg), build, log)
    log(f"warm start {'built' if entry.built else 'reused'}: {entry.path} ({_describe(entry.info)})")
    return entry


def _describe(info: dict[str, Any]) -> str:
    accuracy = info.get("val_accuracy")
    shown = f"{accuracy:.3f}" if isinstance(accuracy, float) else "not measured"
    return f"{info.get('sft_steps')} SFT steps, held-out accuracy {shown}, built in {info.get('seconds')} s"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m posttrain.algorithms.warm_start``: print the entry; ``--copy-to DIR`` copies
    its model there (replacing DIR). Exit 0, or 2 with one ``error:`` line for bad input."""
    parser = argparse.ArgumentParser(description="The cached SFT warm start of a config (trained when missing).")
    parser.add_argument("--config", required=True, help="SFT YAML config, e.g. examples/configs/sft_arithmetic.yaml")
    parser.add_argument("--copy-to", type=Path, default=None, help="copy the warm start's model directory here")
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: $POSTTRAIN_CACHE/warm_start")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides, as run_sft.py takes them")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides, sft.SFTMasterConfig)
        entry = warm_start(cfg, args.cache_dir)
    except PosttrainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.copy_to is not None:
        shutil.rmtree(args.copy_to, ignore_errors=True)
        shutil.copytree(entry.path / MODEL_DIR, args.copy_to)
    return 0


if __name__ == "__main__":  # the engines spawn processes: keep the guard
    sys.exit(main())
