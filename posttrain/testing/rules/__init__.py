"""The metric rule engine: rules such as ``mean(data["train/reward_mean"], -20) > 0.5`` are
parsed against a whitelist (:mod:`.compiler`, never ``eval``), interpreted (:mod:`.interpreter`,
helpers in :mod:`.helpers`), and judged for vacuity (:mod:`.vacuity`), run completeness
(:mod:`.completeness`) and margins (:mod:`.margins`); :mod:`.checker` turns that into a status
per rule and :mod:`.report` prints it.

    from posttrain.testing.rules import check_rules, load_metrics
    results = check_rules(load_metrics("logs/metrics.json"), ['min(data["train/grad_norm"]) > 0'])

``check_rules`` judges as the ``check-metrics`` command does (vacuity, ``expect_steps``,
``min_margin``); ``evaluate_rules`` is the rules' truth alone.
"""

from posttrain.testing.rules.checker import check_rules
from posttrain.testing.rules.errors import MetricsFileError, RuleError, RuleEvalError
from posttrain.testing.rules.interpreter import CheckResult, compile_rule, evaluate_rule, evaluate_rules
from posttrain.testing.rules.loading import load_metrics, load_tb_dir

__all__ = ["CheckResult", "MetricsFileError", "RuleError", "RuleEvalError", "check_rules", "compile_rule",
           "evaluate_rule", "evaluate_rules", "load_metrics", "load_tb_dir"]
