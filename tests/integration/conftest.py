"""Fixtures of the integration tier."""

from __future__ import annotations

from pathlib import Path

import pytest
from in_process import InProcess


@pytest.fixture
def in_process() -> InProcess:
    """Training loops run in this process with every worker call recorded (``in_process.py``)."""
    return InProcess()


@pytest.fixture(scope="module")
def dp_recording(tmp_path_factory, tiny_model_path) -> Path:
    """A 2-step recording of the data-parallel job (``data_parallel_jobs.JOB``), every group's
    rewards rewritten to vary (``recorded_rollouts.py``); one per module that asks."""
    from data_parallel_jobs import JOB
    from recorded_rollouts import record_varied_rollouts

    return record_varied_rollouts(tmp_path_factory.mktemp("dp"), [f"model.path={tiny_model_path}", *JOB])
