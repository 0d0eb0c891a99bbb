"""``setup_runtime`` (posttrain.algorithms.runtime) in this process: what it reports of where the
workers run. The same on a real two-node Ray cluster: tests/integration/test_multinode.py."""

from __future__ import annotations

from posttrain.algorithms.runtime import setup_runtime
from posttrain.config import ClusterConfig, GenerationConfig, ModelConfig, PolicyConfig
from posttrain.distributed.transport import InProcessTransport, InProcessWorkerGroup, WorkerGroup, use_transport
from posttrain.models.policy.base_policy_worker import PolicyWorkerBase

# Ray node ids are 56 hex digits; the runtime line names a node by its first 8
POLICY_NODE, ENGINE_NODE = "c0ffee12" + "0" * 48, "0badf00d" + "0" * 48
ADDRESSES = {POLICY_NODE: "10.0.0.1", ENGINE_NODE: "10.0.0.2"}


class NodeOfItsRole(InProcessWorkerGroup):
    """Workers in this process that say they run where Ray would put a policy on one node and its
    engines on another (``cluster.placement_strategy=STRICT_SPREAD`` on two nodes)."""

    def node_ids(self) -> list[str]:
        node = POLICY_NODE if isinstance(self.workers[0], PolicyWorkerBase) else ENGINE_NODE
        return [node] * len(self.workers)


class TwoNodes(InProcessTransport):
    def group(self, cluster, actor_cls, *args, bundle_indices=None, reserve=True, **kwargs) -> WorkerGroup:
        return NodeOfItsRole(cluster, actor_cls, *args, bundle_indices=bundle_indices, reserve=reserve, **kwargs)

    def node_addresses(self) -> dict[str, str]:
        return ADDRESSES


def test_the_runtime_line_and_placement_metrics_name_the_node_the_engine_reports(tiny_model_path, capsys):
    with use_transport(TwoNodes()):
        rt = setup_runtime(ModelConfig(path=tiny_model_path), PolicyConfig(), GenerationConfig(backend="hf"),
                           ClusterConfig(), seed=0)
    try:
        assert rt.placement == {"placement/num_nodes": 2.0, "placement/policy0_node": 0.0,
                                "placement/engine0_node": 1.0, "placement/engines_off_policy_node": 1.0}
        line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("runtime: "))
        assert line.endswith("; policy on node 0, engine on node 1 (node 0 = 10.0.0.1 c0ffee12, "
                             "node 1 = 10.0.0.2 0badf00d)"), line
    finally:
        rt.shutdown()
