"""posttrain's test and CI toolkit, usable by any training stack.

- :mod:`posttrain.testing.rules`: the metric rule engine (``max(data["train/grad_norm"]) < 10``
  over a run's ``{metric: {step: value}}``), with vacuity and completeness checks and packs;
- :mod:`posttrain.testing.check_metrics`: its command line, ``check-metrics``;
- :mod:`posttrain.testing.tb_to_json`: TensorBoard event files to that JSON, ``tb-to-json``;
- :mod:`posttrain.testing.calibrate`: rule bounds from healthy runs, ``check-metrics calibrate``;
- :mod:`posttrain.testing.results_trend`: a metric across archived unit-test runs,
  ``unit-results-trend``;
- :mod:`posttrain.testing.trend`: a functional script's metrics against its archived runs,
  ``functional-trend``;
- :mod:`posttrain.testing.git_bisect`: the first commit where a check or test fails
  (``git bisect run`` on the toolkit's verdicts), ``bisect-run`` and ``tools/bisect.sh``.

docs/testing.md ("Rules") documents the rule language.
"""
