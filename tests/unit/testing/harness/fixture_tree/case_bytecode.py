"""run_unit.sh's bytecode setting as a test it runs sees it (test_harness_run_unit.py)."""

import os
import sys


def test_bytecode_is_written():
    assert not sys.dont_write_bytecode
    # Ray actors and subprocesses inherit the environment, not this process's flag
    assert "PYTHONDONTWRITEBYTECODE" not in os.environ
