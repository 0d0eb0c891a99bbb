"""Placement across nodes: which strategies a cluster's nodes can hold (pure, no Ray), where the
workers went (the metrics and the runtime line's words), and the strategy on a real Ray
placement group (the session's one-node cluster)."""

import pytest

from posttrain.distributed.node_placement import check_placement, describe_placement, placement_metrics
from posttrain.errors import ConfigError

ONE_CPU = {"CPU": 1.0}
TWO_NODES = [{"CPU": 1.0, "memory": 1e9}, {"CPU": 1.0}]


@pytest.mark.parametrize("strategy", ["PACK", "SPREAD", "STRICT_SPREAD"])
def test_two_bundles_fit_two_one_cpu_nodes_under_every_strategy_but_strict_pack(strategy):
    check_placement(strategy, ONE_CPU, 2, TWO_NODES)


def test_strict_spread_needs_a_node_per_bundle():
    with pytest.raises(ConfigError) as err:
        check_placement("STRICT_SPREAD", {"CPU": 0.5}, 3, TWO_NODES)
    assert str(err.value) == ("cluster.placement_strategy=STRICT_SPREAD needs 3 nodes that can each hold a bundle "
                              "{'CPU': 0.5} (one per worker), the Ray cluster has 2 (of 2 nodes)")
    # a node too small for one bundle does not count as one
    with pytest.raises(ConfigError, match=r"has 1 \(of 2 nodes\)"):
        check_placement("STRICT_SPREAD", ONE_CPU, 2, [{"CPU": 1.0}, {"CPU": 0.5}])
    check_placement("STRICT_SPREAD", {"CPU": 0.5}, 2, TWO_NODES)


def test_strict_pack_needs_one_node_that_holds_every_bundle():
    with pytest.raises(ConfigError, match=r"^cluster.placement_strategy=STRICT_PACK needs one node that holds all 2 "
                                          r"bundles \{'CPU': 1.0\}, and no node of the Ray cluster \(2 nodes\) does$"):
        check_placement("STRICT_PACK", ONE_CPU, 2, TWO_NODES)
    check_placement("STRICT_PACK", {"CPU": 0.5}, 2, TWO_NODES)


def test_a_bundle_larger_than_every_node_is_refused_whatever_the_strategy():
    for strategy in ("PACK", "SPREAD"):
        with pytest.raises(ConfigError, match=f"^cluster.placement_strategy={strategy}: no node of the Ray cluster "
                                              r"\(2 nodes\) can hold one bundle \{'CPU': 1.0, 'GPU': 1.0\}$"):
            check_placement(strategy, {"CPU": 1.0, "GPU": 1.0}, 1, TWO_NODES)


def test_placement_metrics_number_the_nodes_from_policy_rank_0s():
    assert placement_metrics(["a"], ["b"]) == {"placement/num_nodes": 2.0, "placement/policy0_node": 0.0,
                                               "placement/engine0_node": 1.0, "placement/engines_off_policy_node": 1.0}
    assert placement_metrics(["a"], ["a"]) == {"placement/num_nodes": 1.0, "placement/policy0_node": 0.0,
                                               "placement/engine0_node": 0.0, "placement/engines_off_policy_node": 0.0}
    # two policy ranks on two nodes, engines on the second node and a third
    metrics = placement_metrics(["b", "a"], ["a", "c"])
    assert metrics == {"placement/num_nodes": 3.0, "placement/policy0_node": 0.0, "placement/policy1_node": 1.0,
                       "placement/engine0_node": 1.0, "placement/engine1_node": 2.0,
                       "placement/engines_off_policy_node": 2.0}
    assert placement_metrics(["a"], []) == {"placement/num_nodes": 1.0, "placement/policy0_node": 0.0,
                                            "placement/engines_off_policy_node": 0.0}


def test_the_runtime_lines_placement_names_each_node_by_ip_and_id():
    addresses = {"c0ffee1234": "10.0.0.1", "0badf00d99": "10.0.0.2"}
    assert describe_placement(["c0ffee1234"], ["0badf00d99"], addresses) == (
        "policy on node 0, engine on node 1 (node 0 = 10.0.0.1 c0ffee12, node 1 = 10.0.0.2 0badf00d)")
    assert describe_placement(["c0ffee1234", "0badf00d99"], ["c0ffee1234", "c0ffee1234"], addresses) == (
        "policy ranks on nodes 0, 1, engines on node 0 (node 0 = 10.0.0.1 c0ffee12, node 1 = 10.0.0.2 0badf00d)")
    assert describe_placement(["in-process"], ["in-process"], {}) == (
        "policy on node 0, engine on node 0 (node 0 = in-process)")


def test_the_strategy_reaches_the_placement_group(ray_cluster):
    import ray

    from posttrain.distributed.ray_cluster import RayVirtualCluster

    for strategy in ("SPREAD", "STRICT_PACK"):
        cluster = RayVirtualCluster(2, num_cpus=0.5, strategy=strategy)
        try:
            assert ray.util.placement_group_table(cluster.placement_group)["strategy"] == strategy
        finally:
            cluster.shutdown()


def test_a_strategy_the_nodes_cannot_hold_is_refused_before_anything_is_reserved(ray_cluster):
    import ray

    from posttrain.distributed.ray_cluster import RayVirtualCluster

    before = set(ray.util.placement_group_table())
    with pytest.raises(ConfigError, match=r"^cluster.placement_strategy=STRICT_SPREAD needs 2 nodes that can each "
                                          r"hold a bundle \{'CPU': 0.5\} \(one per worker\), the Ray cluster has 1 "
                                          r"\(of 1 nodes\)$"):
        RayVirtualCluster(2, num_cpus=0.5, strategy="STRICT_SPREAD", timeout_s=5)
    assert set(ray.util.placement_group_table()) == before  # no group reserved, none left pending
