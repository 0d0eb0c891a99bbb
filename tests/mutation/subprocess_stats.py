"""A pytest plugin of the mutation tooling, loaded only by mutmut (``[tool.mutmut]``'s
``pytest_add_cli_args``: ``-p tests.mutation.subprocess_stats``), never by the test tiers.

Much of the pytest harness runs in processes a test starts: ``runpytest_subprocess`` runs, xdist
workers, ``--testmon`` runs, ``ray start`` nodes. mutmut sees neither side of that by itself:

* its stats run (which tests call which function) records calls in the process that makes them, so
  a function called only in a subprocess had "no tests" and its mutants were never run;
* a subprocess imported posttrain from the checkout (the editable install), not from ``mutants/``,
  so a mutant was not active there even though the subprocess inherits ``MUTANT_UNDER_TEST``.

This plugin puts ``mutants/`` and ``subprocess_site/`` (its ``sitecustomize`` writes each
subprocess's calls to a folder) first on the ``PYTHONPATH`` every subprocess inherits, and adds the
calls found there to the running test's before mutmut's stats collector files them under the test.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

SITE = Path(__file__).resolve().with_name("subprocess_site")
HITS_VARIABLE = "MUTMUT_SUBPROCESS_HITS"


def pytest_configure(config: pytest.Config) -> None:
    import posttrain

    # mutmut runs pytest in mutants/, the folder its mutated posttrain is imported from
    mutants = Path(posttrain.__file__).resolve().parents[1]
    hits = tempfile.mkdtemp(prefix="mutmut_subprocess_hits_")
    config.stash[_HITS_KEY] = hits
    # mutmut's forkserver configures pytest once to warm up, then once a mutant: added once
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    first = [str(SITE), str(mutants)]
    os.environ["PYTHONPATH"] = os.pathsep.join(first + [p for p in paths if p and p not in first])
    os.environ[HITS_VARIABLE] = hits


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(config.stash.get(_HITS_KEY, ""), ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    # tryfirst: before mutmut's StatsCollector, which files the hits collected so far under this test
    if os.environ.get("MUTANT_UNDER_TEST") != "stats":
        return
    from mutmut.state import state

    hits = Path(item.config.stash[_HITS_KEY])
    for written in hits.glob("*.txt"):
        # renamed first: a process still running (a Ray node of a module fixture) appends to a new file
        taken = written.with_suffix(".taken")
        written.rename(taken)
        state()._stats.update(line for line in taken.read_text(encoding="utf-8").splitlines() if line)
        taken.unlink()


_HITS_KEY = pytest.StashKey[str]()
