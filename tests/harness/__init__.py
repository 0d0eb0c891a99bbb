"""The pytest harness of posttrain's test tiers, one job per module.

- ``configurations``: the run_unit.sh configuration table and the decision it drives.
- ``machine``: GPU count, GPU names, CPU model.
- ``selection``: ``gpu(n)`` skips, deselection report, "nothing ran" exit status.
- ``memory``: peak memory across the Ray cluster (NVML on GPU nodes, VmHWM on CPU).
- ``tracker``: the ``tracker`` fixture's object (metrics per test).
- ``results``: ``unit_results.json`` (and its timestamped archive copy).
- ``ray_leaks``: actors / placement groups a test left alive make it error.
- ``plugin``: the pytest hooks; registered from ``tests/conftest.py``.

Nothing here imports torch or Ray at import time: pure-Python tests pay for neither.
"""
