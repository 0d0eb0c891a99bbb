"""The shared command line of ``examples/run_*.py``: ``--config FILE key.sub=value ...``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel

from posttrain.config import load_config
from posttrain.errors import PosttrainError


def run_main(description: str, default_config: str, schema: type[BaseModel],
             train: Callable[[Any], Any], argv: Sequence[str] | None = None) -> int:
    """Parse arguments, load and validate the config, run ``train``.

    Returns:
        0 on success; 2 on bad input (config, data), after printing ``error: <one line>``
        to stderr. Other exceptions (bugs) propagate with their traceback.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", default=default_config, help=f"YAML config (default: {default_config})")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. grpo.num_steps=10")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides, schema)
        train(cfg)
    except PosttrainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
