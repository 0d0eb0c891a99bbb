"""pytest-xdist (``-n N``): what differs in a worker and in the controller.

Under xdist the controller process collects nothing and runs nothing: each worker collects
every test, runs the ones the scheduler hands it, and sends its reports back. The harness's
plugins therefore work in the worker where the tests run (gpu(n) skips, Ray leak check,
``--shard``, testmon's selection) and hand the rest to the controller, which prints and
writes what a serial run would:

- a test's tracker metrics ride on its teardown report (attribute ``posttrain_metrics``;
  pytest serializes a report's extra attributes for xdist), so the controller's
  unit_results.json holds every test's metrics;
- what a worker learns only at collection (the ``shard I/N`` line, the deselection report,
  the remote-aware testmon line and the state it records) goes into xdist's ``workeroutput``
  (:func:`ship`), read by the same plugin in the controller when the worker finishes
  (:func:`received`), and printed in the terminal summary. All workers collect the same
  tests, so the first worker's lines stand for all.

Scheduling: module-scoped fixtures start Ray actors (~10 s), so run_unit.sh adds ``--dist
loadfile --no-loadscope-reorder`` to a ``-n`` of yours (``configurations.make_plan``): a
module's tests stay on one worker, and the scopes go out in collection order, which each
worker makes heaviest module first (:func:`heaviest_modules_first`, by the durations
``--shard`` uses), so the longest modules do not start last.

Threads: each worker's torch/OpenMP threads and its fast tokenizers' rayon threads are its share
of the CPUs (:func:`thread_share`), through ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` /
``RAYON_NUM_THREADS`` set before anything imports torch or tokenizers (a value of your own
wins). Each worker's Ray cluster is the ``ray_cluster`` fixture's (tests/conftest.py); the controller
hands all of them one Ray auth token (:func:`share_ray_auth_token`), so that clusters starting at once
do not race on ``~/.ray/auth_token``.
"""

from __future__ import annotations

import math
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import pytest

from posttrain.testing.harness.shards import module_of, weights_of

Role = Literal["single", "controller", "worker"]
WORKER_OUTPUT_KEY = "posttrain"  # config.workeroutput[WORKER_OUTPUT_KEY][plugin key] = what a plugin ships
# torch's OpenMP/MKL pools, and the rayon pool of Hugging Face's fast (Rust) tokenizers: a batch encode
# wakes one rayon thread per core of the machine, and they spin. On the 16-core GPU host, 16 workers
# with 16 such threads each kept the load at 60-85 and the in-process loop modules ran 10-20x their
# recorded time (-n auto did not finish in 560 s).
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS")
# Ray starts its worker processes (every actor: policy, engines, producer) at nice 15, so that on a
# node of its own they cannot starve the raylet. Under xdist the other workers' test processes run at
# nice 0 and starve them instead: on 2 cores a Ray test that takes 16 s alone took minutes while an
# in-process test ran in the other worker (and -n 8 on 16 cores finished 30% of the tier in 400 s).
RAY_NICENESS_ENV = "RAY_worker_niceness"
# Ray (2.5x+) turns token authentication on for every new local cluster and, on a machine without
# ~/.ray/auth_token, writes a fresh token there. Workers starting their clusters at once race on that
# file: a worker that read the token before another overwrote it fails every later cluster start
# ("Failed to start GCS ... InvalidAuthToken"; 8 errors in one worker of -n auto on the 16-core host).
RAY_AUTH_ENV_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
SLOW_MARKER = "slow"
SLOW_TEST_S = 30.0  # a test marked slow without a recorded duration weighs this much (the marker's meaning)


def role(config: pytest.Config) -> Role:
    """``worker`` in an xdist worker, ``controller`` in the process that starts workers, else ``single``."""
    if hasattr(config, "workerinput"):
        return "worker"
    return "single" if getattr(config.option, "dist", "no") == "no" else "controller"


def ship(config: pytest.Config, key: str, value: Any) -> None:
    """Worker: hand ``value`` (plain data: dict, list, str, numbers) to the controller at the session's end."""
    config.workeroutput.setdefault(WORKER_OUTPUT_KEY, {})[key] = value  # type: ignore[attr-defined]


def received(node: Any, key: str) -> Any | None:
    """Controller, in ``pytest_testnodedown``: what the worker ``node`` shipped under ``key`` (None: nothing,
    e.g. the worker crashed)."""
    return (getattr(node, "workeroutput", None) or {}).get(WORKER_OUTPUT_KEY, {}).get(key)


def thread_share(cpus: int, workers: int) -> int:
    """Threads per worker: the CPUs split evenly, at least 1."""
    return max(1, cpus // max(1, workers))


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def limit_worker_threads(config: pytest.Config) -> int:
    """Worker: set ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` / ``RAYON_NUM_THREADS`` (where unset) to this
    worker's share; returns the worker's torch thread count (``OMP_NUM_THREADS``: yours where you set it).
    The worker's Ray actors inherit them.
    Also ``RAY_worker_niceness=0`` (where unset): this worker's Ray actors compete with the other
    workers' tests on equal terms (Ray's default nice 15 lets those starve them).

    Runs at ``pytest_configure``, before any test module imports torch, which reads them once, and
    before the worker's Ray cluster starts (its raylet reads the niceness from the environment).
    """
    share = thread_share(available_cpus(), int(config.workerinput["workercount"]))  # type: ignore[attr-defined]
    for name in THREAD_ENV_VARS:
        os.environ.setdefault(name, str(share))
    os.environ.setdefault(RAY_NICENESS_ENV, "0")
    own = os.environ["OMP_NUM_THREADS"]
    return int(own) if own.isdigit() and int(own) > 0 else share


def share_ray_auth_token() -> bool:
    """Controller: give every worker, and the Ray clusters they start, one token (``RAY_AUTH_TOKEN``),
    so that no cluster reads or writes ``~/.ray/auth_token``; returns whether it set one.

    Leaves the environment alone where you set any of ``RAY_AUTH_MODE`` / ``RAY_AUTH_TOKEN`` /
    ``RAY_AUTH_TOKEN_PATH``. Runs at ``pytest_configure``, before xdist starts its workers (they
    inherit the controller's environment). The workers' clusters are their own (``address="local"``),
    so the token reaches no cluster of yours.
    """
    if any(name in os.environ for name in RAY_AUTH_ENV_VARS):
        return False
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    return True


def heaviest_modules_first(nodeids: Sequence[str], durations: Mapping[str, float],
                           slow: frozenset[str] = frozenset()) -> list[str]:
    """``nodeids`` reordered module by module, the heaviest module first.

    A module weighs the sum of its tests' recorded seconds (a test without a record: the median
    of the recorded ones, ``shards.weights_of``; at least ``SLOW_TEST_S`` when it is in ``slow``).
    Ties keep the collection order, and so does every module's own list: the result depends only
    on the collected ids and the durations, the same in every worker.
    """
    weights = weights_of(nodeids, durations)
    for nodeid in slow:
        if nodeid in weights and nodeid not in durations:
            weights[nodeid] = max(weights[nodeid], SLOW_TEST_S)
    modules: dict[str, list[str]] = {}
    for nodeid in nodeids:
        modules.setdefault(module_of(nodeid), []).append(nodeid)
    weight = {m: math.fsum(weights[n] for n in ids) for m, ids in modules.items()}
    order = sorted(modules, key=lambda m: -weight[m])  # stable: ties stay in collection order
    return [nodeid for module in order for nodeid in modules[module]]


class WorkerThreads:
    """Worker hook: every test starts with torch at the worker's share of threads.

    ``OMP_NUM_THREADS`` reaches torch only if nothing imported it (or loaded libgomp) before the
    worker's ``pytest_configure``, and a test may leave its own count behind. On the 16-core H200
    host, under ``-n auto``, workers running the in-process loop tests spun an OpenMP team of 16
    (15 threads in ``gomp_team_barrier_wait_end``, the main thread in ``GOMP_parallel`` from the
    fused AdamW and the CPU flash-attention backward; py-spy and cuda-gdb, 2 dumps): 16 workers x
    16 threads, load 60-67, a 10 s test took 240 s. ``torch.set_num_threads`` resets torch's
    count and the OpenMP/MKL ones of the calling thread.
    """

    def __init__(self, share: int):
        self.share = share

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.get_num_threads() != self.share:
            torch.set_num_threads(self.share)


class WorkerSchedule:
    """Worker hooks: heaviest modules first, and the collection lines shipped to the controller."""

    def __init__(self, config: pytest.Config, durations: Mapping[str, float]):
        self.config = config
        self.durations = durations

    @pytest.hookimpl(wrapper=True)  # after every plugin's own reordering and deselection (testmon sorts too)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]):
        result = yield
        if self.config.getoption("failedfirst", False) or self.config.getoption("newfirst", False):
            return result  # --ff / --nf: their order is what you asked for
        slow = frozenset(item.nodeid for item in items if item.get_closest_marker(SLOW_MARKER))
        position = {nodeid: i for i, nodeid in enumerate(heaviest_modules_first(
            [item.nodeid for item in items], self.durations, slow))}
        items.sort(key=lambda item: position[item.nodeid])
        return result

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # the lines a serial run prints after collection ("shard 2/3: ...", remote-aware testmon's)
        results = self.config.hook.pytest_report_collectionfinish(
            config=self.config, start_path=self.config.invocation_params.dir, items=session.items)
        lines = [line for result in results for line in ([result] if isinstance(result, str) else result)]
        ship(self.config, "collection_lines", lines)


class ControllerReport:
    """Controller hooks: print the workers' collection lines (the first worker's; they collect alike)."""

    def __init__(self) -> None:
        self.lines: list[str] | None = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        lines = received(node, "collection_lines")
        if self.lines is None and lines is not None:
            self.lines = list(lines)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.lines:
            terminalreporter.section("collection (reported by the xdist workers)", sep="-")
            for line in self.lines:
                terminalreporter.write_line(line)
