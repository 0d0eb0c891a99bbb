"""Read metrics for the rule engine: the logger's JSON file or a TensorBoard log directory.

Both give ``{metric: Series}`` (or ``{metric: number}`` for a plain-number metric such as
a final evaluation score). Every metric is validated up front, so a malformed file is a
usage error naming the path, metric and step before any rule runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from posttrain.testing.rules.errors import MetricsFileError
from posttrain.testing.rules.series import Series, is_number

_STEP = "(?:0|[1-9][0-9]*)"
_CANONICAL_STEP = re.compile(_STEP)
_CANONICAL_STEPS = re.compile(f"{_STEP}(?:\n{_STEP})*")  # the keys joined by newlines


def _series(raw: dict[str, Any], where: str) -> Series:
    """One metric's ``{step: value}`` as a Series (steps canonical ints >= 0, values numbers).

    One regex over the joined keys and one set of value types: ~0.5 ms per 10,000 steps.

    Raises:
        MetricsFileError: a step or a value of the wrong kind, naming it.
    """
    joined = "\n".join(raw)
    if raw and not (_CANONICAL_STEPS.fullmatch(joined) and joined.count("\n") == len(raw) - 1):
        bad = next(k for k in raw if not _CANONICAL_STEP.fullmatch(k))
        raise MetricsFileError(f"{where} step {bad!r}: expected a step number such as '1', got {bad!r}")
    if not set(map(type, raw.values())) <= {int, float}:
        step, value = next((k, v) for k, v in raw.items() if not is_number(v))
        raise MetricsFileError(f"{where} step {step!r}: expected a number, got {value!r}")
    return Series.from_validated(raw)


def validate_metrics(raw: Any, source: str) -> dict[str, Series | float]:
    """Check the shape of parsed metrics and turn each step dict into a Series.

    Args:
        raw: the parsed JSON (or TensorBoard dump).
        source: the path, for messages.

    Returns:
        metric -> Series, or metric -> number for a plain-number metric.

    Raises:
        MetricsFileError: not an object of metrics, or a metric that is neither a number
            nor ``{step: number}``; the message names ``source``, the metric and the step.
    """
    if not isinstance(raw, dict):
        raise MetricsFileError(f"metrics file {source}: top level must be an object, got {type(raw).__name__}")
    metrics: dict[str, Series | float] = {}
    for name, series in raw.items():
        where = f"metrics file {source}: metric {name!r}"
        if is_number(series):
            metrics[name] = series
        elif isinstance(series, dict):
            metrics[name] = _series(series, where)
        else:
            raise MetricsFileError(f"{where} is {series!r}, not {{step: value}} or a number")
    return metrics


def load_metrics(path: str | Path) -> dict[str, Series | float]:
    """Read and validate a metrics JSON file (``{metric: {step: value}}`` or ``{metric: number}``).

    Args:
        path: the file; steps are strings of ints >= 0; values numbers (NaN/Infinity
            accepted here and failed by the rules that read them).

    Returns:
        metric -> Series (steps sorted numerically) or number.

    Raises:
        MetricsFileError: unreadable file, invalid JSON (with line and column), or a
            wrong shape; the message names the path and the offending metric/step.
    """
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise MetricsFileError(f"cannot read metrics file {path}: {e}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise MetricsFileError(f"metrics file {path} is not valid JSON: {e}") from None
    return validate_metrics(raw, str(path))


def load_tb_dir(log_dir: str | Path) -> dict[str, Series | float]:
    """Read every scalar of the TensorBoard event files under ``log_dir`` (``json_dump_tb_logs``).

    Raises:
        MetricsFileError: no event file under ``log_dir``, none with a scalar (a corrupt
            file reads as empty), or one that cannot be read.
    """
    from posttrain.testing.tb_to_json import dump_tb_logs  # imports tensorboard: only when asked for

    try:
        raw = dump_tb_logs(log_dir)
    except FileNotFoundError as e:
        raise MetricsFileError(str(e)) from None
    except Exception as e:  # a corrupt event file: a usage error naming the directory
        raise MetricsFileError(f"cannot read TensorBoard logs under {log_dir}: {type(e).__name__}: {e}") from None
    if not raw:  # the reader skips what it cannot parse: a corrupt file reads as no scalars
        raise MetricsFileError(f"no scalars in the TensorBoard event files under {log_dir}")
    return validate_metrics(raw, f"{log_dir} (TensorBoard)")
