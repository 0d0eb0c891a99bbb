"""Check rules against a run's metrics and print the "Metric Checks" table.

Usage:
    uv run python tests/check_metrics.py metrics.json 'RULE' ... [options]
    uv run python tests/check_metrics.py --tb-dir logs/tensorboard 'RULE' ... [options]

    check_metrics.py logs/metrics.json --pack grpo --expect-steps 200 \\
        'mean(data["train/reward_mean"], -20) > mean(data["train/reward_mean"], 1, 21)'

A rule is an expression over ``data`` (metric -> step -> value) with the helpers min, max,
mean(values, range_start=1, range_end=0, ignore_top_p=0.0), median(values, range_start=1,
range_end=0), ratio_above(values, threshold), all_finite, first, last, last_step, std, slope, abs, len, round. Rules are
parsed and interpreted (posttrain/testing/rules/interpreter.py), never eval'd. docs/testing.md ("Rules")
documents the language, the vacuity check, packs and margins.

``check-metrics calibrate RUN... --rules FILE`` recommends bounds from healthy runs
(:mod:`posttrain.testing.calibrate`; docs/testing.md, "Calibrating bounds").

``--report DIR`` also writes each rule's plot and an HTML page of them all into DIR
(:mod:`posttrain.testing.report`; needs the ``report`` extra, matplotlib).

Exit status: 0 every rule passed (WARN and SKIP allowed), 1 a rule failed or is vacuous,
2 usage error (bad flags, no rules, a rule that does not parse or uses a forbidden
construct, an unreadable or malformed metrics file, ``--report`` without matplotlib or
into a directory that cannot be written).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from posttrain.testing import report as check_report
from posttrain.testing.rules import interpreter as metric_rules
from posttrain.testing.rules import report as rule_report
from posttrain.testing.rules.checker import CheckOptions, RuleSpec, run_checks
from posttrain.testing.rules.helpers import HELPERS
from posttrain.testing.rules.packs import PACK_BOUNDS, PACKS, pack_rules

PROG = "check_metrics.py"


class UsageError(Exception):
    """Bad input that is not argparse's to catch: exit 2 with one line."""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a step number >= 1, got {text}")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def _fraction(text: str) -> float:
    value = _finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0.05 = 5%), got {text}")
    return value


def _signature(fn: Any) -> str:
    """``(values, range_start=1, range_end=0)``: a helper's parameters as a rule writes them."""
    parts = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
        elif p.default is inspect.Parameter.empty:
            parts.append(p.name)
        else:
            parts.append(f"{p.name}={p.default!r}")
    return f"({', '.join(parts)})"


def _summary(fn: Any) -> str:
    """The first sentence of a helper's docstring, without reST markup ("" for a builtin)."""
    if fn.__module__ == "builtins":
        return ""
    first = (inspect.getdoc(fn) or "").split("\n\n")[0].replace("\n", " ").replace("``", "")
    return re.split(r"\.\s", first + " ")[0].rstrip(".")


def help_epilog() -> str:
    """The rule language, the helpers (signature and first docstring sentence, from the code),
    the packs and the exit codes: what ``--help`` prints after the options."""
    helpers = [f"  {name}{_signature(fn)}" + (f": {summary}" if (summary := _summary(fn)) else "")
               for name, fn in HELPERS.items()]
    packs = [f"  --pack {name}: {len(pack_rules(name, {}, {}))} rules" for name in sorted(PACKS)]
    return "\n".join([
        "rules: Python expressions over `data` (metric -> {step: value}), parsed and checked against a",
        "whitelist, never eval'd: literals, data[\"metric\"][\"step\"], + - * / // % **, comparisons,",
        "and/or/not, lists, and these helpers (range bounds are step numbers; negative counts back from the last):",
        *helpers,
        "",
        "packs (standard checks of a run's health; their bounds are the flags above):",
        *packs,
        "",
        "exit status: 0 every rule passed (WARN and SKIP allowed); 1 a rule failed or is VACUOUS (it passes",
        "on adversarial stand-ins too); 2 usage error (bad flags, no rules, a rule that does not parse or",
        "uses a forbidden construct, an unreadable metrics file, --report without matplotlib or into a",
        "directory that cannot be written).",
        "",
        "calibrate: check_metrics.py calibrate RUN... --rules FILE [--broken RUN...] recommends each rule's bound",
        "from healthy runs (calibrate --help).",
        "",
        "example: check_metrics.py logs/metrics.json --pack grpo --expect-steps 200 \\",
        "           'mean(data[\"train/reward_mean\"], -20) > mean(data[\"train/reward_mean\"], 1, 21)'",
        "docs/testing.md (\"Rules\") has the whole language, vacuity, packs and margins.",
    ])


def build_parser() -> argparse.ArgumentParser:
    """The CLI; pack bound flags come from ``packs.PACK_BOUNDS``."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Check rules against a run's metrics ({metric: {step: value}}).",
        epilog=help_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "inputs", nargs="*", metavar="[METRICS_JSON] RULE", help="the metrics file (unless --tb-dir), then rules"
    )
    parser.add_argument("--tb-dir", metavar="DIR", help="read a TensorBoard log directory instead of a JSON file")
    parser.add_argument("--pack", action="append", choices=sorted(PACKS), default=[], help="add a standard rule pack")
    parser.add_argument(
        "--expect-steps", type=_positive_int, metavar="N", help="fail every rule if the run stops before step N"
    )
    parser.add_argument("--no-vacuity-check", action="store_true", help="do not flag rules that cannot fail")
    parser.add_argument(
        "--min-margin",
        type=_fraction,
        default=0.0,
        metavar="F",
        help="WARN on a pass within F (0.05: 5%%) of its bound",
    )
    parser.add_argument("--output-json", "--json-report", metavar="PATH", help="write per-rule results as JSON")
    parser.add_argument("--github-summary", action="store_true", help="append a markdown table to $GITHUB_STEP_SUMMARY")
    parser.add_argument(
        "--report",
        metavar="DIR",
        help="write a plot per rule (PNG), summary.png and index.html into DIR (needs the report extra: matplotlib)",
    )
    for name, bound in PACK_BOUNDS.items():
        defaults = ", ".join(f"{pack} {value}" for pack, value in bound.defaults.items())
        parser.add_argument(bound.flag, dest=name, type=_finite_float, metavar="X", help=f"{bound.help} ({defaults})")
    return parser


def split_inputs(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """The metrics file (None with ``--tb-dir``) and the rule texts from the positional arguments.

    Raises:
        UsageError: no metrics source, both a file and ``--tb-dir``, or no rule and no pack.
    """
    inputs = list(args.inputs)
    if args.tb_dir:
        if inputs and (inputs[0].endswith(".json") or Path(inputs[0]).is_file()):
            raise UsageError(f"give a metrics file or --tb-dir, not both ({inputs[0]})")
        metrics_file, rules = None, inputs
    elif not inputs:
        raise UsageError("no metrics file given (or use --tb-dir)")
    else:
        metrics_file, rules = inputs[0], inputs[1:]
    if not rules and not args.pack:
        raise UsageError("no rules given (pass rules and/or --pack)")
    return metrics_file, rules


def load_data(args: argparse.Namespace, metrics_file: str | None) -> dict:
    """The metrics, from ``metrics_file`` or ``--tb-dir``.

    Raises:
        MetricsFileError: the source cannot be read or is malformed.
    """
    if metrics_file is None:
        return metric_rules.load_tb_dir(args.tb_dir)
    return metric_rules.load_metrics(metrics_file)


def write_outputs(args: argparse.Namespace, results: list[metric_rules.CheckResult]) -> None:
    """Print the table and summary; write ``--output-json`` and the GitHub summary.

    Raises:
        UsageError: an output file cannot be written.
    """
    width = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160
    console = Console(width=width)
    console.print(rule_report.build_table(results))
    console.print(rule_report.summary_line(results), highlight=False)
    targets = []
    if args.output_json:
        targets.append((Path(args.output_json), "w", json.dumps(rule_report.json_report(results), indent=2) + "\n"))
    summary_path = os.environ.get("GITHUB_STEP_SUMMARY")
    if args.github_summary and summary_path:
        summary = rule_report.markdown_summary(results)
        if args.report:  # a step summary shows no local file: say where the plots are
            summary += (f"\nPlots of each rule: `{Path(args.report) / check_report.PAGE}` and "
                        f"`{Path(args.report) / check_report.SUMMARY}` (in the job's artifacts).\n")
        targets.append((Path(summary_path), "a", summary))
    for path, mode, text in targets:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open(mode) as f:
                f.write(text)
        except OSError as e:
            raise UsageError(f"cannot write {path}: {e}") from None


def main(argv: list[str] | None = None) -> int:
    """Run the checks.

    Args:
        argv: command-line arguments (``sys.argv[1:]`` when None).

    Returns:
        0 when every rule passes (WARN/SKIP allowed), 1 when any fails or is vacuous,
        2 for a usage error (argparse exits 2 itself for bad flags).
    """
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["calibrate"]:  # the subcommand; a metrics file is never named plain `calibrate`
        from posttrain.testing import calibrate

        return calibrate.main(argv[1:])
    args = build_parser().parse_intermixed_args(argv)  # options may come after the rules
    try:
        if args.report:  # a missing extra is reported before any file is read
            check_report.require_plotting()
        metrics_file, texts = split_inputs(args)
        for text in texts:  # a bad rule is reported before any file is read
            metric_rules.compile_rule(text)
        data = load_data(args, metrics_file)
        overrides = {name: getattr(args, name) for name in PACK_BOUNDS}
        specs = [RuleSpec(t) for t in texts] + [s for p in args.pack for s in pack_rules(p, data, overrides)]
        options = CheckOptions(args.expect_steps, not args.no_vacuity_check, args.min_margin)
        results = run_checks(data, specs, options)
        write_outputs(args, results)
        if args.report:
            source = metrics_file or f"{args.tb_dir} (TensorBoard)"
            check_report.write_report(args.report, data, results, source)
    except (UsageError, metric_rules.RuleError, metric_rules.MetricsFileError, check_report.ReportError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
