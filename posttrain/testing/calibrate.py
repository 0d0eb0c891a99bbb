"""Calibrate rule bounds from healthy runs: ``check-metrics calibrate RUN... --rules FILE``.

    check-metrics calibrate seed0/metrics.json seed1/metrics.json ... --rules tests/functional/grpo/check_report.json \\
        [--false-alarm-rate 0.01] [--broken collapsed/metrics.json ...] [--output-json calibration.json]

For each rule whose top level is one order comparison (``value < bound``, ``value >= bound``),
the *quantity* is the value side, evaluated by the rule engine on each run (the links that
:mod:`posttrain.testing.report.plot_spec` takes from the engine's own evaluation). A rule whose
bound reads the metrics too (``mean(r, -20) > mean(r, 1, 21)``) is calibrated on the difference
``value - bound`` against 0: the recommendation is then a margin to add to the right-hand side.

The recommended bound is the one-sided normal *prediction bound* for one more healthy run:

    upper (``<`` rules): mean + t(1 - alpha; n - 1) * s * sqrt(1 + 1/n)
    lower (``>`` rules): mean - t(1 - alpha; n - 1) * s * sqrt(1 + 1/n)

with n healthy runs, their mean and sample standard deviation s, and t the Student t quantile
(e.g. Hahn & Meeker, *Statistical Intervals*, 1991, ch. 4). If the quantity is normal across
seeds and machines and the runs are independent, a new healthy run falls beyond this bound with
probability exactly alpha (the false-alarm rate), the uncertainty of the mean and of s from only n
runs included: the t quantile and the sqrt(1 + 1/n) factor widen the bound at small n (for n = 5,
alpha = 0.01 the bound is 4.1 s from the mean where the normal quantile alone gives 2.3 s).

Why not an order statistic (the worst healthy run): it is distribution-free, but the worst of n runs
is a bound with false-alarm rate 1/(n + 1), so 1% needs 99 healthy runs; functional runs cost tens of
minutes each and are calibrated from 5 to 25. Why not a tolerance interval: it bounds the coverage
with a stated confidence (wider still); the prediction bound is what "a healthy run fails with
probability alpha" asks for. Its assumption, normality, is weakest for quantities with a hard edge
(a clip fraction near 0, an error at float rounding): the report shows min/median/max beside the
bound so that a skewed distribution can be seen, and a quantity with no spread (every run gave the
same value) gets no recommendation. For a positive, right-skewed quantity (a max over a run's steps,
which one spike sets) ``--log-scale`` takes its logarithm as the normal one: the bound is
``exp(mean(log v) +- k * std(log v))`` with the same k (a log-normal prediction bound).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from posttrain.testing.report.plot_spec import named_metrics, plot_spec
from posttrain.testing.rules import comparisons
from posttrain.testing.rules.checker import normalize
from posttrain.testing.rules.compiler import compile_rule
from posttrain.testing.rules.errors import MetricsFileError, RuleError
from posttrain.testing.rules.interpreter import evaluate, evaluate_rule, load_metrics
from posttrain.testing.rules.packs import PACKS, pack_rules

PROG = "check-metrics calibrate"


class UsageError(Exception):
    """Bad input: exit 2 with one line naming it."""


# --------------------------------------------------------------------------- the statistics


def student_t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` (integer >= 1) degrees of freedom.

    The closed forms for integer ``df`` (Abramowitz & Stegun 26.7.3 / 26.7.4), with
    theta = atan(t / sqrt(df)): a finite series in cos(theta), exact to float rounding.

    Raises:
        ValueError: ``df`` < 1.
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd: A = (2/pi) [theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...)]
        term, total = 1.0, 0.0
        if df > 1:
            total = 1.0
            for j in range(1, (df - 3) // 2 + 1):
                term *= c2 * (2 * j) / (2 * j + 1)
                total += term
        inside = (2 / math.pi) * (theta + math.sin(theta) * math.cos(theta) * total) if df > 1 else 2 * theta / math.pi
    else:  # even: A = sin [1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...]
        term, total = 1.0, 1.0
        for j in range(1, (df - 2) // 2 + 1):
            term *= c2 * (2 * j - 1) / (2 * j)
            total += term
        inside = math.sin(theta) * total
    return 0.5 + inside / 2 if t >= 0 else 0.5 - inside / 2


def student_t_quantile(p: float, df: int) -> float:
    """The t with P(T <= t) = p (0 < p < 1), by bisection on :func:`student_t_cdf`.

    Raises:
        ValueError: ``p`` outside (0, 1) or ``df`` < 1.
    """
    if not 0 < p < 1:
        raise ValueError(f"probability must be in (0, 1), got {p}")
    if p < 0.5:
        return -student_t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, df) < p:  # df = 1, p = 0.999: t = 318
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if student_t_cdf(mid, df) < p else (lo, mid)
        if hi - lo <= 1e-12 * hi:
            break
    return (lo + hi) / 2


def prediction_factor(n: int, false_alarm_rate: float) -> float:
    """k in mean +- k * s: ``t(1 - alpha; n - 1) * sqrt(1 + 1/n)`` (the module docstring).

    Raises:
        ValueError: n < 2 or the rate outside (0, 1).
    """
    if n < 2:
        raise ValueError(f"a prediction bound needs at least 2 runs, got {n}")
    return student_t_quantile(1 - false_alarm_rate, n - 1) * math.sqrt(1 + 1 / n)


def prediction_bound(values: Sequence[float], false_alarm_rate: float, upper: bool,
                     log_scale: bool = False) -> float | None:
    """The one-sided normal prediction bound of ``values`` (None when they have no spread).

    ``upper``: mean + k s (for a rule ``value < bound``), else mean - k s. ``log_scale``: of the
    values' logarithms, returned as ``exp(mean(log v) +- k s(log v))`` (a log-normal quantity).

    Raises:
        ValueError: fewer than 2 values, the rate outside (0, 1), or with ``log_scale`` a value <= 0.
    """
    k = prediction_factor(len(values), false_alarm_rate)
    if log_scale:
        if min(values) <= 0:
            raise ValueError(f"a log-scale bound needs values > 0, got {min(values):.6g}")
        values = [math.log(v) for v in values]
    spread = statistics.stdev(values)
    if spread == 0:
        return None
    centre = statistics.fmean(values)
    bound = centre + k * spread if upper else centre - k * spread
    return math.exp(bound) if log_scale else bound


# --------------------------------------------------------------------------- a rule's quantity


@dataclass(frozen=True)
class Quantity:
    """What a calibratable rule compares: ``value_text op bound_text``, value side on the left.

    ``difference``: the bound reads the metrics too, so the quantity is ``value - bound``
    compared with 0 (``bound`` then holds the current bound of the difference, 0).
    """

    value_text: str
    op: str
    bound_text: str
    difference: bool
    bound: float | None


def quantity_of(rule: str) -> Quantity | str:
    """The rule's quantity, or why it has none (a reason to list it as not calibratable).

    Raises:
        RuleError: the rule does not compile.
    """
    tree = compile_rule(rule)
    body = tree.body
    if not isinstance(body, ast.Compare):
        return "not a comparison (a boolean check such as all_finite passes or fails; no bound to move)"
    if len(body.ops) != 1:
        return "a chain of comparisons: write each side as its own rule to calibrate it"
    written = comparisons.of_node(body.ops[0])
    if not written.is_order:
        return f"`{written.symbol}` compares no value with a bound"
    left, right = body.left, body.comparators[0]
    left_reads = bool(named_metrics(ast.Expression(body=left)))
    right_reads = bool(named_metrics(ast.Expression(body=right)))
    if not (left_reads or right_reads):
        return "reads no metric"
    bound_on_left = right_reads and not left_reads
    value_node, bound_node = (right, left) if bound_on_left else (left, right)
    op = comparisons.seen_from_the_value(written, bound_on_left).symbol
    difference = left_reads and right_reads
    bound: float | None = 0.0
    if not difference:
        constant = evaluate({}, ast.Expression(body=bound_node)).value  # the bound, computed by the engine
        bound = float(constant) if isinstance(constant, (int, float)) and math.isfinite(constant) else None
    return Quantity(ast.unparse(value_node), op, ast.unparse(bound_node), difference, bound)


def measure(rule: str, quantity: Quantity, data: Mapping[str, Any]) -> tuple[float | None, str]:
    """The rule's quantity on one run (value, or value - bound), and why it is None.

    The value and bound are the engine's (the Comparison that :func:`plot_spec` takes from
    ``evaluate`` on the same data): a NaN or a missing metric gives None and the engine's message.
    """
    result = evaluate_rule(data, rule)
    comparisons = plot_spec(1, result, data).comparisons
    if not comparisons or not comparisons[0].numeric:
        return None, result.message or "not computed"
    link = comparisons[0]
    return (float(link.value) - float(link.bound) if quantity.difference else float(link.value)), ""


# --------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class Distribution:
    """n, min, median, max, mean and sample standard deviation of the healthy runs' quantity."""

    n: int
    min: float  # noqa: A003 -- the field's standard name in a summary
    median: float
    max: float  # noqa: A003
    mean: float
    std: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        """The summary of ``values`` (at least 2)."""
        return cls(len(values), min(values), statistics.median(values), max(values),
                   statistics.fmean(values), statistics.stdev(values))


@dataclass
class Calibration:
    """One rule's calibration; ``reason`` is set (and the rest empty) when it cannot be calibrated."""

    rule: str
    reason: str = ""
    quantity: str = ""
    op: str = ""
    current_bound: float | None = None
    distribution: Distribution | None = None
    recommended_bound: float | None = None
    k: float | None = None
    log_scale: bool = False
    values: dict[str, float | None] = field(default_factory=dict)
    not_computed: dict[str, str] = field(default_factory=dict)
    current_false_alarms: list[str] = field(default_factory=list)
    broken: list[dict[str, Any]] = field(default_factory=list)


def calibrate_rule(rule: str, healthy: Mapping[str, Mapping[str, Any]], broken: Mapping[str, Mapping[str, Any]],
                   false_alarm_rate: float, log_scale: bool = False) -> Calibration:
    """Calibrate one rule on the healthy runs and test the recommended bound on the broken ones.

    Args:
        rule: the rule's text.
        healthy / broken: run name -> its normalized metrics.
        false_alarm_rate: alpha, the chance a healthy run fails the recommended bound.
        log_scale: take the quantity's logarithm as the normal one (a positive, right-skewed
            quantity such as a max over steps); a rule whose healthy values are not all > 0 is
            then not calibrated, with why.

    Returns:
        The Calibration (``reason`` set when the rule has no quantity or fewer than 2 healthy
        runs computed it). A broken run whose quantity cannot be computed (NaN, missing metric)
        fails the rule whatever its bound: it counts as caught.

    Raises:
        RuleError: the rule does not compile.
    """
    quantity = quantity_of(rule)
    if isinstance(quantity, str):
        return Calibration(rule, reason=quantity)
    op = comparisons.of(quantity.op)  # the checker's own reading of the operator
    shown = f"{quantity.value_text} - ({quantity.bound_text})" if quantity.difference else quantity.value_text
    cal = Calibration(rule, quantity=shown, op=quantity.op, current_bound=quantity.bound)
    for name, data in healthy.items():
        cal.values[name], why = measure(rule, quantity, data)
        if why:
            cal.not_computed[name] = why
    values = [v for v in cal.values.values() if v is not None]
    if len(values) < 2:
        cal.reason = f"computed on {len(values)} healthy run(s); 2 or more are needed"
        return cal
    if log_scale and min(values) <= 0:
        cal.reason = f"log scale needs every healthy value > 0, got {min(values):.6g}"
        return cal
    cal.distribution = Distribution.of(values)
    upper = op.fails == "above"
    cal.k, cal.log_scale = prediction_factor(len(values), false_alarm_rate), log_scale
    cal.recommended_bound = prediction_bound(values, false_alarm_rate, upper, log_scale)
    if cal.recommended_bound is None:
        cal.reason = f"no spread: every healthy run gave {values[0]:.6g}"
    # the spread that margins are counted in: of the values, or of their logs
    spread = statistics.stdev([math.log(v) for v in values]) if log_scale else cal.distribution.std
    if quantity.bound is not None:
        cal.current_false_alarms = [n for n, v in cal.values.items() if v is not None
                                    and not op.holds(v, quantity.bound)]
    for name, data in broken.items():
        value, why = measure(rule, quantity, data)
        row: dict[str, Any] = {"run": name, "value": value}
        if value is None:
            row |= {"fails_recommended": True, "margin": None, "why": why}
        elif cal.recommended_bound is not None:
            # signed distance past the bound in the rule's failing direction: > 0 caught
            past = -op.slack(value, cal.recommended_bound)
            if log_scale:  # in log units; a value <= 0 is below any log-scale bound, by no finite count
                past_log = (-op.slack(math.log(value), math.log(cal.recommended_bound))
                            if value > 0 else (-math.inf if upper else math.inf))
            row |= {"fails_recommended": not op.holds(value, cal.recommended_bound), "margin": past,
                    "margin_in_std": (past_log if log_scale else past) / spread}
        cal.broken.append(row)
    return cal


# --------------------------------------------------------------------------- input and output


def read_rules(path: str) -> list[str]:
    """Rules from a file: one per line (``#`` comments, blank lines skipped), or a
    ``check_report.json`` (``--output-json`` of check-metrics: a functional script's own
    rules, its shell variables already expanded).

    Raises:
        UsageError: the file cannot be read, is a JSON file without rules, or a rule does not parse.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read rules file {path}: {e}") from None
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
            rules = [row["rule"] for row in rows]
        except (json.JSONDecodeError, TypeError, KeyError) as e:
            raise UsageError(f"{path}: not a check_report.json (a list of rows with 'rule'): {e}") from None
    else:
        rules = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    for rule in rules:
        try:
            compile_rule(rule)
        except RuleError as e:
            raise UsageError(f"{path}: {e}") from None
    return rules


def load_runs(paths: Sequence[str]) -> dict[str, dict[str, Any]]:
    """path -> normalized metrics of each run.

    Raises:
        UsageError: a file cannot be read or is malformed (names it).
    """
    runs: dict[str, dict[str, Any]] = {}
    for path in paths:
        try:
            runs[path] = normalize(load_metrics(path))
        except (MetricsFileError, TypeError, ValueError) as e:
            raise UsageError(f"metrics file {path}: {e}") from None
    return runs


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.6g}"


def render(cal: Calibration, false_alarm_rate: float) -> str:
    """The text block of one rule."""
    lines = [f"rule: {cal.rule}"]
    if cal.distribution is None:
        return "\n".join([*lines, f"  not calibrated: {cal.reason}"])
    d = cal.distribution
    side = "upper" if comparisons.of(cal.op).fails == "above" else "lower"
    lines += [f"  quantity: {cal.quantity} {cal.op} bound",
              f"  healthy runs: n={d.n} min={_g(d.min)} median={_g(d.median)} max={_g(d.max)} mean={_g(d.mean)} "
              f"std={_g(d.std)}"]
    lines += [f"  not computed on {run}: {why}" for run, why in cal.not_computed.items()]
    if cal.recommended_bound is None:
        lines.append(f"  recommended bound: none ({cal.reason})")
    else:
        sign = "+" if side == "upper" else "-"
        form = (f"exp(mean(log) {sign} {cal.k:.3f} * std(log))" if cal.log_scale
                else f"mean {sign} {cal.k:.3f} * std")
        lines.append(f"  recommended {side} bound at false-alarm rate {false_alarm_rate:g}: "
                     f"{_g(cal.recommended_bound)} ({form})")
    if cal.current_bound is None:
        lines.append("  current bound: not a number (not checked)")
    else:
        alarms = ", ".join(cal.current_false_alarms) if cal.current_false_alarms else "none"
        lines.append(f"  current bound {_g(cal.current_bound)}: healthy runs that fail it: {alarms}")
    for row in cal.broken:
        if row["value"] is None:
            lines.append(f"  broken {row['run']}: not computed ({row['why']}): fails any bound")
        elif "fails_recommended" in row:
            verdict = "FAILS (caught)" if row["fails_recommended"] else "passes (NOT caught)"
            unit = "std of the log" if cal.log_scale else "std"
            lines.append(f"  broken {row['run']}: {_g(row['value'])} {verdict} the recommended bound; beyond it by "
                         f"{row['margin']:+.6g} ({row['margin_in_std']:+.2f} {unit})")
        else:
            lines.append(f"  broken {row['run']}: {_g(row['value'])} (no recommended bound to test)")
    return "\n".join(lines)


def _rate(text: str) -> float:
    value = float(text)
    if not 0 < value < 0.5:
        raise argparse.ArgumentTypeError(f"must be in (0, 0.5), got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``check-metrics calibrate`` CLI."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     epilog="Method: see the module docstring of posttrain/testing/calibrate.py and "
                                            "docs/testing.md (\"Calibrating bounds\").")
    parser.add_argument("runs", nargs="+", metavar="RUN", help="metrics.json of a healthy run (2 or more)")
    parser.add_argument("--rules", metavar="FILE", help="one rule per line (# comments), or a check_report.json")
    parser.add_argument("--rule", action="append", default=[], metavar="RULE", help="a rule (repeatable)")
    parser.add_argument("--pack", action="append", choices=sorted(PACKS), default=[], help="add a rule pack")
    parser.add_argument("--false-alarm-rate", type=_rate, default=0.01, metavar="ALPHA",
                        help="chance a healthy run fails the recommended bound (default %(default)s)")
    parser.add_argument("--broken", nargs="+", action="extend", default=[], metavar="RUN",
                        help="metrics.json of a run the rules must fail")
    parser.add_argument("--log-scale", action="store_true",
                        help="take each quantity's logarithm as normal (positive, right-skewed quantities such as a "
                             "max over steps); the bound is exp(mean(log) +- k * std(log))")
    parser.add_argument("--output-json", metavar="PATH", help="write the calibration as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Calibrate the rules; 0 done, 2 usage error (fewer than 2 runs, unreadable file, a bad rule).

    The verdicts (current bounds that false-alarm, broken runs not caught) are printed, not an
    exit status: calibration informs a choice of bounds, it judges no run.
    """
    args = build_parser().parse_args(argv)
    try:
        if len(args.runs) < 2:
            raise UsageError(f"give 2 or more healthy runs, got {len(args.runs)} ({args.runs[0]})")
        rules = read_rules(args.rules) if args.rules else []
        for rule in args.rule:
            try:
                compile_rule(rule)
            except RuleError as e:
                raise UsageError(str(e)) from None
            rules.append(rule)
        if not rules and not args.pack:  # before any metrics file is read
            raise UsageError("no rules given (--rules FILE, --rule or --pack)")
        healthy, broken = load_runs(args.runs), load_runs(args.broken)
        first = next(iter(healthy.values()))  # an optional pack check is calibrated where the first run logs it
        rules += [spec.text for pack in args.pack for spec in pack_rules(pack, first, {}) if not spec.skip_reason]
        calibrations = [calibrate_rule(rule, healthy, broken, args.false_alarm_rate, args.log_scale)
                        for rule in dict.fromkeys(rules)]
        print("\n\n".join(render(c, args.false_alarm_rate) for c in calibrations))
        if args.output_json:
            doc = {"false_alarm_rate": args.false_alarm_rate, "method": "normal prediction bound: mean +- "
                   "t(1 - alpha; n - 1) * std * sqrt(1 + 1/n)" + (", of the logs, exponentiated" if args.log_scale
                                                                  else ""), "healthy_runs": list(healthy),
                   "broken_runs": list(broken), "rules": [asdict(c) for c in calibrations]}
            try:
                Path(args.output_json).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
            except OSError as e:
                raise UsageError(f"cannot write {args.output_json}: {e}") from None
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
