"""Fixture tree for the run_unit.sh tests: one trivial test per marker combination.

Not collected by normal runs (files are ``case_*.py``); test_harness_run_unit.py runs it
with ``-o python_files=case_*.py``. Every test passes, so what ran is what was selected.
"""

import pytest


def test_plain():
    pass


@pytest.mark.slow
def test_slow():
    pass


@pytest.mark.hf_gated
def test_hf_gated():
    pass


@pytest.mark.mcore
def test_mcore():
    pass


@pytest.mark.mcore
@pytest.mark.hf_gated
def test_mcore_hf_gated():
    pass


@pytest.mark.vllm
def test_vllm():
    pass


@pytest.mark.nightly
def test_nightly():
    pass


@pytest.mark.gpu(1)
def test_gpu1():
    pass


@pytest.mark.gpu(2)
def test_gpu2():
    pass


@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    pass
