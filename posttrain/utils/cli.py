"""The shared command line of ``examples/run_*.py``: ``--config FILE key.sub=value ...``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

import yaml
from pydantic import BaseModel

from posttrain.config import RunConfig, check_output_paths, leaf_fields, load_config
from posttrain.errors import PosttrainError
from posttrain.utils.interrupts import StopRequested, graceful_stop, signals_held


def run_main(description: str, default_config: str, schema: type[BaseModel],
             train: Callable[[Any], Any], argv: Sequence[str] | None = None) -> int:
    """Parse arguments, load and validate the config, run ``train``.

    Returns:
        0 on success (with ``--validate``: the config and output paths are fine); 2 on bad
        input (config, output paths, data), 1 when a worker died, after printing ``error: <one
        line>`` to stderr;
        128 + the signal number (130 SIGINT, 143 SIGTERM) when a signal stopped the run at a
        step boundary (one line naming the step and its checkpoint; Ray shut down). Other
        exceptions (bugs) propagate with their traceback.
    """
    keys = "\n".join(config_keys(schema))
    epilog = ("config keys (type = schema default: description; the YAML file may set others, --print-config "
              f"shows what a run gets):\n{keys}")
    parser = argparse.ArgumentParser(description=description, epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=default_config, help=f"YAML config (default: {default_config})")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. grpo.num_steps=10")
    parser.add_argument("--validate", action="store_true",
                        help="only load and check the config and the output paths, then exit (0: fine, 2: not)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the config after the YAML file and the overrides (YAML), then exit")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides, schema)
        if args.print_config:
            print(yaml.safe_dump(cfg.model_dump(), sort_keys=False), end="")
            return 0
        if isinstance(cfg, RunConfig):
            check_output_paths(cfg)  # before Ray, data and training: a typo costs nothing
        if args.validate:
            print(f"config OK: {args.config} {' '.join(args.overrides)}".rstrip())
            return 0
        with graceful_stop():
            train(cfg)
    except StopRequested as exc:
        with signals_held():
            _shutdown_ray()
            print(f"{exc}", file=sys.stderr, flush=True)
        return 128 + exc.signum
    except KeyboardInterrupt:  # a second signal: abort without a checkpoint
        with signals_held():
            _shutdown_ray()
            print("aborted: no checkpoint of the step in flight", file=sys.stderr, flush=True)
        return 130
    except PosttrainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


def config_keys(schema: type[BaseModel]) -> list[str]:
    """``  policy.lr: float = 0.0003: ...``: every leaf key of ``schema`` with its type, default
    and description, read from the pydantic fields (what ``--help`` lists)."""
    lines = []
    for key, field in leaf_fields(schema):
        kind = field.annotation
        spelled = kind.__name__ if isinstance(kind, type) else str(kind).replace("typing.", "")
        about = f": {field.description}" if field.description else ""
        lines.append(f"  {key}: {spelled} = {field.default!r}{about}")
    return lines


def _shutdown_ray() -> None:
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()
