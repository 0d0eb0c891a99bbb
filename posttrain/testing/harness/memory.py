"""Peak memory across the Ray cluster, GiB: what ``tracker.get_max_mem()`` reports.

- GPU nodes (NVML sees at least one device on some node): the largest ``used`` memory of any
  GPU of any node (NVML ``nvmlDeviceGetMemoryInfo``). NVML keeps no per-device high-water
  mark, so this is the usage at the call; PyTorch's caching allocator keeps freed blocks
  reserved, so it stays at the peak of reserved memory unless ``empty_cache()`` ran.
- CPU only: the sum of the peak resident set sizes (``VmHWM`` in ``/proc/PID/status``) of the
  driver and of every live Ray worker process of every node (and their child processes, e.g.
  an inference engine's). Peaks of different processes need not coincide, so the sum is an
  upper bound on the simultaneous peak; processes that already exited are not counted.

Each node is read by a zero-CPU Ray task pinned to it, so a cluster whose CPUs are all held
by actors is still measured. Without Ray, only this process (and local GPUs) is read.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

GIB = 1024**3
# Children of the raylet that are Ray's own services, not workers.
_RAY_SERVICE_TITLES = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


@dataclass
class NodeReading:
    """One node: GPU memory in use per device and the workers' peak RSS, GiB."""

    gpu_used_gib: list[float] = field(default_factory=list)
    workers_peak_rss_gib: float = 0.0
    num_workers: int = 0


def peak_rss_gib(pid: int | str = "self") -> float:
    """``VmHWM`` of a process, GiB; 0.0 if it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / GIB  # the kernel reports kB
    except (OSError, ValueError):
        pass
    return 0.0


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _parent(pid: int | str) -> int | None:
    try:
        # the command name (field 2) is the executable's file name: any bytes, spaces and parentheses
        # included (a name that is not UTF-8 must not drop the process from the tree): split after it
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _children_by_parent() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (ppid := _parent(entry)) is not None:
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def _is_uv_run(pid: int) -> bool:
    """Whether ``pid`` is a ``uv run ...``: Ray's uv integration (``RAY_ENABLE_UV_RUN_RUNTIME_ENV``,
    on by default under ``uv run``) starts each worker through one, between raylet and worker."""
    words = _cmdline(pid).split(" ", 2)
    return len(words) > 1 and os.path.basename(words[0]) == "uv" and words[1] == "run"


def ray_worker_pids(raylet_pid: int) -> list[int]:
    """Ray worker processes of one raylet (children titled ``ray::...``, or their children when
    started through ``uv run``) and their descendants."""
    tree = _children_by_parent()
    children = [c for p in tree.get(raylet_pid, []) for c in (tree.get(p, []) if _is_uv_run(p) else [p])]
    workers = [p for p in children
               if _cmdline(p).startswith("ray::") and not _cmdline(p).startswith(_RAY_SERVICE_TITLES)]
    found, stack = [], list(workers)
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(tree.get(pid, []))
    return found


def gpu_used_gib() -> list[float]:
    """Memory in use on each GPU this node's NVML sees, GiB; [] without pynvml or a driver."""
    try:
        import pynvml  # type: ignore[import-untyped]
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        return [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used / GIB
                for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


def read_this_node(raylet_pid: int | None) -> NodeReading:
    """GPU usage and (when ``raylet_pid`` is given) the Ray workers' peak RSS on this node."""
    pids = ray_worker_pids(raylet_pid) if raylet_pid else []
    return NodeReading(gpu_used_gib(), sum(peak_rss_gib(p) for p in pids), len(pids))


def _read_worker_node() -> NodeReading:
    parent = os.getppid()  # the raylet, or the `uv run` that Ray's uv integration put in between
    return read_this_node((_parent(parent) or parent) if _is_uv_run(parent) else parent)


def _read_ray_nodes() -> list[NodeReading]:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # Workers may not have tests/ on sys.path: ship this module's code with the task.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # A Ray worker's parent is its node's raylet (or a `uv run` whose parent is).
    remote = ray.remote(num_cpus=0)(_read_worker_node)
    refs = [remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote()
            for node in ray.nodes() if node["Alive"]]
    return ray.get(refs)


def max_mem_gib() -> float:
    """Peak memory across the Ray cluster (or this process without Ray), GiB; see the module doc.

    Returns a value > 0 on any Linux machine (the driver's own RSS at least).
    """
    ray = sys.modules.get("ray")
    nodes = _read_ray_nodes() if ray is not None and ray.is_initialized() else [read_this_node(None)]
    gpus = [used for node in nodes for used in node.gpu_used_gib]
    if gpus:
        return max(gpus)
    return peak_rss_gib() + sum(node.workers_peak_rss_gib for node in nodes)
