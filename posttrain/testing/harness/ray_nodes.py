"""A real multi-node Ray cluster on one machine: a head and worker nodes, each its own ``ray start``.

Every node is a ``ray start --block`` process of its own (its own raylet, object store and
ports), started in a new session. Teardown signals exactly the processes of that node's tree
(SIGTERM to the ``ray start`` process, which stops its node; then SIGKILL to any process of
its tree, listed before the first signal, that outlived the grace period).
Nothing is ever killed by name and ``ray stop`` is never run: other Ray clusters on the machine
are left alone. Each node carries a custom resource naming it (``posttrain_node_<i>: 1``), so a
test can tell the nodes apart in ``ray.nodes()`` and pin work to one of them.

Used by the ``ray_nodes`` fixture (``plugin.py``) and by the functional scripts, through the
command line::

    python -m posttrain.testing.harness.ray_nodes start --nodes 2 --num-cpus 1 --state DIR
    python -m posttrain.testing.harness.ray_nodes stop --state DIR

``start`` prints the head's address (``ip:port``) and writes ``DIR/nodes.json`` and
``DIR/auth_token``; ``stop`` reads them. The cluster has a token of its own (Ray 2.5x's token
authentication): a driver joins it with ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` set to
``DIR/auth_token``'s content (:meth:`LocalRayCluster.client_env`), never through
``~/.ray/auth_token``, which other clusters on the machine may rewrite at any time. Imports
neither Ray nor torch (the ``ray`` command line does the work).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

NODE_RESOURCE = "posttrain_node_{}"  # the custom resource that names node i (head: 0)
STATE_FILE = "nodes.json"
TOKEN_FILE = "auth_token"
# Ray's own start-up is ~5-15 s a node on a quiet 2-core machine; a busy one needs more.
DEFAULT_START_TIMEOUT_S = 120.0
STOP_GRACE_S = 20.0
REAP_TIMEOUT_S = 5.0  # SIGKILL to exit; more only for a process stuck in the kernel
STOP_POLL_S = 0.2  # how often `stop` looks whether the nodes exited on SIGTERM
WAIT_POLL_S = 1.0  # how often a start asks the GCS which nodes joined (each ask starts a Python driver)
# one ask of the GCS: a driver that hangs longer (a GCS not answering yet) counts as "none joined yet"
QUERY_TIMEOUT_S = 120.0


@dataclass
class RayNode:
    """One started node: its index (0: the head), the ``ray start`` process's pid (also its
    process group), its custom resource and where its output goes."""

    index: int
    pid: int
    resource: str
    num_cpus: int
    log: str

    @property
    def is_head(self) -> bool:
        return self.index == 0

    def alive(self) -> bool:
        """Whether the node's ``ray start`` process still runs (not a zombie)."""
        try:
            # bytes: a process's name (in parentheses, before the state) need not be UTF-8
            status = Path(f"/proc/{self.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            return False
        return status != b"Z"


@dataclass
class LocalRayCluster:
    """Nodes of one Ray cluster on this machine (see the module doc).

    Attributes:
        address: the head's GCS address (``ip:port``), for ``ray.init(address=...)`` or
            ``cluster.address=...``.
        nodes: the started nodes, head first.
        state_dir: where the nodes' logs and ``nodes.json`` are.
    """

    address: str
    state_dir: str
    auth_token: str
    nodes: list[RayNode] = field(default_factory=list)

    @property
    def workers(self) -> list[RayNode]:
        """The nodes other than the head."""
        return [node for node in self.nodes if not node.is_head]

    def actor_pid(self, actor_class: str) -> tuple[int, int]:
        """``(node index, pid)`` of the one process of this cluster's nodes that holds an actor of
        class ``actor_class`` (Ray titles an actor's process ``ray::<Class>`` or
        ``ray::<Class>.<method>``). Only the nodes' own process trees are looked at, so no process
        of another cluster on the machine can be picked.

        Raises:
            LookupError: no such process, or several (the caller would not know which to kill).
        """
        found = []
        for index, node in enumerate(self.nodes):
            for pid in sorted(process_tree(node.pid)):
                try:
                    title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                except OSError:
                    continue
                if title == f"ray::{actor_class}" or title.startswith(f"ray::{actor_class}."):
                    found.append((index, pid))
        if len(found) != 1:
            raise LookupError(f"{len(found)} processes of actor class {actor_class} on the cluster's nodes: {found}")
        return found[0]

    def raylet_pid(self, index: int) -> int:
        """The pid of node ``index``'s raylet (in that node's own process tree).

        Raises:
            LookupError: the node has no live raylet.
        """
        for pid in sorted(process_tree(self.nodes[index].pid)):
            try:
                if Path(f"/proc/{pid}/comm").read_bytes().strip() == b"raylet":
                    return pid
            except OSError:
                continue
        raise LookupError(f"node {index} has no live raylet")

    def save(self) -> None:
        """Write ``nodes.json`` (what ``stop`` needs) and ``auth_token`` into the state directory."""
        Path(self.state_dir, STATE_FILE).write_text(json.dumps(asdict(self), indent=1))
        Path(self.state_dir, TOKEN_FILE).write_text(self.auth_token)

    def client_env(self) -> dict[str, str]:
        """This process's environment for a driver of this cluster: its address and its token."""
        # Token mode explicitly: left unset, `ray start` turns it on only where a token file exists and a
        # joining driver may not send one; RAY_AUTH_TOKEN wins over any token file
        env = {**os.environ, "RAY_ADDRESS": self.address, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.auth_token,
               "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
        env.pop("RAY_AUTH_TOKEN_PATH", None)
        return env

    @classmethod
    def load(cls, state_dir: str) -> LocalRayCluster:
        """The cluster ``start`` recorded in ``state_dir``.

        Raises:
            FileNotFoundError: ``state_dir`` holds no ``nodes.json``.
        """
        data = json.loads(Path(state_dir, STATE_FILE).read_text())
        return cls(data["address"], data["state_dir"], data["auth_token"], [RayNode(**node) for node in data["nodes"]])

    def stop(self) -> None:
        """Stop every node by its own pids: SIGTERM to each ``ray start`` (workers first, the head
        last), which stops its node; then SIGKILL to whatever of its process tree is left after the
        grace period. The tree (the raylet, the GCS, the agents, and the worker processes the raylet
        spawned, which run in sessions of their own) is listed before any signal: once the raylet
        is gone its orphaned workers no longer descend from the node."""
        trees = {node.pid: process_tree(node.pid) for node in self.nodes}
        for node in reversed(self.nodes):
            _signal(node.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while any(node.alive() for node in self.nodes) and time.monotonic() < deadline:
            time.sleep(STOP_POLL_S)
        for node in self.nodes:
            for pid in trees[node.pid] | process_tree(node.pid):
                _signal(pid, signal.SIGKILL)
            _reap(node.pid)


def process_tree(pid: int) -> set[int]:
    """``pid`` and every live process descended from it (from ``/proc/<pid>/stat``'s parent ids)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # bytes: a process's name (its executable's, or one it gave itself) need not be UTF-8, and such
            # a process must not drop out of the tree that teardown kills
            parent = int((entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # it exited while we looked
        children.setdefault(parent, []).append(int(entry.name))
    tree, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current not in tree:
            tree.add(current)
            todo.extend(children.get(current, []))
    return tree


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(pid: int) -> None:
    # A node just sent SIGKILL exits a moment later: wait for it (bounded), or it stays our zombie
    deadline = time.monotonic() + REAP_TIMEOUT_S
    while True:
        try:
            reaped, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return  # reaped, or not our child (a cluster started by another process, e.g. the functional script's)
        if reaped or time.monotonic() > deadline:
            return
        time.sleep(0.01)


def free_port() -> int:
    """A TCP port free on this machine now (the head's GCS port)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _ray_executable() -> str:
    # the ray of this interpreter's environment (a venv's bin/), not whichever is first on PATH
    candidate = Path(sys.executable).parent / "ray"
    return str(candidate) if candidate.exists() else "ray"


def _start_node(index: int, state_dir: Path, num_cpus: int, object_store_mb: int, head_address: str | None,
                port: int | None, env: dict[str, str]) -> RayNode:
    resource = NODE_RESOURCE.format(index)
    log = state_dir / f"node{index}.log"
    cmd = [_ray_executable(), "start", "--block", "--disable-usage-stats", f"--num-cpus={num_cpus}", "--num-gpus=0",
           f"--object-store-memory={object_store_mb * 1024 * 1024}", f"--resources={json.dumps({resource: 1})}",
           # ports Ray would otherwise take at a fixed number: another cluster on the machine may hold them
           f"--dashboard-agent-listen-port={free_port()}"]
    if head_address is None:
        cmd += ["--head", f"--port={port}", "--include-dashboard=false", f"--ray-client-server-port={free_port()}"]
    else:
        cmd += [f"--address={head_address}"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    return RayNode(index, proc.pid, resource, num_cpus, str(log))


def _registered_nodes(address: str, env: dict[str, str]) -> set[str]:
    """The custom ``posttrain_node_*`` resources of the cluster's alive nodes (``ray status`` would
    need the dashboard; a short driver asks the GCS). Empty when the driver fails or outlives
    ``QUERY_TIMEOUT_S``."""
    code = ("import json, sys, ray; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
            "print(json.dumps([k for n in ray.nodes() if n['Alive'] for k in n['Resources'] "
            "if k.startswith('posttrain_node_')]))")
    try:
        out = subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True, env=env,
                             timeout=QUERY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return set()
    if out.returncode != 0:
        return set()
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def start_cluster(nodes: int, state_dir: str | Path, num_cpus: int = 1, object_store_mb: int = 256,
                  timeout_s: float = DEFAULT_START_TIMEOUT_S) -> LocalRayCluster:
    """Start a head and ``nodes - 1`` worker nodes, each with ``num_cpus`` logical CPUs and its own
    object store of ``object_store_mb`` MiB, and wait until all have joined.

    Raises:
        ValueError: ``nodes`` < 1 or ``num_cpus`` < 0.
        RuntimeError: a node's ``ray start`` exited, or not every node joined within ``timeout_s``
            (the nodes started so far are stopped first; the message names the log to read).
    """
    if nodes < 1 or num_cpus < 0:
        raise ValueError(f"a cluster needs nodes >= 1 and num_cpus >= 0, got nodes={nodes}, num_cpus={num_cpus}")
    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    address = f"127.0.0.1:{free_port()}"  # the head's GCS listens on every interface; loopback needs no network
    cluster = LocalRayCluster(address, str(state), secrets.token_hex(32))
    env = {**cluster.client_env(), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS")  # `ray start` takes the address as an argument
    try:
        cluster.nodes.append(_start_node(0, state, num_cpus, object_store_mb, None, int(address.split(":")[1]), env))
        cluster.save()  # from here on `stop` can find what runs, whatever happens next
        _wait_for(cluster, {cluster.nodes[0].resource}, env, timeout_s)
        for index in range(1, nodes):
            cluster.nodes.append(_start_node(index, state, num_cpus, object_store_mb, address, None, env))
            cluster.save()
        _wait_for(cluster, {node.resource for node in cluster.nodes}, env, timeout_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_for(cluster: LocalRayCluster, resources: set[str], env: dict[str, str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        dead = [node for node in cluster.nodes if not node.alive()]
        if dead:
            raise RuntimeError(f"ray start of node {dead[0].index} exited; see {dead[0].log}")
        if resources <= _registered_nodes(cluster.address, env):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Ray nodes {sorted(resources)} did not all join {cluster.address} within "
                               f"{timeout_s:g} s; see {cluster.state_dir}/node*.log")
        time.sleep(WAIT_POLL_S)


def main(argv: list[str] | None = None) -> int:
    """The command line (``start`` / ``stop``; see the module doc). Exit 2 on bad arguments or a
    ``stop`` without a recorded cluster, 1 when a node did not start (one line naming its log)."""
    parser = argparse.ArgumentParser(prog="python -m posttrain.testing.harness.ray_nodes",
                                     description="start or stop a multi-node Ray cluster on this machine")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start the nodes; print the head's address")
    start.add_argument("--nodes", type=int, default=2)
    start.add_argument("--num-cpus", type=int, default=1, help="logical CPUs of each node")
    start.add_argument("--object-store-mb", type=int, default=256)
    start.add_argument("--state", required=True, help="directory for nodes.json and the nodes' logs")
    stop = sub.add_parser("stop", help="stop the nodes recorded in --state")
    stop.add_argument("--state", required=True)
    args = parser.parse_args(argv)
    if args.command == "start":
        if args.nodes < 1 or args.num_cpus < 0:
            parser.error(f"--nodes must be >= 1 and --num-cpus >= 0, got {args.nodes} and {args.num_cpus}")
        try:
            cluster = start_cluster(args.nodes, args.state, args.num_cpus, args.object_store_mb)
        except RuntimeError as exc:  # a node did not start or join (already stopped): one line
            print(f"ray_nodes start: {exc}", file=sys.stderr)
            return 1
        print(cluster.address, flush=True)
        return 0
    try:
        LocalRayCluster.load(args.state).stop()
    except FileNotFoundError:
        print(f"ray_nodes stop: no {STATE_FILE} in {args.state} (nothing started there)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
