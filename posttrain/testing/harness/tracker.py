"""The ``tracker`` fixture's object: named values a test records into unit_results.json.

Example (a test)::

    def test_refit_memory(tracker, runtime):
        refit(runtime.policy, runtime.generation)
        tracker.track("refit_seconds", 0.012)
        tracker.log_max_mem("after_refit")     # GiB, peak across the Ray cluster

Values land in ``unit_results.json`` under ``metrics[<test node id>]``, e.g.
``metrics["tests/unit/x.py::test_refit_memory[seed0]"]["after_refit"]``, next to ``_elapsed``.
"""

from __future__ import annotations

import json
from typing import Any

from posttrain.testing.harness import memory


class Tracker:
    """Records metrics of one test into ``store`` (a dict shared by the whole session).

    Args:
        key: the test's node id (``path::test[param]``): parametrized variants get their own key.
        store: ``{key: {name: value}}``, written to unit_results.json at the session's end.
    """

    def __init__(self, key: str, store: dict[str, dict[str, Any]]):
        self.key = key
        self._metrics = store.setdefault(key, {})

    def track(self, name: str, value: Any) -> None:
        """Record ``value`` under ``name`` (a later call with the same name replaces it).

        Raises:
            TypeError: ``value`` is not JSON-serializable (names the metric and the type),
                or is a float NaN/infinity (JSON has no such numbers).
        """
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise TypeError(f"tracker.track({name!r}, ...): value {value!r} of type {type(value).__name__} "
                            f"is not JSON-serializable ({e})") from None
        self._metrics[name] = value

    def get_max_mem(self) -> float:
        """Peak memory across the Ray cluster now, GiB (GPU memory on GPU nodes, else peak RSS of the
        driver and all Ray workers; see ``harness.memory``). Always > 0."""
        return memory.max_mem_gib()

    def log_max_mem(self, name: str) -> float:
        """``track(name, get_max_mem())``; returns the value (GiB)."""
        value = self.get_max_mem()
        self.track(name, value)
        return value
