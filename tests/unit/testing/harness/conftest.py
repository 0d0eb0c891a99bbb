"""Fixtures of the harness's own tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def harness_pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """``pytester`` for an inner session of the harness on a machine of its own: its unit_results.json
    under the inner tree's ``results/``, no GPU, and not under CI (whatever this session's $CI is, the
    inner one's skips and time budget are strict only where a test asks for it)."""
    monkeypatch.setenv("POSTTRAIN_UNIT_RESULTS_DIR", str(pytester.path / "results"))
    monkeypatch.setenv("POSTTRAIN_NUM_GPUS", "0")
    monkeypatch.delenv("CI", raising=False)
    return pytester
