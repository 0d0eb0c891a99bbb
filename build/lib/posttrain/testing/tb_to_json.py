"""Dump the scalars of TensorBoard event files to the metrics JSON that check_metrics reads.

Usage:
    uv run python tests/json_dump_tb_logs.py <tb_log_dir> [--output metrics.json]

Output: ``{tag: {str(step): value}}`` with steps sorted numerically; printed to stdout
when ``--output`` is not given. Every event file under the directory (recursively) is
read; when a tag+step appears more than once, the one written last wins (e.g. a run
resumed from a checkpoint re-logs the steps after it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

EVENT_FILE_GLOB = "events.out.tfevents.*"


def find_event_files(log_dir: str | Path) -> list[Path]:
    """All TensorBoard event files under ``log_dir`` (recursive), sorted by path."""
    return sorted(p for p in Path(log_dir).rglob(EVENT_FILE_GLOB) if p.is_file())


def _float32_to_short_float(value: float) -> float:
    """Event files store float32: give 0.9 back as 0.9, not 0.8999999761581421.

    The shortest decimal that reads back as the same float32 (numpy's repr) is parsed
    as a Python float, so the JSON shows what was logged; NaN/inf stay NaN/inf.
    """
    return float(str(np.float32(value)))


def dump_tb_logs(log_dir: str | Path) -> dict[str, dict[str, float]]:
    """Read every scalar of every event file under ``log_dir``.

    Args:
        log_dir: a TensorBoard log directory (searched recursively).

    Returns:
        ``{tag: {str(step): value}}``, tags sorted, steps sorted numerically, values
        the shortest decimals of the stored float32 (0.9 stays 0.9). For a
        repeated tag+step the value with the latest wall time wins (ties: the later
        file by path, then the later event in its file).

    Raises:
        FileNotFoundError: ``log_dir`` holds no event file.
    """
    # Imported here so `--help` and the no-files error stay fast.
    from tensorboard.backend.event_processing.event_accumulator import (
        SCALARS,
        EventAccumulator,
    )

    files = find_event_files(log_dir)
    if not files:
        raise FileNotFoundError(f"no TensorBoard event files ({EVENT_FILE_GLOB}) under {log_dir}")
    events: list[tuple[float, int, int, str, int, float]] = []
    for file_index, path in enumerate(files):
        # size_guidance 0 keeps every scalar (the default reservoir samples 10,000).
        acc = EventAccumulator(str(path), size_guidance={SCALARS: 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            for seq, ev in enumerate(acc.Scalars(tag)):
                value = _float32_to_short_float(ev.value)
                events.append((ev.wall_time, file_index, seq, tag, ev.step, value))
    merged: dict[str, dict[int, float]] = {}
    for _, _, _, tag, step, value in sorted(events, key=lambda e: e[:3]):
        merged.setdefault(tag, {})[step] = value
    return {tag: {str(step): merged[tag][step] for step in sorted(merged[tag])} for tag in sorted(merged)}


def main(argv: list[str] | None = None) -> int:
    """CLI entry.

    Args:
        argv: command-line arguments (``sys.argv[1:]`` when None).

    Returns:
        0 on success, 2 when the directory holds no event file or the output cannot be
        written.
    """
    parser = argparse.ArgumentParser(description="Dump TensorBoard scalars to JSON.")
    parser.add_argument("log_dir", help="TensorBoard log directory (searched recursively)")
    parser.add_argument("--output", metavar="PATH", help="write here instead of stdout")
    args = parser.parse_args(argv)
    try:
        metrics = dump_tb_logs(args.log_dir)
    except FileNotFoundError as e:
        print(f"json_dump_tb_logs.py: error: {e}", file=sys.stderr)
        return 2
    text = json.dumps(metrics, indent=2) + "\n"
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text)
    except OSError as e:
        print(
            f"json_dump_tb_logs.py: error: cannot write {args.output}: {e}",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
