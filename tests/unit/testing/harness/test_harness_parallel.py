"""``-n N`` (pytest-xdist) with the harness (posttrain.testing.harness.parallel): the controller's
unit_results.json holds what every worker's tests tracked, ``--shard`` runs exactly its part with its
lines printed by the controller, the heaviest module goes out first, a worker's threads are its share
of the CPUs, and "nothing ran" still exits 5. Ray per worker and coverage inside actors under ``-n 2``:
test_harness_coverage.py; ``--testmon -n 2``: test_harness_remote_testmon.py.

The inner runs are real pytest processes (``runpytest_subprocess``): xdist starts its workers from them.
"""

from __future__ import annotations

import json
import os
import re
from types import SimpleNamespace

import pytest

from posttrain.testing.harness.configurations import xdist_schedule_args
from posttrain.testing.harness.parallel import (
    RAY_AUTH_ENV_VARS,
    RAY_NICENESS_ENV,
    SLOW_TEST_S,
    THREAD_ENV_VARS,
    ControllerReport,
    WorkerThreads,
    available_cpus,
    heaviest_modules_first,
    limit_worker_threads,
    received,
    role,
    share_ray_auth_token,
    ship,
    thread_share,
)
from posttrain.testing.harness.shards import assign

# ---------------------------------------------------------------- the decisions (pure)


@pytest.mark.parametrize(("args", "expected"), [
    (["-n", "auto"], ("--dist", "loadfile", "--no-loadscope-reorder")),
    (["-x", "-n4", "tests/unit"], ("--dist", "loadfile", "--no-loadscope-reorder")),
    (["--numprocesses=2"], ("--dist", "loadfile", "--no-loadscope-reorder")),
    (["--numprocesses", "logical"], ("--dist", "loadfile", "--no-loadscope-reorder")),
    (["-n", "2", "--dist", "load"], ()),  # the user's own --dist wins
    (["--dist=loadscope", "-n", "2"], ()),
    (["-n", "0"], ()),  # xdist off
    (["-k", "refit", "tests/unit"], ()),
    (["--", "-n", "2"], ()),  # after --: not options
])
def test_the_plan_schedules_by_module_only_when_workers_are_asked_for(args, expected):
    assert xdist_schedule_args(args) == expected


def test_the_heaviest_module_goes_first_and_ties_keep_the_collection_order():
    ids = ["a.py::t0", "a.py::t1", "b.py::t0", "c.py::t0", "d.py::t0", "d.py::t1"]
    durations = {"a.py::t0": 1.0, "a.py::t1": 1.0, "b.py::t0": 9.0, "c.py::t0": 2.0, "d.py::t0": 1.0, "d.py::t1": 1.0}
    assert heaviest_modules_first(ids, durations) == ["b.py::t0", "a.py::t0", "a.py::t1", "c.py::t0", "d.py::t0",
                                                      "d.py::t1"]
    # a module's own tests keep their order; a test without a record weighs the median of the recorded (0.3)
    assert heaviest_modules_first(["x.py::t1", "x.py::t0", "y.py::new", "y.py::t"],
                                  {"x.py::t1": 0.2, "x.py::t0": 0.3, "y.py::t": 0.4}) == \
        ["y.py::new", "y.py::t", "x.py::t1", "x.py::t0"]


def test_a_slow_test_without_a_record_weighs_at_least_the_slow_markers_threshold():
    ids = ["fast.py::t", "new_slow.py::t"]
    durations = {"fast.py::t": SLOW_TEST_S - 1}
    assert heaviest_modules_first(ids, durations) == ids
    assert heaviest_modules_first(ids, durations, slow=frozenset({"new_slow.py::t"})) == ids[::-1]
    # a recorded duration is the truth, marker or not
    assert heaviest_modules_first(ids, {**durations, "new_slow.py::t": 0.1}, slow=frozenset({"new_slow.py::t"})) == ids


@pytest.mark.parametrize(("cpus", "workers", "threads"), [(2, 2, 1), (16, 16, 1), (16, 4, 4), (16, 3, 5), (1, 4, 1),
                                                            (4, 1, 4), (3, 0, 3)])
def test_a_worker_gets_its_share_of_the_cpus_as_threads(cpus, workers, threads):
    assert thread_share(cpus, workers) == threads


def test_the_role_is_told_by_xdist_s_worker_input_and_dist_option():
    assert role(SimpleNamespace(option=SimpleNamespace(dist="no"))) == "single"
    assert role(SimpleNamespace(option=SimpleNamespace())) == "single"  # xdist not installed: no dist option
    assert role(SimpleNamespace(option=SimpleNamespace(dist="loadfile"))) == "controller"
    assert role(SimpleNamespace(option=SimpleNamespace(dist="no"), workerinput={})) == "worker"


def test_what_a_worker_ships_is_what_the_controller_receives_and_nothing_shipped_is_none():
    worker = SimpleNamespace(workeroutput={})  # xdist's config.workeroutput, sent back as the node's
    ship(worker, "collection_lines", ["shard 1/2: 3 tests"])
    ship(worker, "state", {"a": 1})
    assert worker.workeroutput == {"posttrain": {"collection_lines": ["shard 1/2: 3 tests"], "state": {"a": 1}}}
    assert received(worker, "collection_lines") == ["shard 1/2: 3 tests"]
    assert received(worker, "missing") is None
    # a worker that crashed: no workeroutput, an empty one, or nothing from this plugin
    for node in (SimpleNamespace(), SimpleNamespace(workeroutput=None), SimpleNamespace(workeroutput={}),
                 SimpleNamespace(workeroutput={"other": {"collection_lines": 1}})):
        assert received(node, "collection_lines") is None


def test_the_controller_prints_the_first_workers_lines_once(capsys):
    report = ControllerReport()
    report.pytest_testnodedown(SimpleNamespace(), None)  # a crashed worker first
    report.pytest_testnodedown(SimpleNamespace(workeroutput={"posttrain": {"collection_lines": ["one", "two"]}}), None)
    report.pytest_testnodedown(SimpleNamespace(workeroutput={"posttrain": {"collection_lines": ["other"]}}), None)
    printed: list[tuple] = []
    writer = SimpleNamespace(section=lambda *a, **k: printed.append(("section", a, k)),
                             write_line=lambda line: printed.append(("line", line)))
    report.pytest_terminal_summary(writer)
    assert printed == [("section", ("collection (reported by the xdist workers)",), {"sep": "-"}),
                       ("line", "one"), ("line", "two")]
    printed.clear()
    ControllerReport().pytest_terminal_summary(writer)  # no worker shipped lines: no section
    assert printed == []


def test_a_worker_sets_its_thread_share_and_ray_niceness_only_where_unset(monkeypatch):
    for name in (*THREAD_ENV_VARS, RAY_NICENESS_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    worker = SimpleNamespace(workerinput={"workercount": 3})
    assert limit_worker_threads(worker) == 2
    assert [os.environ[name] for name in (*THREAD_ENV_VARS, RAY_NICENESS_ENV)] == ["2", "2", "2", "0"]
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    monkeypatch.setenv("RAYON_NUM_THREADS", "7")
    monkeypatch.setenv(RAY_NICENESS_ENV, "3")
    monkeypatch.delenv("MKL_NUM_THREADS")
    assert limit_worker_threads(worker) == 5  # your OMP_NUM_THREADS is torch's count
    assert [os.environ[name] for name in (*THREAD_ENV_VARS, RAY_NICENESS_ENV)] == ["5", "2", "7", "3"]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert limit_worker_threads(worker) == 1
    for own in ("0", "lots"):  # not a thread count: the share
        monkeypatch.setenv("OMP_NUM_THREADS", own)
        assert limit_worker_threads(worker) == 2


def test_the_cpus_are_the_affinity_mask_or_the_cpu_count_where_there_is_none(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3} if pid == 0 else set())
    assert available_cpus() == 2
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert available_cpus() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert available_cpus() == 1


def test_each_test_in_a_worker_starts_with_torch_at_the_workers_share():
    torch = pytest.importorskip("torch")
    own = torch.get_num_threads()
    try:
        torch.set_num_threads(own + 2)  # what the previous test left
        WorkerThreads(own + 1).pytest_runtest_setup(None)
        assert torch.get_num_threads() == own + 1
    finally:
        torch.set_num_threads(own)


# ---------------------------------------------------------------- pytest runs

DURATIONS = {"test_alpha.py::test_0": 1.0, "test_beta.py::test_0": 2.0, "test_gamma.py::test_0": 0.5,
             "test_zeta.py::test_0": 40.0}


@pytest.fixture
def tree(pytester, monkeypatch):
    """Four modules whose tests track the worker and the thread count they saw; zeta, collected last, is
    the heaviest by the durations file and has the fewest tests (xdist's own reordering would put it last)."""
    monkeypatch.setenv("POSTTRAIN_UNIT_RESULTS_DIR", str(pytester.path / "results"))
    monkeypatch.setenv("POSTTRAIN_NUM_GPUS", "0")
    for name in THREAD_ENV_VARS:  # an outer xdist worker's would be inherited
        monkeypatch.delenv(name, raising=False)
    body = ("import os\nimport pytest\n\n{mark}def test_{i}(tracker):\n"
            "    tracker.track('worker', os.environ['PYTEST_XDIST_WORKER'])\n"
            "    tracker.track('threads', os.environ.get('OMP_NUM_THREADS'))\n")
    for name, n in (("alpha", 3), ("beta", 2), ("gamma", 2), ("zeta", 1)):
        pytester.makepyfile(**{f"test_{name}": "\n".join(
            body.format(i=i, mark="@pytest.mark.slow\n" if name == "gamma" and i == 1 else "") for i in range(n))})
    pytester.makeini("[pytest]\nposttrain_harness = true\nmarkers =\n    slow: slow\n")
    (pytester.path / "durations.json").write_text(json.dumps(DURATIONS))
    return pytester


def run(pytester, workers: int, *args: str, ret: int = 0) -> pytest.RunResult:
    """An inner run with ``workers`` workers, scheduled as run_unit.sh schedules ``-n``."""
    n = ["-n", str(workers)]
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", "--shard-durations", "durations.json",
                                           *n, *xdist_schedule_args(n), *args, timeout=120)
    assert result.ret == ret, result.stdout.str() + result.stderr.str()
    return result


def metrics(pytester) -> dict[str, dict]:
    return json.loads((pytester.path / "results" / "unit_results.json").read_text())["metrics"]


def test_unit_results_hold_what_tests_tracked_on_two_workers(tree):
    run(tree, 2)
    got = metrics(tree)
    assert len(got) == 8
    assert {m["worker"] for m in got.values()} == {"gw0", "gw1"}  # two workers ran tests, and shipped them
    for nodeid, values in got.items():
        assert set(values) == {"_elapsed", "_total", "worker", "threads"}, nodeid
        assert values["_total"] >= values["_elapsed"], nodeid
        # each worker's torch / OpenMP threads: its share of the CPUs
        assert values["threads"] == str(thread_share(available_cpus(), 2)), nodeid


@pytest.mark.slow(reason="pytest-xdist workers as real processes")
def test_auto_starts_one_worker_per_cpu_of_the_affinity_mask_not_per_core_of_the_machine(tree, monkeypatch):
    """``-n auto`` in a process limited to one CPU (as ``taskset -c 0`` or a container's cpuset
    limits it): one worker, whatever the machine has. xdist alone counts physical cores."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})  # the inner pytest inherits the mask
    try:
        result = tree.runpytest_subprocess("-p", "no:cacheprovider", "-n", "auto", "-k", "alpha", timeout=120)
    finally:
        os.sched_setaffinity(0, allowed)
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["created: 1/1 worker*"])
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "2")  # xdist's own override still wins
    result = tree.runpytest_subprocess("-p", "no:cacheprovider", "-n", "auto", "-k", "alpha", timeout=120)
    result.stdout.fnmatch_lines(["created: 2/2 workers"])


@pytest.fixture
def bare(pytester, monkeypatch):
    """An empty inner tree with the harness on, no durations, results under it, no GPU, and none of the
    outer run's thread limits (an outer xdist worker's would be inherited): add one test module."""
    monkeypatch.setenv("POSTTRAIN_NUM_GPUS", "0")
    for name in THREAD_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    pytester.makeini("[pytest]\nposttrain_harness = true\n")
    (pytester.path / "durations.json").write_text("{}")
    monkeypatch.setenv("POSTTRAIN_UNIT_RESULTS_DIR", str(pytester.path / "results"))
    return pytester


def test_a_fast_tokenizer_in_a_worker_starts_only_its_share_of_threads(bare, monkeypatch):
    """A batch encode by Hugging Face's Rust tokenizers starts its rayon pool: one thread per core of the
    machine unless bounded. In an xdist worker it must be the worker's share, like torch's threads."""
    # tokenizers turns its pool off (this variable, false) in a process forked after the pool ran:
    # an outer xdist worker that tokenized before would hand that on
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    bare.makepyfile(test_tok=(
        "import os\n"
        "from tokenizers import Tokenizer, models, pre_tokenizers\n\n"
        "def test_encode(tracker):\n"
        "    tok = Tokenizer(models.WordLevel({'a': 0, 'b': 1, '[UNK]': 2}, unk_token='[UNK]'))\n"
        "    tok.pre_tokenizer = pre_tokenizers.Whitespace()\n"
        "    before = len(os.listdir('/proc/self/task'))\n"
        "    tok.encode_batch(['a b a b'] * 512)\n"
        "    tracker.track('new_threads', len(os.listdir('/proc/self/task')) - before)\n"))
    workers = 2
    run(bare, workers)
    [got] = metrics(bare).values()
    share = thread_share(available_cpus(), workers)
    assert 1 <= got["new_threads"] <= share, (got, share)


@pytest.mark.slow(reason="pytest-xdist workers as real processes, torch in each")
def test_a_thread_count_of_your_own_wins(tree, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    run(tree, 2, "-k", "zeta")
    assert [m["threads"] for m in metrics(tree).values()] == ["3"]


def test_the_heaviest_module_goes_out_first(tree):
    result = run(tree, 1)  # one worker runs the scopes in the order xdist hands them out
    # weights (a test without a record: the median of the recorded, 1.5 s; gamma's slow one: 30 s):
    # zeta 40, gamma 0.5 + 30, alpha 1 + 1.5 + 1.5, beta 2 + 1.5. Collected: alpha, beta, gamma, zeta.
    order = re.findall(r"PASSED (test_\w+)\.py::", result.stdout.str())
    assert order == ["test_zeta", "test_gamma", "test_gamma", "test_alpha", "test_alpha", "test_alpha", "test_beta",
                     "test_beta"], order


@pytest.mark.slow(reason="pytest-xdist workers as real processes")
def test_a_shard_runs_exactly_its_part_and_the_controller_prints_its_lines(tree):
    everything = ["test_alpha.py::test_0", "test_alpha.py::test_1", "test_alpha.py::test_2", "test_beta.py::test_0",
                  "test_beta.py::test_1", "test_gamma.py::test_0", "test_zeta.py::test_0"]  # -m drops gamma's slow one
    expected = assign(everything, DURATIONS, 2)[1]
    assert 0 < len(expected) < len(everything)
    # a conftest's own collection lines (a hook may return a list), from the arguments pytest hands that
    # hook, reach the controller too
    tree.makeconftest("def pytest_report_collectionfinish(config, start_path, items):\n"
                      "    return [f'conftest: {start_path.name}, {len(items)} items',\n"
                      "            f'-m {config.option.markexpr}']\n")
    result = run(tree, 2, "--shard", "2/2", "-m", "not slow")
    assert sorted(metrics(tree)) == sorted(expected)
    result.stdout.fnmatch_lines([
        "*collection (reported by the xdist workers)*",
        f"shard 2/2: {len(expected)} of 7 selected tests (est. * s of * s)",
        f"conftest: {tree.path.name}, {len(expected)} items",
        "-m not slow",
        "*deselected by the configuration*",
        "1 deselected: other (your -m / -k)",
        f"{7 - len(expected)} deselected: in other shards (--shard 2/2)",
    ])


@pytest.mark.slow(reason="pytest-xdist workers as real processes")
def test_nothing_ran_still_exits_5(tree):
    result = run(tree, 2, "--fail-on-nothing-ran", "-m", "slow", "-k", "not gamma", ret=5)
    result.stdout.fnmatch_lines(["nothing was tested: no test selected, or every selected test skipped (exit 5)"])
    (tree.path / "test_skipped.py").write_text("import pytest\n\n@pytest.mark.skip(reason='no')\ndef test_s():\n"
                                               "    pass\n")
    run(tree, 2, "--fail-on-nothing-ran", "-k", "test_s", ret=5)


def test_every_worker_starts_with_the_controllers_ray_token(bare, monkeypatch):
    """What keeps the workers' clusters off ``~/.ray/auth_token`` (the race of the next test): each
    worker's environment holds the one token the controller made."""
    for name in RAY_AUTH_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    # the controller sets RAY_AUTH_TOKEN here, in this process: set and deleted through monkeypatch,
    # so that its undo removes whatever the controller set
    monkeypatch.setenv("RAY_AUTH_TOKEN", "")
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # only xdist's and the harness's plugins: a fast start
    body = ("import os\n\n\ndef test_{i}(tracker):\n"
            "    tracker.track('worker', os.environ['PYTEST_XDIST_WORKER'])\n"
            "    tracker.track('token', os.environ.get('RAY_AUTH_TOKEN'))\n")
    bare.makepyfile(test_a=body.format(i=0), test_b=body.format(i=1))
    n = ["-n", "2"]
    result = bare.runpytest_inprocess("-p", "no:cacheprovider", "-p", "xdist.plugin", "-p",
                                      "posttrain.testing.harness.plugin", *n, *xdist_schedule_args(n))
    assert result.ret == 0, result.stdout.str()
    seen = metrics(bare).values()
    assert {m["worker"] for m in seen} == {"gw0", "gw1"}
    tokens = {m["token"] for m in seen}
    assert len(tokens) == 1, tokens  # one for every worker
    token = tokens.pop()
    assert token is not None and re.fullmatch("[0-9a-f]{64}", token), token  # 256 random bits
    assert os.environ.get("RAY_AUTH_TOKEN") == token  # the controller's


@pytest.mark.slow(reason="a Ray cluster in each of two xdist workers")
def test_a_workers_cluster_starts_after_another_worker_rewrote_the_ray_token_file(bare, monkeypatch):
    """Ray writes ``~/.ray/auth_token`` for the first local cluster of a machine and reads it again at
    every start. xdist workers starting their clusters at once race on that file: on the 16-core host
    one worker of ``-n auto`` read a token that another then overwrote and failed every later start
    ("Failed to start GCS", InvalidAuthToken: 8 errors). Here a worker starts a cluster, the file is
    rewritten as a racing worker would, and the same worker starts another, which must come up."""
    home = bare.path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # no token file yet: a fresh machine
    for name in RAY_AUTH_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    bare.makepyfile(test_ray_token=(
        "import pathlib\nimport secrets\n\nimport ray\n\nfrom posttrain.distributed.ray_cluster import init_ray\n\n\n"
        "def start_and_stop():\n"
        "    init_ray(address='local', num_cpus=1)\n"
        "    ray.shutdown()\n\n\n"
        "def test_a_second_cluster_starts():\n"
        "    start_and_stop()\n"
        "    token = pathlib.Path.home() / '.ray' / 'auth_token'\n"
        "    token.parent.mkdir(exist_ok=True)\n"
        "    token.write_text(secrets.token_hex(32))  # another worker's first start, a moment later\n"
        "    start_and_stop()\n"))
    run(bare, 1)


def test_a_ray_token_setting_of_your_own_is_left_alone(monkeypatch):
    for name in RAY_AUTH_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    assert share_ray_auth_token() and len(os.environ["RAY_AUTH_TOKEN"]) == 64
    for name in RAY_AUTH_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv(name, "disabled" if name == "RAY_AUTH_MODE" else "yours")
        assert not share_ray_auth_token() and os.environ[name] in ("disabled", "yours")
        monkeypatch.delenv(name)


@pytest.mark.slow(reason="pytest-xdist workers as real processes, torch in each")
def test_a_test_that_leaves_torch_on_more_threads_does_not_hand_them_to_the_next(bare):
    """Each test in a worker starts with torch at the worker's share. Under -n auto on the 16-core host,
    workers running the in-process loop tests spun OpenMP teams of 16 (15 threads waiting in libgomp's
    barrier, the main thread in GOMP_parallel): 16 workers x 16 threads, a 10 s test took 240 s."""
    workers = 2
    share = thread_share(available_cpus(), workers)
    bare.makepyfile(test_leak=(
        "import torch\n\n"
        "def test_0_leaves_threads():\n"
        f"    torch.set_num_threads({share + 2})\n\n"
        "def test_1_starts(tracker):\n"
        "    tracker.track('torch_threads', torch.get_num_threads())\n"))
    run(bare, workers)  # --dist loadfile: both tests in one worker, in order
    [got] = [m for m in metrics(bare).values() if "torch_threads" in m]
    assert got["torch_threads"] == share, got
