"""GRPO on a tiny local model.

    uv run python examples/run_grpo.py --config examples/configs/grpo_arithmetic.yaml grpo.num_steps=20
"""

import sys
from pathlib import Path

from posttrain.algorithms.grpo import GRPOMasterConfig, train
from posttrain.utils.cli import run_main

DEFAULT_CONFIG = str(Path(__file__).parent / "configs" / "grpo_arithmetic.yaml")

if __name__ == "__main__":  # the engines spawn processes: keep the guard
    sys.exit(run_main("GRPO training", DEFAULT_CONFIG, GRPOMasterConfig, train))
