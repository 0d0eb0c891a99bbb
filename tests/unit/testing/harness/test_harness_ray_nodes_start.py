"""posttrain.testing.harness.ray_nodes' start without Ray: ``start_cluster`` and ``main start`` against
a stand-in ``ray`` executable (a bash script that records what it was given, then blocks as ``ray
start --block`` does or exits as a node that died) and a stand-in for the GCS query (nodes join
once started); the query itself against a stand-in ``ray`` module. A real cluster:
tests/integration/test_multinode.py."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from posttrain.testing.harness import ray_nodes
from posttrain.testing.harness.ray_nodes import LocalRayCluster, RayNode

FAKE_RAY = """#!/bin/bash
# a stand-in for `ray start --block`: what it was given, then block (or exit: a node that died)
echo "ray start out"
echo "ray start err" >&2
env -0 > "{record}/$$.env"
readlink /proc/$$/fd/0 > "{record}/$$.stdin"
# the arguments last: once they are there, so is the rest
printf '%s\\0' "$@" > "{record}/$$.tmp" && mv "{record}/$$.tmp" "{record}/$$.argv"
case " $* " in {exit_if}) exit 3 ;; esac
exec sleep 60
"""
HEAD, NODE_2, NONE = '*" --head "*', "*posttrain_node_2*", "never"  # which nodes' `ray start` exits


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


@dataclass
class Started:
    """One run of the stand-in ``ray``: its pid, arguments, environment and standard input."""

    pid: int
    args: list[str]
    env: dict[str, str]
    stdin: str

    @property
    def flags(self) -> dict[str, str]:
        """``--name=value`` as ``name: value``, a bare ``--name`` as ``name: ""`` (after ``start``)."""
        assert self.args[0] == "start", self.args
        names = [arg[2:].partition("=") for arg in self.args[1:]]
        assert all(arg.startswith("--") for arg in self.args[1:]) and len({n for n, _, _ in names}) == len(names)
        return {name: value for name, _, value in names}

    @property
    def resource(self) -> str:
        return next(iter(json.loads(self.flags["resources"])))


@dataclass
class Query:
    """One ask of the stand-in GCS: what it was given, the nodes started and recorded then, its answer."""

    address: str
    env: dict[str, str]
    started: set[int]
    recorded: set[int] | None  # the pids of nodes.json (None: none written yet)
    joined: set[str]


class FakeRay:
    """The stand-in ``ray`` and GCS query of one test; ``state`` is where the test starts its cluster."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.record, self.state = tmp_path / "ray_runs", tmp_path / "new" / "state"
        self.record.mkdir()
        self.queries: list[Query] = []
        self.joins = True  # False: the nodes started never join (a cluster that does not come up)
        self.seen: dict[int, int] = {}  # pid: queries that saw it running
        self._monkeypatch = monkeypatch
        monkeypatch.setattr(ray_nodes, "_registered_nodes", self._registered_nodes)
        self.exits(NONE)

    def exits(self, pattern: str) -> None:
        """Make the ``ray start`` runs whose arguments match ``pattern`` (a bash case pattern) exit."""
        executable = self.record / f"ray-{len(list(self.record.glob('ray-*')))}"
        executable.write_text(FAKE_RAY.format(record=self.record, exit_if=pattern))
        executable.chmod(0o755)
        self._monkeypatch.setattr(ray_nodes, "_ray_executable", lambda: str(executable))

    def started(self) -> list[Started]:
        """The runs so far, in the order of their nodes' indices."""
        runs = []
        for argv in self.record.glob("*.argv"):
            env = dict(entry.split("=", 1) for entry in argv.with_suffix(".env").read_text().split("\0") if entry)
            runs.append(Started(int(argv.stem), argv.read_text().split("\0")[:-1], env,
                                argv.with_suffix(".stdin").read_text().strip()))
        return sorted(runs, key=lambda run: int(run.resource.rsplit("_", 1)[1]))

    def _registered_nodes(self, address: str, env: dict[str, str]) -> set[str]:
        # a node joins on the second ask that finds its `ray start` running (Ray's own start-up takes a while)
        runs = self.started()
        alive = [run for run in runs if running(run.pid)]
        for run in alive:
            self.seen[run.pid] = self.seen.get(run.pid, 0) + 1
        joined = {run.resource for run in alive if self.joins and self.seen[run.pid] >= 2}
        try:
            recorded = {node.pid for node in LocalRayCluster.load(str(self.state)).nodes}
        except FileNotFoundError:
            recorded = None
        self.queries.append(Query(address, env, {run.pid for run in runs}, recorded, joined))
        return joined


@pytest.fixture
def fake_ray(tmp_path, monkeypatch):
    """A FakeRay; the asks and the teardown poll every 10 ms. Every stand-in node left is killed at teardown."""
    monkeypatch.setattr(ray_nodes, "WAIT_POLL_S", 0.01)
    monkeypatch.setattr(ray_nodes, "STOP_POLL_S", 0.01)
    fake = FakeRay(tmp_path, monkeypatch)
    yield fake
    pids = {int(argv.stem) for argv in fake.record.glob("*.argv")}
    if (fake.state / ray_nodes.STATE_FILE).exists():  # a node stopped before it recorded itself
        pids |= {node.pid for node in LocalRayCluster.load(str(fake.state)).nodes}
    for pid in pids:
        if running(pid):
            os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


@contextmanager
def stdin_from_a_pipe() -> Iterator[None]:
    """fd 0 a pipe meanwhile: pytest's capture makes it /dev/null, which would hide a node inheriting it."""
    read, write = os.pipe()
    saved = os.dup(0)
    os.dup2(read, 0)
    try:
        yield
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read, write):
            os.close(fd)


def assert_stopped(runs: list[Started] | list[RayNode]) -> None:
    """No stand-in node runs any more, and each was reaped (no zombie of this process left)."""
    for run in runs:
        assert not running(run.pid), run
        with pytest.raises(ChildProcessError):
            os.waitpid(run.pid, os.WNOHANG)


def assert_stopped_as_recorded(state: Path, nodes: int) -> None:
    """nodes.json names ``nodes`` nodes, each stopped (read from the record: a stand-in stopped at once
    may not have run far enough to record itself)."""
    recorded = LocalRayCluster.load(str(state)).nodes
    assert [node.index for node in recorded] == list(range(nodes))
    assert_stopped(recorded)


def test_the_head_starts_first_then_workers_join_its_address_each_named_by_its_resource(fake_ray):
    with stdin_from_a_pipe():
        cluster = ray_nodes.start_cluster(3, fake_ray.state, num_cpus=2, object_store_mb=5)
    runs = fake_ray.started()
    try:
        host, port = cluster.address.split(":")
        assert host == "127.0.0.1" and 0 < int(port) < 65536
        common = {"block": "", "disable-usage-stats": "", "num-cpus": "2", "num-gpus": "0",
                  "object-store-memory": str(5 * 1024 * 1024)}
        head = {**common, "head": "", "port": port, "include-dashboard": "false"}
        for index, run in enumerate(runs):
            flags = run.flags
            assert json.loads(flags.pop("resources")) == {f"posttrain_node_{index}": 1}
            # ports Ray would take at fixed numbers: free ones, chosen for this node
            ports = [flags.pop("dashboard-agent-listen-port")] + ([flags.pop("ray-client-server-port")] if index == 0
                                                                  else [])
            assert all(0 < int(p) < 65536 for p in ports), ports
            assert flags == (head if index == 0 else {**common, "address": cluster.address})
            assert (run.env["RAY_AUTH_MODE"], run.env["RAY_AUTH_TOKEN"], run.env["RAY_USAGE_STATS_ENABLED"]) == (
                "token", cluster.auth_token, "0")
            assert "RAY_ADDRESS" not in run.env and run.env["PATH"] == os.environ["PATH"]
            assert run.stdin == "/dev/null" and os.getsid(run.pid) == run.pid  # its own session
            assert Path(fake_ray.state, f"node{index}.log").read_text() == "ray start out\nray start err\n"
        assert re.fullmatch("[0-9a-f]{64}", cluster.auth_token)  # 256 random bits
        assert (fake_ray.state / "auth_token").read_text() == cluster.auth_token
        assert cluster.nodes == [RayNode(i, run.pid, f"posttrain_node_{i}", 2, str(fake_ray.state / f"node{i}.log"))
                                 for i, run in enumerate(runs)]
        assert LocalRayCluster.load(str(fake_ray.state)) == cluster
        queries = fake_ray.queries
        assert all(q.address == cluster.address and q.env["RAY_AUTH_TOKEN"] == cluster.auth_token
                   and "RAY_ADDRESS" not in q.env for q in queries)
        # the workers started only once the head had joined; at every ask, `stop` would find what runs
        first_with_workers = next(i for i, q in enumerate(queries) if len(q.started) > 1)
        assert {"posttrain_node_0"} in [q.joined for q in queries[:first_with_workers]]
        assert all(q.recorded is not None and q.started <= q.recorded for q in queries)
        assert queries[-1].joined == {f"posttrain_node_{i}" for i in range(3)}
        assert queries[-1].recorded == {run.pid for run in runs}
        assert all(running(run.pid) for run in runs)
    finally:
        cluster.stop()
    assert_stopped(runs)


def test_a_cluster_of_one_is_a_head_of_one_cpu_and_a_256_mib_object_store_by_default(fake_ray):
    cluster = ray_nodes.start_cluster(1, fake_ray.state)
    cluster.stop()
    [run] = fake_ray.started()
    assert (run.flags["num-cpus"], run.flags["object-store-memory"]) == ("1", str(256 * 1024 * 1024))
    assert "head" in run.flags and [node.pid for node in cluster.nodes] == [run.pid]


@pytest.mark.parametrize("exits, index, nodes", [(HEAD, 0, 1), (NODE_2, 2, 3)], ids=["head", "worker"])
def test_a_node_whose_ray_start_exits_fails_naming_its_log_and_stops_the_nodes_started(fake_ray, exits, index,
                                                                                         nodes):
    fake_ray.exits(exits)
    with pytest.raises(RuntimeError) as error:
        ray_nodes.start_cluster(3, fake_ray.state, timeout_s=30.0)
    assert str(error.value) == f"ray start of node {index} exited; see {fake_ray.state}/node{index}.log"
    assert_stopped_as_recorded(fake_ray.state, nodes)  # a head that exits: no worker started


def test_a_head_that_does_not_join_in_time_fails_naming_it_the_address_and_the_logs(fake_ray):
    fake_ray.joins = False
    start = time.monotonic()
    with pytest.raises(RuntimeError) as error:
        ray_nodes.start_cluster(2, fake_ray.state, timeout_s=0.1)
    took = time.monotonic() - start
    address = fake_ray.queries[0].address
    assert str(error.value) == (f"the Ray nodes ['posttrain_node_0'] did not all join {address} within 0.1 s; "
                                f"see {fake_ray.state}/node*.log")
    assert 0.1 <= took < 5.0, took
    assert_stopped_as_recorded(fake_ray.state, 1)  # the head did not join: no worker started


def test_workers_that_do_not_join_in_time_fail_naming_every_node(fake_ray, monkeypatch):
    # the head joins; then nothing more does
    original = fake_ray._registered_nodes
    monkeypatch.setattr(ray_nodes, "_registered_nodes", lambda address, env: original(address, env) & {
        "posttrain_node_0"})
    with pytest.raises(RuntimeError) as error:
        ray_nodes.start_cluster(2, fake_ray.state, timeout_s=0.1)
    assert str(error.value) == (f"the Ray nodes ['posttrain_node_0', 'posttrain_node_1'] did not all join "
                                f"{fake_ray.queries[0].address} within 0.1 s; see {fake_ray.state}/node*.log")
    assert_stopped_as_recorded(fake_ray.state, 2)


def test_an_interrupt_while_waiting_stops_the_nodes_started(fake_ray, monkeypatch):
    def interrupted(address, env):
        raise KeyboardInterrupt

    monkeypatch.setattr(ray_nodes, "_registered_nodes", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ray_nodes.start_cluster(2, fake_ray.state)
    assert_stopped_as_recorded(fake_ray.state, 1)


def test_main_start_prints_the_heads_address_and_stop_ends_the_nodes(fake_ray, capsys):
    assert ray_nodes.main(["start", "--state", str(fake_ray.state)]) == 0
    cluster = LocalRayCluster.load(str(fake_ray.state))
    assert capsys.readouterr() == (f"{cluster.address}\n", "")
    runs = fake_ray.started()
    assert [(run.flags["num-cpus"], run.flags["object-store-memory"]) for run in runs] == [
        ("1", str(256 * 1024 * 1024))] * 2  # the defaults: two nodes of one CPU and 256 MiB
    assert ray_nodes.main(["stop", "--state", str(fake_ray.state)]) == 0
    assert_stopped(runs)


def test_main_start_passes_its_arguments_on(fake_ray, capsys):
    fake_ray.state.mkdir(parents=True)  # a directory that exists already is fine
    assert ray_nodes.main(["start", "--nodes", "1", "--num-cpus", "0", "--object-store-mb", "7", "--state",
                           str(fake_ray.state)]) == 0
    LocalRayCluster.load(str(fake_ray.state)).stop()
    assert [(run.flags["num-cpus"], run.flags["object-store-memory"]) for run in fake_ray.started()] == [
        ("0", str(7 * 1024 * 1024))]


def test_main_start_of_a_node_that_exits_is_one_stderr_line_and_exit_1(fake_ray, capsys):
    fake_ray.exits(HEAD)
    assert ray_nodes.main(["start", "--state", str(fake_ray.state)]) == 1
    assert capsys.readouterr() == ("", f"ray_nodes start: ray start of node 0 exited; see "
                                       f"{fake_ray.state}/node0.log\n")
    assert_stopped_as_recorded(fake_ray.state, 1)


def test_the_help_says_what_each_command_and_option_does(capsys):
    for argv in (["--help"], ["start", "--help"], ["stop", "--help"]):
        with pytest.raises(SystemExit) as exit_:
            ray_nodes.main(argv)
        assert exit_.value.code == 0
    text = " ".join(["", *capsys.readouterr().out.split(), ""])
    for words in ("usage: python -m posttrain.testing.harness.ray_nodes [-h] {start,stop}",
                  "start or stop a multi-node Ray cluster on this machine",
                  "start start the nodes; print the head's address", "stop stop the nodes recorded in --state",
                  "usage: python -m posttrain.testing.harness.ray_nodes start [-h] [--nodes NODES]",
                  "--num-cpus NUM_CPUS logical CPUs of each node", "--object-store-mb OBJECT_STORE_MB",
                  "--state STATE directory for nodes.json and the nodes' logs",
                  "usage: python -m posttrain.testing.harness.ray_nodes stop [-h] --state STATE"):
        assert f" {words} " in text, words
    with pytest.raises(SystemExit) as exit_:
        ray_nodes.main([])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("error: the following arguments are required: command")


# --- the GCS query, through a stand-in `ray` module ---

FAKE_RAY_MODULE = """
import json, os, time

def init(address, **kwargs):
    with open(os.environ["FAKE_RAY_RECORD"], "w") as out:
        json.dump({"address": address, "token": os.environ.get("RAY_AUTH_TOKEN")}, out)
    print("lines Ray prints before the answer:")
    print("2026-11-28 INFO worker.py: Connecting to existing Ray cluster at address: " + address)
    if os.environ["FAKE_RAY_INIT"] == "fails":
        raise ConnectionError("no GCS at " + address)
    if os.environ["FAKE_RAY_INIT"] == "hangs":
        time.sleep(60)

def nodes():
    return json.loads(os.environ["FAKE_RAY_NODES"])
"""
NODES = [{"Alive": True, "Resources": {"CPU": 1.0, "posttrain_node_0": 1.0, "node:127.0.0.1": 1.0}},
         {"Alive": False, "Resources": {"CPU": 1.0, "posttrain_node_1": 1.0}},
         {"Alive": True, "Resources": {"memory": 1e9, "posttrain_node_2": 1.0}}]


@pytest.fixture
def query(tmp_path, monkeypatch):
    """``query(init)``: ``_registered_nodes`` with a stand-in ``ray`` first on the driver's path (on this
    process's too, so that a driver not given the environment still never reaches a real Ray); ``init``:
    "joins", "fails" or "hangs". Returns its answer and what the driver's ``ray.init`` was given."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text(FAKE_RAY_MODULE)
    path = os.pathsep.join([str(tmp_path), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setattr(ray_nodes, "QUERY_TIMEOUT_S", 5.0)
    record = tmp_path / "init.json"

    def ask(init: str) -> tuple[set[str], dict]:
        env = {**os.environ, "PYTHONPATH": path, "RAY_AUTH_TOKEN": "t0ken", "FAKE_RAY_RECORD": str(record),
               "FAKE_RAY_INIT": init, "FAKE_RAY_NODES": json.dumps(NODES)}
        return ray_nodes._registered_nodes("127.0.0.1:6379", env), json.loads(record.read_text())

    return ask


def test_the_query_answers_the_alive_nodes_resources_that_name_them(query):
    assert query("joins") == ({"posttrain_node_0", "posttrain_node_2"}, {"address": "127.0.0.1:6379",
                                                                         "token": "t0ken"})


def test_the_query_answers_none_joined_when_its_driver_fails_or_hangs(query, monkeypatch):
    assert query("fails")[0] == set()
    monkeypatch.setattr(ray_nodes, "QUERY_TIMEOUT_S", 0.3)
    start = time.monotonic()
    assert query("hangs")[0] == set()
    assert time.monotonic() - start < 5.0


def test_ray_is_this_interpreters_own_when_its_environment_has_one(tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    assert ray_nodes._ray_executable() == "ray"  # none there: the first on PATH
    (tmp_path / "bin" / "ray").touch()
    assert ray_nodes._ray_executable() == str(tmp_path / "bin" / "ray")


def test_a_free_port_is_one_the_kernel_handed_out_and_can_be_bound():
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    port = ray_nodes.free_port()
    assert isinstance(port, int) and low <= port <= high
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
