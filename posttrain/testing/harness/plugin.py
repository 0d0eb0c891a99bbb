"""The harness's pytest hooks (thin: the decisions live in the sibling modules).

Loaded by pytest through the ``pytest11`` entry point ``posttrain``; inert unless the ini
sets ``posttrain_harness = true``. Then it adds ``gpu(n)`` skips, the deselection report,
``--fail-on-nothing-ran``, the skip accounting, the time budget of one test, the Ray leak check
and ``unit_results.json``; the ``tracker``
fixture records per-test metrics into that file; ``repeat_index`` is the ``run_unit.sh --repeat``
run a session is (a test derives its seeds from it); ``ray_nodes`` starts a multi-node Ray cluster
on this machine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from posttrain.testing.harness import budget, coverage_ray, parallel, repeat, results, shards, skips
from posttrain.testing.harness.configurations import TABLE_PATH, PlanError, load_table
from posttrain.testing.harness.machine import count_gpus, on_ci
from posttrain.testing.harness.ray_leaks import RayLeakCheck
from posttrain.testing.harness.ray_nodes import LocalRayCluster, start_cluster
from posttrain.testing.harness.remote_testmon import RemoteTestmon, add_remote_testmon_options, testmon_asked
from posttrain.testing.harness.selection import Selection
from posttrain.testing.harness.tracker import Tracker

METRICS = pytest.StashKey[dict[str, dict[str, Any]]]()
START = pytest.StashKey[datetime]()
GPU_MARKER = "gpu(n): needs n GPUs; skipped with the reason 'needs n GPUs, found m' when fewer are present"
SHIPPED_METRICS = "posttrain_metrics"  # xdist: a test's tracker metrics, on its teardown report to the controller


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("posttrain_harness", type="bool", default=False,
                  help="turn on posttrain's test harness (gpu(n) skips, Ray leak check, unit_results.json)")
    parser.addini("posttrain_configurations", default=str(TABLE_PATH),
                  help="run_unit.sh's configuration table, relative to the rootdir (for the deselection report)")
    parser.addini(budget.BUDGET_INI, default="0",
                  help="seconds one test's call may take unless it is marked slow(reason=...); 0: no budget")
    group = parser.getgroup("posttrain harness")
    group.addoption("--fail-on-nothing-ran", action="store_true",
                    help="exit 5 when no test ran (none selected, or all skipped); run_unit.sh passes it")
    group.addoption("--strict-skips", action="store_true",
                    help="fail the run on a skip whose reason the configuration table's [[skip]] rows do not declare, "
                         "or declare for other machines (on by default where $CI is true and the table declares skips)")
    group.addoption("--strict-budget", action="store_true",
                    help="fail the run on a test over the time budget (posttrain_time_budget_s) that is not marked "
                         "slow(reason=...) (on by default where $CI is true)")
    group.addoption("--durations-report", action="store_true",
                    help="print the tests marked slow with their call times and reasons, slowest first")
    group.addoption("--no-unit-results", action="store_true", help="do not write unit_results.json")
    group.addoption("--shard", metavar="I/N", default=None,
                    help="run only the I-th of N deterministic parts of the selected tests, balanced by recorded "
                         "durations; a module's tests stay together")
    group.addoption("--shard-durations", metavar="PATH", default=None,
                    help="durations for --shard: unit_results.json or {nodeid: seconds} JSON (default: "
                         "tests/durations.json, else the current unit_results.json)")
    add_remote_testmon_options(parser)


def enabled(config: pytest.Config) -> bool:
    """Whether the project turned the harness on (``posttrain_harness = true``)."""
    return bool(config.getini("posttrain_harness"))


def pytest_configure(config: pytest.Config) -> None:
    if not enabled(config):
        return
    config.addinivalue_line("markers", GPU_MARKER)
    config.stash[METRICS] = {}
    config.stash[START] = datetime.now(UTC)
    try:
        num_gpus = count_gpus()
        repeat.repeat_index()  # a bad $POSTTRAIN_REPEAT_INDEX: one usage error, not one per test
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    table = config.rootpath / Path(config.getini("posttrain_configurations"))
    role = parallel.role(config)  # -n (pytest-xdist): tests run in workers, the controller reports
    config.pluginmanager.register(Selection(num_gpus, config.getoption("fail_on_nothing_ran"), table, role),
                                  "posttrain-selection")
    config.pluginmanager.register(_skip_accounting(config, table, num_gpus, role), "posttrain-skips")
    config.pluginmanager.register(_time_budget(config), "posttrain-time-budget")
    config.pluginmanager.register(RayLeakCheck(), "posttrain-ray-leaks")
    config.pluginmanager.register(UnitResults(config), "posttrain-unit-results")
    if role == "worker":
        config.pluginmanager.register(parallel.WorkerThreads(parallel.limit_worker_threads(config)),
                                      "posttrain-xdist-threads")
        config.pluginmanager.register(parallel.WorkerSchedule(config, shards.durations_from_options(config)),
                                      "posttrain-xdist-worker")
    elif role == "controller":
        shards.durations_from_options(config)  # a bad durations file: one usage error here, not in every worker
        parallel.share_ray_auth_token()  # workers start their Ray clusters at once: no race on ~/.ray/auth_token
        config.pluginmanager.register(parallel.ControllerReport(), "posttrain-xdist-controller")
    if config.getoption("shard") is not None:
        config.pluginmanager.register(shards.Sharding.from_options(config), "posttrain-shards")
    if testmon_asked(config):  # re-selects what testmon cannot see run: code inside Ray actors
        config.pluginmanager.register(RemoteTestmon(config), "posttrain-remote-testmon")


def _skip_accounting(config: pytest.Config, table: Path, num_gpus: int,
                     role: parallel.Role) -> skips.SkipAccounting:
    """The skip accounting of this session: the table's ``[[skip]]`` rows (none without a table);
    under xdist the controller accounts for every worker's skips.

    Raises:
        pytest.UsageError: the table exists but cannot be read (names the problem).
    """
    try:
        rules = load_table(table).skips if table.exists() else ()
    except PlanError as e:
        raise pytest.UsageError(str(e)) from None
    return skips.SkipAccounting(rules, skips.machine_from(config, num_gpus, rules), active=role != "worker")


def _time_budget(config: pytest.Config) -> budget.TimeBudget:
    """The time budget of this session (``posttrain_time_budget_s``; a budget of 0 judges nothing),
    strict with ``--strict-budget`` or under CI; the ``slow(reason)`` marker registered unless the
    project declares ``slow`` itself.

    Raises:
        pytest.UsageError: the ini's budget is not a number >= 0.
    """
    budget_s = budget.parse_budget(str(config.getini(budget.BUDGET_INI)))
    if not budget.declares_slow(config.getini("markers")):
        config.addinivalue_line("markers", budget.SLOW_MARKER_HELP)
    strict = bool(config.getoption("strict_budget")) or on_ci(os.environ)
    return budget.TimeBudget(budget_s, strict, bool(config.getoption("durations_report")))


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # xdist's own hook is a plain one: the plugin order would decide
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker per CPU this process may run on (its affinity mask: ``taskset``, a
    container's cpuset), where xdist counts the machine's physical cores (with psutil): a 32-core
    host limited to 16 CPUs started 32 workers, each with its Ray cluster, and the tier ran past
    10 minutes. ``$PYTEST_XDIST_AUTO_NUM_WORKERS`` and ``-n logical`` keep xdist's meaning (None:
    xdist's own hook decides). A CPU quota without an affinity mask (``docker --cpus``) is not seen.
    """
    if not enabled(config) or os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") \
            or getattr(config.option, "numprocesses", None) == "logical":
        return None
    return parallel.available_cpus()


@pytest.fixture
def tracker(request: pytest.FixtureRequest) -> Tracker:
    """Record named metrics of this test into unit_results.json (see ``posttrain.testing.harness.tracker``).

    Raises:
        pytest.UsageError: the harness is off (``posttrain_harness`` not set in the ini).
    """
    if METRICS not in request.config.stash:
        raise pytest.UsageError("the tracker fixture needs posttrain's harness: set posttrain_harness = true "
                                "in the pytest ini")
    return Tracker(request.node.nodeid, request.config.stash[METRICS])


@pytest.fixture(scope="module")
def ray_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LocalRayCluster]]:
    """Start a real multi-node Ray cluster on this machine: ``cluster = ray_nodes(nodes=2, num_cpus=1)``.

    Each node is its own ``ray start`` (raylet, object store, a ``posttrain_node_<i>`` resource;
    ``posttrain.testing.harness.ray_nodes``); the same arguments within a module return the same
    cluster, and every cluster the module started is stopped at its end, by its processes' own
    pids (never ``ray stop``: other clusters on the machine are left alone). Join it from a
    subprocess with ``env=cluster.client_env()`` (its address and its own auth token): the test
    process keeps whatever Ray it already has.

    Raises:
        RuntimeError: a node did not start or join (its log is named).
    """
    started: dict[tuple[int, int, int], LocalRayCluster] = {}

    def start(nodes: int = 2, num_cpus: int = 1, object_store_mb: int = 256) -> LocalRayCluster:
        key = (nodes, num_cpus, object_store_mb)
        if key not in started:
            state = tmp_path_factory.mktemp(f"ray_nodes{nodes}")
            started[key] = start_cluster(nodes, state, num_cpus=num_cpus, object_store_mb=object_store_mb)
        return started[key]

    yield start
    for cluster in started.values():
        cluster.stop()


@pytest.fixture(scope="session")
def repeat_index() -> int:
    """Which repetition of ``run_unit.sh --repeat N`` this session is: 0..N-1 (0 outside
    ``--repeat``). A test whose outcome depends on its seeds derives them from it
    (``seed = base_seed + repeat_index``), so N repetitions sample N seeds instead of one.

    Raises:
        pytest.UsageError: ``$POSTTRAIN_REPEAT_INDEX`` is not a non-negative integer.
    """
    try:
        return repeat.repeat_index()
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


@pytest.hookimpl(trylast=True)  # pytest-cov has started its coverage by then
def pytest_sessionstart(session: pytest.Session) -> None:
    if not enabled(session.config) or parallel.role(session.config) == "controller":  # workers run the tests
        return
    cov_plugin = session.config.pluginmanager.getplugin("_cov")
    controller = getattr(cov_plugin, "cov_controller", None)
    if controller is not None and getattr(controller, "cov", None) is not None:
        coverage_ray.enable_for_ray_workers(controller.cov)


class UnitResults:
    """Collects ``_elapsed`` and ``_total`` of every test whose call ran (a test skipped or failed at set-up
    has neither) and writes unit_results.json at the session's end."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.set_up_s: dict[str, float] = {}  # a set-up's seconds, until its test's call (if any) reports

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        metrics = self.config.stash[METRICS]
        # _total: the test's whole time, its fixtures' set-up and teardown included (what a shard or a tier pays)
        if report.when == "setup":
            self.set_up_s[report.nodeid] = report.duration
        elif report.when == "call":
            entry = metrics.setdefault(report.nodeid, {})
            entry[results.ELAPSED] = round(report.duration, 4)
            entry[results.TOTAL] = round(self.set_up_s.pop(report.nodeid, 0.0) + report.duration, 4)
        elif results.TOTAL in metrics.get(report.nodeid, {}):  # the teardown of a test whose call ran
            metrics[report.nodeid][results.TOTAL] = round(metrics[report.nodeid][results.TOTAL] + report.duration, 4)
        shipped = getattr(report, SHIPPED_METRICS, None)  # the tracker's metrics, from an xdist worker
        if shipped:
            metrics.setdefault(report.nodeid, {}).update(shipped)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):
        report = yield
        if call.when == "teardown" and parallel.role(self.config) == "worker":  # after every fixture's teardown
            named = {k: v for k, v in self.config.stash[METRICS].get(item.nodeid, {}).items()
                     if k not in results.TIMES}  # the controller times each test from the reports themselves
            if named:
                setattr(report, SHIPPED_METRICS, named)
        return report

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
