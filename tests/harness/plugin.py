"""The harness's pytest hooks (thin: the decisions live in the sibling modules).

Registered from ``tests/conftest.py`` (``pytest_plugins``). Adds the ``tracker`` fixture,
``gpu(n)`` skips, the deselection report, ``--fail-on-nothing-ran``, the Ray leak check and
``unit_results.json``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from harness import coverage_ray, results
from harness.machine import count_gpus
from harness.ray_leaks import RayLeakCheck
from harness.selection import Selection
from harness.tracker import Tracker

METRICS = pytest.StashKey[dict[str, dict[str, Any]]]()
START = pytest.StashKey[datetime]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("posttrain harness")
    group.addoption("--fail-on-nothing-ran", action="store_true",
                    help="exit 5 when no test ran (none selected, or all skipped); run_unit.sh passes it")
    group.addoption("--no-unit-results", action="store_true", help="do not write unit_results.json")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[METRICS] = {}
    config.stash[START] = datetime.now(UTC)
    try:
        num_gpus = count_gpus()
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    config.pluginmanager.register(Selection(num_gpus, config.getoption("fail_on_nothing_ran")), "posttrain-selection")
    config.pluginmanager.register(RayLeakCheck(), "posttrain-ray-leaks")
    config.pluginmanager.register(UnitResults(config), "posttrain-unit-results")


@pytest.fixture
def tracker(request: pytest.FixtureRequest) -> Tracker:
    """Record named metrics of this test into unit_results.json (see ``harness.tracker``)."""
    return Tracker(request.node.nodeid, request.config.stash[METRICS])


@pytest.hookimpl(trylast=True)  # pytest-cov has started its coverage by then
def pytest_sessionstart(session: pytest.Session) -> None:
    cov_plugin = session.config.pluginmanager.getplugin("_cov")
    controller = getattr(cov_plugin, "cov_controller", None)
    if controller is not None and getattr(controller, "cov", None) is not None:
        coverage_ray.enable_for_ray_workers(controller.cov)


class UnitResults:
    """Collects ``_elapsed`` of every test and writes unit_results.json at the session's end."""

    def __init__(self, config: pytest.Config):
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            self.config.stash[METRICS].setdefault(report.nodeid, {})["_elapsed"] = round(report.duration, 4)

    @pytest.hookimpl(trylast=True)  # after pytest-cov computed its total and the exit status is final
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        config = self.config
        if config.getoption("no_unit_results") or config.getoption("collectonly") or hasattr(config, "workerinput"):
            return
        cov_plugin = config.pluginmanager.getplugin("_cov")
        coverage = getattr(cov_plugin, "cov_total", None) if cov_plugin is not None else None
        doc = results.build(session.exitstatus, config.stash[START], config.stash[METRICS], coverage,
                            config.rootpath)
        latest, _ = results.write(doc, results.results_dir(config.rootpath))
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"unit results: {latest}")
