"""Fixtures of the toolkit's tests (the rule engine, the CLIs, the harness)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Metric Checks table takes the width the CLI chooses for a non-terminal (160 columns),
    whatever ``COLUMNS`` the runner exports: pytest-xdist workers get 80, which wraps a rule's text
    over several lines of a cell. A test that sets ``COLUMNS`` itself still gets its own value."""
    monkeypatch.delenv("COLUMNS", raising=False)
