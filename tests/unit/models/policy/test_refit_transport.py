"""Which way a refit goes (``choose_refit_transport``): every placement of policy and engines."""

import pytest

from posttrain.weight_sync.transport import choose_refit_transport


@pytest.mark.parametrize(("policy", "engines", "expected"), [
    ("A", ["A"], "cuda_ipc"),  # colocated on one GPU
    ("A", ["A", "A"], "cuda_ipc"),
    ("A", ["B"], "broadcast"),  # NCCL, one GPU each
    ("A", ["B", "C"], "broadcast"),
    (None, [None], "broadcast"),  # gloo on CPUs
    (None, [None, None], "broadcast"),
    ("A", ["A", "B"], "object_store"),  # NCCL cannot have two ranks on one GPU
    ("A", ["B", "B"], "object_store"),
    ("A", [None], "object_store"),  # a GPU policy and a CPU engine
    (None, ["A"], "object_store"),
])
def test_auto_picks_ipc_on_one_gpu_a_broadcast_between_distinct_devices_else_the_object_store(policy, engines,
                                                                                               expected):
    assert choose_refit_transport("auto", policy, engines) == expected


@pytest.mark.parametrize(("policy", "engines"), [("A", ["A"]), ("A", ["B"]), (None, [None])])
def test_object_store_is_used_whenever_the_setting_says_so(policy, engines):
    assert choose_refit_transport("object_store", policy, engines) == "object_store"


def test_a_cpu_worker_reports_no_gpu_even_where_cuda_is_visible():
    """On a GPU machine a CPU worker's process sees the GPU too; its tensors are not there,
    so it must not be taken for a colocated worker (CUDA IPC)."""
    from posttrain.weight_sync.transport import gpu_uuid

    assert gpu_uuid("cpu") is None
