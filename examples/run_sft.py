"""SFT on a tiny local model.

    uv run python examples/run_sft.py --config examples/configs/sft_gsm8k.yaml sft.num_steps=20
"""

import sys
from pathlib import Path

from posttrain.algorithms.sft import SFTMasterConfig, train
from posttrain.utils.cli import run_main

DEFAULT_CONFIG = str(Path(__file__).parent / "configs" / "sft_arithmetic.yaml")

if __name__ == "__main__":  # the engines spawn processes: keep the guard
    sys.exit(run_main("SFT training", DEFAULT_CONFIG, SFTMasterConfig, train))
