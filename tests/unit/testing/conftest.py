"""Fixtures of the toolkit's tests (the rule engine, the CLIs, the harness)."""

from __future__ import annotations

import pytest
from hypothesis import settings

# Property tests (hypothesis): the same examples on every run and machine (derandomize: each test's
# seed is a hash of its name), nothing stored in .hypothesis/ (an untracked folder would mark the
# checkout -dirty in unit_results.json), no deadline per example (a loaded 2-core machine is slow,
# not wrong). A test sets its own ``max_examples`` to stay within seconds.
settings.register_profile("posttrain", derandomize=True, database=None, deadline=None, print_blob=True)
settings.load_profile("posttrain")


@pytest.fixture(autouse=True)
def no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Metric Checks table takes the width the CLI chooses for a non-terminal (160 columns),
    whatever ``COLUMNS`` the runner exports: pytest-xdist workers get 80, which wraps a rule's text
    over several lines of a cell. A test that sets ``COLUMNS`` itself still gets its own value."""
    monkeypatch.delenv("COLUMNS", raising=False)
