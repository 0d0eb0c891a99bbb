"""examples/kuberay/rayjob.yaml holds the fields posttrain relies on, checked against a small
hand-written schema of them (kubectl's --dry-run=client cannot check it offline: a RayJob is a
custom resource, whose kind kubectl learns from a live API server), and its entry point is a valid
posttrain run. The schema checker is tested to refuse broken manifests, so the check can fail.
"""

from __future__ import annotations

import copy
import shlex
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml

from posttrain.algorithms.grpo_config import GRPOMasterConfig
from posttrain.config import load_config

REPO = Path(__file__).resolve().parents[3]
MANIFEST = REPO / "examples" / "kuberay" / "rayjob.yaml"
STR_MAP = {str: str}  # rayStartParams: KubeRay's map[string]string (a number must be quoted)
CONTAINERS = {"containers": [{"name": str, "image": str, "workingDir": str}]}
# A dict lists required keys (others allowed); a type is an isinstance check; a list [S] is a
# non-empty list whose items match S; {str: T} is a mapping of strings to T; any other value must be equal.
SCHEMA: dict[Any, Any] = {
    "apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": str},
    "spec": {
        "entrypoint": str, "shutdownAfterJobFinishes": bool, "runtimeEnvYAML": str,
        "rayClusterSpec": {
            "rayVersion": str,
            "headGroupSpec": {"rayStartParams": STR_MAP, "template": {"spec": CONTAINERS}},
            "workerGroupSpecs": [{"groupName": str, "replicas": int, "minReplicas": int, "maxReplicas": int,
                                  "rayStartParams": STR_MAP, "template": {"spec": CONTAINERS}}],
        },
    },
}


def mismatches(value: Any, schema: Any, path: str = "") -> list[str]:
    """Where ``value`` differs from ``schema`` (see SCHEMA's comment), one entry per difference."""
    if isinstance(schema, dict) and set(schema) == {str}:
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping, got {type(value).__name__}"]
        return [m for key, item in value.items()
                for m in ([f"{path}.{key}: key is not a string"] if not isinstance(key, str) else [])
                + mismatches(item, schema[str], f"{path}.{key}")]
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping, got {type(value).__name__}"]
        return [m for key, sub in schema.items()
                for m in (mismatches(value[key], sub, f"{path}.{key}") if key in value else [f"{path}.{key}: missing"])]
    if isinstance(schema, list):
        if not isinstance(value, list) or not value:
            return [f"{path}: expected a non-empty list"]
        return [m for i, item in enumerate(value) for m in mismatches(item, schema[0], f"{path}[{i}]")]
    if isinstance(schema, type):
        # a YAML boolean is no int here (isinstance(True, int) holds in Python)
        ok = isinstance(value, schema) and not (schema is int and isinstance(value, bool))
        return [] if ok else [f"{path}: expected {schema.__name__}, got {value!r}"]
    return [] if value == schema else [f"{path}: expected {schema!r}, got {value!r}"]


def manifest() -> dict[str, Any]:
    return yaml.safe_load(MANIFEST.read_text())


def test_the_manifest_has_every_field_posttrain_relies_on():
    assert mismatches(manifest(), SCHEMA) == []


@pytest.mark.parametrize(("path", "value", "expected"), [
    (("spec", "entrypoint"), None, ".spec.entrypoint: missing"),
    (("kind",), "RayCluster", ".kind: expected 'RayJob', got 'RayCluster'"),
    (("spec", "rayClusterSpec", "headGroupSpec", "rayStartParams", "num-cpus"), 0,
     ".spec.rayClusterSpec.headGroupSpec.rayStartParams.num-cpus: expected str, got 0"),
    (("spec", "rayClusterSpec", "workerGroupSpecs"), [], ".spec.rayClusterSpec.workerGroupSpecs: expected a non-empty"),
    (("spec", "shutdownAfterJobFinishes"), "yes", ".spec.shutdownAfterJobFinishes: expected bool, got 'yes'"),
])
def test_the_schema_check_refuses_a_broken_manifest(path, value, expected):
    broken = copy.deepcopy(manifest())
    parent = broken
    for key in path[:-1]:
        parent = parent[key]
    if value is None:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    found = mismatches(broken, SCHEMA)
    assert len(found) == 1 and found[0].startswith(expected), found


def test_the_cluster_runs_the_ray_version_posttrain_is_locked_to():
    # a Ray client and cluster of different versions refuse each other
    assert manifest()["spec"]["rayClusterSpec"]["rayVersion"] == version("ray")


def test_the_entry_point_is_a_valid_run_with_policy_and_engine_on_different_nodes(tmp_path):
    argv = shlex.split(manifest()["spec"]["entrypoint"])
    assert argv[:2] == ["python", "examples/run_grpo.py"] and argv[2] == "--config"
    assert (REPO / argv[1]).is_file()
    overrides = [arg.replace("/tmp/posttrain-logs", str(tmp_path)) for arg in argv[4:]]
    cfg = load_config(REPO / argv[3], overrides, GRPOMasterConfig)
    assert cfg.cluster.placement_strategy == "STRICT_SPREAD" and not cfg.generation.colocated
    assert cfg.cluster.address is None  # joined through RAY_ADDRESS, which Ray's job runner sets
    workers = manifest()["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    gpus = [int(group["rayStartParams"]["num-gpus"]) for group in workers for _ in range(group["replicas"])]
    # STRICT_SPREAD: a node per bundle (the policy's and the engine's), each with the GPU it asks for
    assert sum(gpu >= cfg.cluster.gpus_per_worker for gpu in gpus) >= 1 + cfg.generation.num_workers
