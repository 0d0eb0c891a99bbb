"""Merge the unit_results.json files of ``--shard`` runs into one (CI's ``unit-cpu-merge`` job).

Command line::

    python -m posttrain.testing.harness.merge OUT.json IN.json [IN.json ...]
        [--coverage-data FILE ...] [--write-durations PATH]

- ``metrics``: the union; a node id in two inputs is an error (that test ran in two shards).
- ``exit_status``: the first non-zero one of the inputs (in the order given), else 0.
- ``start_time``: the earliest; ``git_commit``: must be the same in every input.
- ``gpu_types``, ``cpu_model``: the first input's.
- ``coverage``: with ``--coverage-data``, the total percent of the shards' coverage data
  files combined (coverage.py; the measured sources must be where the data says, i.e. the
  same checkout path); else "n/a (run without --cov)", since shard totals do not add up.
- ``--write-durations PATH``: also write ``{node id: seconds}`` (``_total``, else ``_elapsed``), the
  flat map ``--shard`` reads from ``tests/durations.json``.

Exit status: 0 written; 2 with one line on stderr for a missing / non-JSON / malformed
input, a test in two shards, disagreeing commits or coverage data that cannot be combined.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posttrain.testing.harness.results import NO_COVERAGE, recorded_seconds

REQUIRED = ("exit_status", "git_commit", "start_time", "metrics")


class MergeError(Exception):
    """Inputs that cannot be merged; the CLI prints the message and exits 2."""


def read_results(path: Path) -> dict[str, Any]:
    """One shard's unit_results.json document.

    Raises:
        MergeError: unreadable, not JSON, or missing a field the merge needs.
    """
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MergeError(f"{path}: cannot read it as JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("metrics"), dict):
        raise MergeError(f"{path}: not a unit_results.json document (no metrics object)")
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        raise MergeError(f"{path}: not a unit_results.json document (missing {', '.join(missing)})")
    return doc


def merge(docs: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Merge ``(name, document)`` pairs (name: for messages) into one document (``coverage``
    is left to the caller).

    Raises:
        MergeError: no input, a node id in two inputs, or two different ``git_commit``.
    """
    if not docs:
        raise MergeError("nothing to merge: give at least one unit_results.json")
    first_name, first = docs[0]
    metrics: dict[str, Any] = {}
    ran_in: dict[str, str] = {}
    for name, doc in docs:
        if doc["git_commit"] != first["git_commit"]:
            raise MergeError(f"{name}: git_commit {doc['git_commit']} differs from {first_name}'s "
                             f"{first['git_commit']}: not shards of one run")
        for nodeid, values in doc["metrics"].items():
            if nodeid in ran_in:
                raise MergeError(f"{nodeid} ran in two shards ({ran_in[nodeid]} and {name})")
            ran_in[nodeid] = name
            metrics[nodeid] = values
    return {
        "exit_status": next((int(d["exit_status"]) for _, d in docs if int(d["exit_status"]) != 0), 0),
        "git_commit": first["git_commit"],
        "start_time": min(str(d["start_time"]) for _, d in docs),  # ISO 8601 UTC: text order is time order
        "metrics": metrics,
        "gpu_types": first.get("gpu_types", []),
        "cpu_model": first.get("cpu_model", ""),
    }


def combine_coverage(data_files: Sequence[Path]) -> float:
    """Total coverage percent of the combined coverage.py data files (the files are kept).

    Raises:
        MergeError: a file is missing, is not coverage data, or a measured source is gone.
    """
    import coverage  # only here: the test group has it, a plain install may not

    for path in data_files:
        if not path.is_file():
            raise MergeError(f"{path}: no such coverage data file")
        try:  # combine() only warns about a file it cannot use and leaves it out of the total
            coverage.CoverageData(basename=str(path)).read()
        except coverage.exceptions.CoverageException as e:
            raise MergeError(f"{path}: not coverage data: {e}") from None
    with tempfile.TemporaryDirectory() as tmp:
        cov = coverage.Coverage(data_file=str(Path(tmp) / ".coverage"))
        try:
            cov.combine([str(p) for p in data_files], strict=True, keep=True)
            return float(cov.report(file=io.StringIO()))  # the per-file table is pytest-cov's job in each shard
        except coverage.exceptions.CoverageException as e:
            raise MergeError(f"coverage data {', '.join(map(str, data_files))}: {e}") from None


def durations(doc: dict[str, Any]) -> dict[str, float]:
    """``{node id: seconds}`` of every test whose call ran, sorted by node id (``results.recorded_seconds``:
    set-up, call and teardown together where recorded)."""
    found = {}
    for nodeid, metrics in sorted(doc["metrics"].items()):
        seconds = recorded_seconds(metrics)
        if isinstance(seconds, int | float):
            found[nodeid] = float(seconds)
    return found


def write_json(doc: Any, path: Path) -> None:
    """Write ``doc`` (sorted keys, indented) through a temporary file: readers never see half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m posttrain.testing.harness.merge",
                                     description="Merge the unit_results.json files of --shard runs.")
    parser.add_argument("out", type=Path, help="merged unit_results.json to write")
    parser.add_argument("inputs", type=Path, nargs="+", help="the shards' unit_results.json files")
    parser.add_argument("--coverage-data", type=Path, nargs="+", default=[], metavar="FILE",
                        help="the shards' coverage data files (.coverage) to combine into the total")
    parser.add_argument("--write-durations", type=Path, metavar="PATH",
                        help="also write {nodeid: seconds} here (for tests/durations.json)")
    args = parser.parse_args(argv)
    try:
        merged = merge([(str(p), read_results(p)) for p in args.inputs])
        merged["coverage"] = round(combine_coverage(args.coverage_data), 2) if args.coverage_data else NO_COVERAGE
        write_json(merged, args.out)
        if args.write_durations is not None:
            write_json(durations(merged), args.write_durations)
    except (MergeError, OSError) as e:
        print(f"merge: {e}", file=sys.stderr)
        return 2
    print(f"merged {len(args.inputs)} shard(s), {len(merged['metrics'])} tests, exit_status "
          f"{merged['exit_status']}, coverage {merged['coverage']}: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
