"""Which nodes a run's bundles can go to, and which nodes its workers went to.

:func:`check_placement` refuses, in one line and before any bundle is reserved, a placement
group strategy the cluster's nodes cannot satisfy (``STRICT_SPREAD`` with more bundles than
nodes that can hold one; ``STRICT_PACK`` where no node holds them all): Ray itself would
leave such a group pending forever. :func:`placement_metrics` and :func:`describe_placement`
say where the workers run, for the metrics and the run's ``runtime:`` line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from posttrain.errors import ConfigError

PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
IN_PROCESS_NODE = "in-process"  # the one "node" of workers that run in the driver's process
_SLACK = 1e-9  # resource amounts are floats (fractions of a CPU)


def _fits(bundle: Mapping[str, float], times: int, node: Mapping[str, float]) -> bool:
    return all(amount * times <= node.get(resource, 0.0) + _SLACK for resource, amount in bundle.items())


def check_placement(strategy: str, bundle: Mapping[str, float], num_bundles: int,
                    nodes: Sequence[Mapping[str, float]]) -> None:
    """Refuse a reservation of ``num_bundles`` x ``bundle`` under ``strategy`` that the ``nodes``
    (each node's total resources, alive nodes only) can never hold.

    Totals, not what is free now: a shortage that frees up later is the placement group's
    ready() timeout's to report, whereas a layout no node set can take is a configuration error.

    Raises:
        ConfigError: one line naming ``cluster.placement_strategy=<strategy>``, what it needs and
            what the cluster has: STRICT_SPREAD with fewer nodes able to hold one bundle than
            bundles; STRICT_PACK with no node able to hold every bundle; any strategy with a
            bundle larger than every node.
    """
    key = f"cluster.placement_strategy={strategy}"
    holding_one = sum(_fits(bundle, 1, node) for node in nodes)
    shown = dict(bundle)
    if holding_one == 0:
        raise ConfigError(f"{key}: no node of the Ray cluster ({len(nodes)} nodes) can hold one bundle {shown}")
    if strategy == "STRICT_SPREAD" and holding_one < num_bundles:
        raise ConfigError(f"{key} needs {num_bundles} nodes that can each hold a bundle {shown} (one per worker), "
                          f"the Ray cluster has {holding_one} (of {len(nodes)} nodes)")
    if strategy == "STRICT_PACK" and not any(_fits(bundle, num_bundles, node) for node in nodes):
        raise ConfigError(f"{key} needs one node that holds all {num_bundles} bundles {shown}, and no node of the "
                          f"Ray cluster ({len(nodes)} nodes) does")


def alive_node_resources() -> list[dict[str, float]]:
    """Each alive node's total resources, from the GCS (``ray.nodes()``; needs Ray initialized)."""
    import ray

    return [dict(node["Resources"]) for node in ray.nodes() if node["Alive"]]


def node_addresses() -> dict[str, str]:
    """Node id -> its IP address, for every node Ray knows (needs Ray initialized)."""
    import ray

    return {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}


def _node_order(policy_nodes: Sequence[str], engine_nodes: Sequence[str]) -> list[str]:
    # node 0 is policy rank 0's, then each other node in the order the workers name it
    return list(dict.fromkeys([*policy_nodes, *engine_nodes]))


def placement_metrics(policy_nodes: Sequence[str], engine_nodes: Sequence[str]) -> dict[str, float]:
    """The run's placement as metrics: ``placement/num_nodes`` (nodes the workers span),
    ``placement/policy<r>_node`` and ``placement/engine<r>_node`` (each worker's node, as its
    number in :func:`describe_placement`'s list: node 0 holds policy rank 0), and
    ``placement/engines_off_policy_node`` (engines on another node than policy rank 0: a refit to
    them crosses nodes)."""
    order = _node_order(policy_nodes, engine_nodes)
    metrics = {"placement/num_nodes": float(len(order))}
    metrics.update({f"placement/policy{rank}_node": float(order.index(n)) for rank, n in enumerate(policy_nodes)})
    metrics.update({f"placement/engine{rank}_node": float(order.index(n)) for rank, n in enumerate(engine_nodes)})
    metrics["placement/engines_off_policy_node"] = float(sum(n != policy_nodes[0] for n in engine_nodes))
    return metrics


def describe_placement(policy_nodes: Sequence[str], engine_nodes: Sequence[str],
                       addresses: Mapping[str, str]) -> str:
    """``policy on node 0, engine on node 1 (node 0 = 10.0.0.1 c0ffee12, node 1 = 10.0.0.2 0badf00d)``:
    each worker's node (ranks listed when a side has several), each node by IP and the first 8
    characters of its Ray node id."""
    order = _node_order(policy_nodes, engine_nodes)

    def side(one: str, many: str, nodes: Sequence[str]) -> str:
        numbers = [str(order.index(n)) for n in nodes]
        if len(set(numbers)) == 1:
            return f"{one if len(nodes) == 1 else many} on node {numbers[0]}"
        return f"{many} on nodes {', '.join(numbers)}"

    parts = [side("policy", "policy ranks", policy_nodes)]
    if engine_nodes:
        parts.append(side("engine", "engines", engine_nodes))
    names = ", ".join(f"node {i} = {addresses.get(n, n)} {n[:8]}" if n != IN_PROCESS_NODE else f"node {i} = {n}"
                      for i, n in enumerate(order))
    return f"{', '.join(parts)} ({names})"
