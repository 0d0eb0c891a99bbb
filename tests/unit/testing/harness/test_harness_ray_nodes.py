"""posttrain.testing.harness.ray_nodes without starting Ray: its command line's refusals, the
record ``stop`` reads, and the process tree teardown signals (the real cluster:
tests/integration/test_multinode.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posttrain.testing.harness import ray_nodes
from posttrain.testing.harness.ray_nodes import LocalRayCluster, RayNode, process_tree


def test_bad_arguments_are_one_line_and_exit_2(capsys, monkeypatch, tmp_path):
    # refused before any node starts (a node started here would outlive a test that is killed)
    monkeypatch.setattr(ray_nodes, "_start_node", lambda *args: pytest.fail(f"a node was started: {args}"))
    with pytest.raises(SystemExit) as exit_:
        ray_nodes.main(["start", "--nodes", "0", "--state", str(tmp_path)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("--nodes must be >= 1 and --num-cpus >= 0, "
                                                                     "got 0 and 1")
    with pytest.raises(SystemExit):
        ray_nodes.main(["start", "--num-cpus", "-1", "--state", str(tmp_path)])
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("got 2 and -1")
    with pytest.raises(SystemExit):
        ray_nodes.main(["start"])  # --state is required
    assert "--state" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"^a cluster needs nodes >= 1 and num_cpus >= 0, got nodes=0, num_cpus=1$"):
        ray_nodes.start_cluster(0, tmp_path)
    with pytest.raises(ValueError, match=r"got nodes=1, num_cpus=-1$"):
        ray_nodes.start_cluster(1, tmp_path, num_cpus=-1)


def test_stop_without_a_recorded_cluster_is_one_line_and_exit_2(tmp_path, capsys):
    assert ray_nodes.main(["stop", "--state", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"ray_nodes stop: no nodes.json in {tmp_path} (nothing started there)\n"


def test_the_record_holds_what_stop_needs(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/another/clusters/token")  # would override the token
    monkeypatch.setenv("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "1")
    cluster = LocalRayCluster("127.0.0.1:1234", str(tmp_path), "t0ken",
                              [RayNode(0, 11, "posttrain_node_0", 1, "n0.log"), RayNode(1, 12, "posttrain_node_1", 1,
                                                                                       "n1.log")])
    cluster.save()
    assert LocalRayCluster.load(str(tmp_path)) == cluster
    assert (tmp_path / "auth_token").read_text() == "t0ken"
    env = cluster.client_env()
    assert (env["RAY_ADDRESS"], env["RAY_AUTH_MODE"], env["RAY_AUTH_TOKEN"]) == ("127.0.0.1:1234", "token", "t0ken")
    assert "RAY_AUTH_TOKEN_PATH" not in env and env["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] == "0"
    assert env["PATH"] == os.environ["PATH"]  # the rest of this process's environment
    assert [node.is_head for node in cluster.nodes] == [True, False]
    assert [node.index for node in cluster.workers] == [1]


def test_the_process_tree_holds_a_grandchild_and_not_a_bystander():
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                               "print('started', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "started"
        tree = process_tree(parent.pid)
        assert parent.pid in tree and len(tree) == 2 and bystander.pid not in tree
    finally:
        for pid in process_tree(parent.pid):  # only the processes this test started
            os.kill(pid, signal.SIGKILL)
        parent.wait()
        bystander.kill()
        bystander.wait()


# --- stand-in nodes: bash processes shaped like a `ray start` node's tree (no Ray) ---

NODE = """
trap {on_term} TERM
(exec -a $'\\xff\\xfe' '{not_utf8}' 60) &
echo not_utf8 $!
(exec -a 'ray::{actor}' sleep 60) &
echo actor $!
(exec setsid bash -c "exec -a 'ray::Trainer.train' sleep 60") &
echo bystander_in_tree $!
{raylet} 60 &
echo raylet $!
echo ready
wait
"""


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie): read here, not with RayNode.alive."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def title(pid: int) -> str:
    """The first word of ``pid``'s command line ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return ""


def eventually(condition, timeout_s: float = 10.0) -> bool:
    """Whether ``condition()`` became true within ``timeout_s`` (polled every 10 ms)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def fake_nodes(tmp_path):
    """``start(index, actor, on_term)``: a node process (its own session, as ``ray start``'s) whose tree
    holds a ``ray::<actor>`` process, a ``ray::Trainer.train`` one, a process named ``raylet`` and one
    whose name and title are not UTF-8 (listed first); returns the RayNode and the pids its script
    printed. Every process started is killed at teardown."""
    sleep = shutil.which("sleep")
    assert sleep is not None
    raylet, not_utf8 = tmp_path / "raylet", tmp_path / os.fsdecode(b"\xff\xfe")
    raylet.symlink_to(sleep)
    not_utf8.symlink_to(sleep)
    started: list[tuple[subprocess.Popen, set[int]]] = []

    def start(index: int, actor: str, on_term: str = "'exit 0'") -> tuple[RayNode, dict[str, int]]:
        proc = subprocess.Popen(["bash", "-c", NODE.format(on_term=on_term, actor=actor, raylet=raylet,
                                                           not_utf8=not_utf8)],
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert proc.stdout is not None
        pids = {}
        for line in iter(proc.stdout.readline, "ready\n"):
            name, pid = line.split()
            pids[name] = int(pid)
        started.append((proc, set(pids.values())))
        # `$!` is printed before the background process has exec'd into its title
        assert eventually(lambda: all(title(pid).startswith("ray::") for pid in (pids["actor"],
                                                                                  pids["bystander_in_tree"]))
                          and Path(f"/proc/{pids['raylet']}/comm").read_text().strip() == "raylet"
                          and Path(f"/proc/{pids['not_utf8']}/cmdline").read_bytes().startswith(b"\xff\xfe\0"))
        return RayNode(index, proc.pid, f"posttrain_node_{index}", 1, str(tmp_path / f"node{index}.log")), pids

    yield start
    for proc, pids in started:
        for pid in pids | {proc.pid}:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


def test_an_actor_and_a_raylet_are_found_only_in_the_trees_of_the_clusters_nodes(fake_nodes, tmp_path):
    head, head_pids = fake_nodes(0, "Engine")
    worker, worker_pids = fake_nodes(1, "EngineGroup.generate")
    outside = subprocess.Popen(["bash", "-c", "exec -a 'ray::Engine' sleep 60"])  # another cluster's actor
    try:
        cluster = LocalRayCluster("127.0.0.1:1", str(tmp_path), "t", [head, worker])
        assert cluster.actor_pid("Engine") == (0, head_pids["actor"])
        assert cluster.actor_pid("EngineGroup") == (1, worker_pids["actor"])  # ray::Class.method counts
        with pytest.raises(LookupError, match=r"^0 processes of actor class Engin on the cluster's nodes: \[\]$"):
            cluster.actor_pid("Engin")  # a prefix of a class is not the class
        with pytest.raises(LookupError, match=(rf"^2 processes of actor class Trainer on the cluster's nodes: "
                                               rf"\[\(0, {head_pids['bystander_in_tree']}\), "
                                               rf"\(1, {worker_pids['bystander_in_tree']}\)\]$")):
            cluster.actor_pid("Trainer")
        assert [cluster.raylet_pid(0), cluster.raylet_pid(1)] == [head_pids["raylet"], worker_pids["raylet"]]
        os.kill(worker_pids["raylet"], signal.SIGKILL)
        assert eventually(lambda: not Path(f"/proc/{worker_pids['raylet']}").exists())  # reaped by its node
        with pytest.raises(LookupError, match="^node 1 has no live raylet$"):
            cluster.raylet_pid(1)
    finally:
        outside.kill()
        outside.wait()


def test_stop_ends_every_process_of_each_nodes_tree_and_waits_only_for_a_node_that_ignores_sigterm(
        fake_nodes, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ray_nodes, "STOP_GRACE_S", 0.3)
    nodes = [fake_nodes(0, "Head"), fake_nodes(1, "Worker"), fake_nodes(2, "Stubborn", on_term="''")]
    LocalRayCluster("127.0.0.1:1", str(tmp_path), "t", [node for node, _ in nodes]).save()
    everything = {pid for node, pids in nodes for pid in [node.pid, *pids.values()]}
    assert all(running(pid) for pid in everything) and all(node.alive() for node, _ in nodes)
    start = time.monotonic()
    assert ray_nodes.main(["stop", "--state", str(tmp_path)]) == 0
    took = time.monotonic() - start
    # the node ignoring SIGTERM had the whole grace period, then SIGKILL; the orphans of the nodes that
    # exited on SIGTERM (their session-leader children included) were listed before the first signal
    assert 0.3 <= took < 5.0, took
    # SIGKILL takes effect a moment after kill() returns: a few ms, at most seconds on a loaded machine
    assert eventually(lambda: not any(running(pid) for pid in everything)), [p for p in everything if running(p)]
    assert not any(node.alive() for node, _ in nodes)
    for node, _ in nodes:  # reaped by stop: no zombie of ours left behind
        with pytest.raises(ChildProcessError):
            os.waitpid(node.pid, os.WNOHANG)
    assert capsys.readouterr().err == ""


def test_a_node_whose_process_is_gone_or_a_zombie_is_not_alive(tmp_path):
    proc = subprocess.Popen(["true"])
    assert eventually(lambda: not running(proc.pid))  # exited, not yet reaped: a zombie
    assert Path(f"/proc/{proc.pid}").exists()
    assert not RayNode(0, proc.pid, "r", 1, "log").alive()
    proc.wait()
    assert not RayNode(0, proc.pid, "r", 1, "log").alive()
    assert RayNode(0, os.getpid(), "r", 1, "log").alive()


def test_a_process_whose_name_holds_a_parenthesis_is_read_from_the_last_one(tmp_path):
    # /proc/PID/stat: "pid (name) state ppid ...", and the name may itself hold ") R"
    for name, target in (("ray) R", "sleep"), ("node) R", "true")):
        executable = shutil.which(target)
        assert executable is not None
        (tmp_path / name).symlink_to(executable)
    parent = subprocess.Popen(["bash", "-c", '"$0" 60 & echo $!; wait', str(tmp_path / "ray) R")],
                              stdout=subprocess.PIPE, text=True)
    exited = subprocess.Popen([str(tmp_path / "node) R")])
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert eventually(lambda: Path(f"/proc/{child}/comm").read_text() == "ray) R\n")
        assert process_tree(parent.pid) == {parent.pid, child}
        assert eventually(lambda: Path(f"/proc/{exited.pid}/comm").read_text() == "node) R\n"
                          and not running(exited.pid))
        assert not RayNode(0, exited.pid, "r", 1, "log").alive()  # a zombie, whatever its name says
    finally:
        for pid in process_tree(parent.pid):
            os.kill(pid, signal.SIGKILL)
        parent.wait()
        exited.wait()


def test_reaping_waits_a_moment_for_a_node_to_exit_and_no_longer_than_its_bound(monkeypatch):
    monkeypatch.setattr(ray_nodes, "REAP_TIMEOUT_S", 0.2)
    exiting = subprocess.Popen(["sleep", "0.05"])
    start = time.monotonic()
    ray_nodes._reap(exiting.pid)
    assert time.monotonic() - start < 0.9  # polled often: not a second per node
    with pytest.raises(ChildProcessError):  # reaped
        os.waitpid(exiting.pid, os.WNOHANG)
    stuck = subprocess.Popen(["sleep", "60"])  # stands for a process stuck in the kernel
    try:
        start = time.monotonic()
        ray_nodes._reap(stuck.pid)
        assert 0.2 <= time.monotonic() - start < 5.0 and running(stuck.pid)
    finally:
        stuck.kill()
        stuck.wait()
    ray_nodes._reap(os.getppid())  # not a child of this process: nothing to wait for
