"""Train/validation problems from the ``data`` config section."""

from __future__ import annotations

from posttrain.config import DataConfig
from posttrain.data.arithmetic import ArithmeticTask, split
from posttrain.data.gsm8k import load_gsm8k
from posttrain.data.types import MathProblem


def load_problems(cfg: DataConfig) -> tuple[list[MathProblem], list[MathProblem]]:
    """(train, validation) problems; validation is held out and capped at ``cfg.max_val``.

    Raises:
        ConfigError: bad arithmetic settings.  DataError: missing or malformed GSM8K file.
    """
    if cfg.dataset == "arithmetic":
        a = cfg.arithmetic
        train, val = split(ArithmeticTask(a.operand_digits, tuple(a.operators), a.num_val, a.seed))
    else:
        train, val = load_gsm8k(cfg.gsm8k_train_path), load_gsm8k(cfg.gsm8k_val_path)
    return train, val[: cfg.max_val] if cfg.max_val else val
