"""Check rules against a metrics JSON file and print a PASS/FAIL table.

Usage:
    uv run python tests/check_metrics.py metrics.json \\
        'data["train/loss"]["1"] < 1.5' \\
        'mean(data["train/reward"], -10) > mean(data["train/reward"], 1, 10)' \\
        [--json-report report.json]

Helpers: min, max, mean(values, range_start=1, range_end=0, ignore_top_p=0.0), median,
ratio_above(values, threshold) (fraction >= threshold), abs, len, round. Rules are
parsed and interpreted by tests/metric_rules.py, never eval'd.

Exit status: 0 every rule passed, 1 a rule failed, 2 usage error (bad flags, bad rule,
unreadable or malformed metrics file).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

sys.path.insert(0, str(Path(__file__).resolve().parent))
import metric_rules


def build_table(results: list[metric_rules.CheckResult]) -> Table:
    """Render results as the "Metric Checks" table (Status, Check, Value, Message)."""
    table = Table(title="Metric Checks")
    table.add_column("Status", style="bold")
    table.add_column("Check", style="dim")
    table.add_column("Value", style="cyan")
    table.add_column("Message", style="italic")
    for r in results:
        status = Text("PASS", style="green") if r.passed else Text("FAIL", style="red")
        value = "N/A" if r.value is None else metric_rules.format_value(r.value)
        table.add_row(status, Text(r.rule), Text(value), Text(r.message))
    return table


def main(argv: list[str] | None = None) -> int:
    """Run the checks.

    Args:
        argv: command-line arguments (``sys.argv[1:]`` when None).

    Returns:
        0 when every rule passes, 1 when any fails, 2 for a usage error.
    """
    parser = argparse.ArgumentParser(
        description="Check rules against a metrics JSON file ({metric: {step: value}}).",
        epilog="Example: check_metrics.py m.json 'max(data[\"train/grad_norm\"]) < 10'",
    )
    parser.add_argument("metrics_json", help="path to the metrics JSON file")
    parser.add_argument("rules", nargs="+", help="rule expressions over `data`")
    parser.add_argument("--json-report", metavar="PATH", help="also write results as JSON")
    args = parser.parse_args(argv)  # bad flags: argparse prints usage, exits 2

    try:
        trees = [metric_rules.compile_rule(rule) for rule in args.rules]
        data = metric_rules.load_metrics(args.metrics_json)
    except (metric_rules.RuleError, metric_rules.MetricsFileError) as e:
        print(f"check_metrics.py: error: {e}", file=sys.stderr)
        return 2
    results = [metric_rules.evaluate_rule(data, rule, tree) for rule, tree in zip(args.rules, trees, strict=True)]
    Console(width=None if sys.stdout.isatty() else 200).print(build_table(results))
    if args.json_report:
        report = [r.to_json() for r in results]
        try:
            Path(args.json_report).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json_report).write_text(json.dumps(report, indent=2) + "\n")
        except OSError as e:
            print(
                f"check_metrics.py: error: cannot write {args.json_report}: {e}",
                file=sys.stderr,
            )
            return 2
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
