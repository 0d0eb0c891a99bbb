"""The pytest harness of posttrain's test tiers, one job per module; a pytest plugin that any
project can turn on.

Installing posttrain registers ``plugin`` with pytest (entry point ``pytest11``, name
``posttrain``); it stays inert until the project's pytest ini says ``posttrain_harness = true``
(posttrain's own ``pyproject.toml`` does), so installing the library changes no other test
suite. ``posttrain_configurations`` (default ``tests/configurations.toml``, relative to the
rootdir) names the run_unit.sh table that the deselection report points at.

- ``configurations``: the run_unit.sh configuration table and the decision it drives.
- ``machine``: GPU count, GPU names, CPU model.
- ``selection``: ``gpu(n)`` skips, deselection report, "nothing ran" exit status.
- ``memory``: peak memory across the Ray cluster (NVML on GPU nodes, VmHWM on CPU).
- ``tracker``: the ``tracker`` fixture's object (metrics per test).
- ``results``: ``unit_results.json`` (and its timestamped archive copy).
- ``ray_leaks``: actors / placement groups a test left alive make it error.
- ``shards``: ``--shard I/N``, duration-balanced parts of the selected tests (a module stays whole).
- ``repeat``: ``run_unit.sh --repeat N``, the tests N times in fresh processes, a pass-rate table (flake hunting).
- ``merge``: ``python -m posttrain.testing.harness.merge``: shards' unit_results.json and coverage into one.
- ``remote_testmon``: with ``--testmon``, re-selects tests whose code runs inside Ray actors (a static import map).
- ``parallel``: ``-n N`` (pytest-xdist): worker threads, heaviest modules first, what workers hand the controller.
- ``plugin``: the pytest hooks and the ``tracker`` and ``repeat_index`` fixtures.

Nothing here imports torch or Ray at import time: pure-Python tests pay for neither.
"""
