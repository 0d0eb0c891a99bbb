"""Fixtures of the integration tier."""

from __future__ import annotations

import pytest
from in_process import InProcess


@pytest.fixture
def in_process() -> InProcess:
    """Training loops run in this process with every worker call recorded (``in_process.py``)."""
    return InProcess()
