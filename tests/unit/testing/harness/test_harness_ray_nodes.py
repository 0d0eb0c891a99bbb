"""posttrain.testing.harness.ray_nodes without starting Ray: its command line's refusals, the
record ``stop`` reads, and the process tree teardown signals (the real cluster:
tests/integration/test_multinode.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from posttrain.testing.harness import ray_nodes
from posttrain.testing.harness.ray_nodes import LocalRayCluster, RayNode, process_tree


def test_bad_arguments_are_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        ray_nodes.main(["start", "--nodes", "0", "--state", "x"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("--nodes must be >= 1 and --num-cpus >= 0, "
                                                                     "got 0 and 1")
    with pytest.raises(ValueError, match="nodes >= 1"):
        ray_nodes.start_cluster(0, "unused")


def test_stop_without_a_recorded_cluster_is_one_line_and_exit_2(tmp_path, capsys):
    assert ray_nodes.main(["stop", "--state", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"ray_nodes stop: no nodes.json in {tmp_path} (nothing started there)\n"


def test_the_record_holds_what_stop_needs(tmp_path):
    cluster = LocalRayCluster("127.0.0.1:1234", str(tmp_path), "t0ken",
                              [RayNode(0, 11, "posttrain_node_0", 1, "n0.log"), RayNode(1, 12, "posttrain_node_1", 1,
                                                                                       "n1.log")])
    cluster.save()
    assert LocalRayCluster.load(str(tmp_path)) == cluster
    assert (tmp_path / "auth_token").read_text() == "t0ken"
    env = cluster.client_env()
    assert (env["RAY_ADDRESS"], env["RAY_AUTH_MODE"], env["RAY_AUTH_TOKEN"]) == ("127.0.0.1:1234", "token", "t0ken")
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
