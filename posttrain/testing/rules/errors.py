"""Errors of the metric rule engine, shared by its modules.

Usage errors (exit 2 in the CLI) are :class:`RuleError` and :class:`MetricsFileError`;
:class:`RuleEvalError` and its subclasses make one rule FAIL and let the others run.
"""

from __future__ import annotations


class RuleError(ValueError):
    """A rule that cannot run: bad syntax or a construct outside the whitelist."""


class MetricsFileError(ValueError):
    """A metrics source (JSON file, TensorBoard dir) that cannot be read or has a wrong shape."""


class RuleEvalError(Exception):
    """A rule that ran but cannot pass: missing metric/step, NaN/inf, bad math."""


class NonFiniteError(RuleEvalError):
    """A NaN or infinity was read (or computed); it never passes."""


class FinitenessCheckFailed(NonFiniteError):
    """``all_finite`` found a NaN/inf: the rule itself checked finiteness and said no.

    The vacuity check tells this apart from the engine's blanket NaN failure: only a rule
    that checks finiteness on purpose is credited with catching a NaN stand-in.
    """
