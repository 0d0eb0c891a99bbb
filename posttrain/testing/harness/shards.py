"""``--shard I/N``: run the I-th of N deterministic parts of the selected tests.

The split is a pure function (:func:`assign`) of the selected node ids, a durations map
(node id -> seconds) and N, so every machine that collects the same tests with the same
durations file runs its own part and the N parts together run every test exactly once.

- Tests are grouped by module file (``path`` of ``path::test``): a module's tests stay in
  one shard, because module-scoped fixtures (a policy + generation worker on Ray) cost
  ~10 s to start and splitting a module would start them once per shard.
- A group weighs the sum of its tests' recorded durations; a test with no record weighs
  the median of the recorded ones among the tests being split (1.0 s when none has one).
- Longest processing time first: the heaviest group goes onto the least-loaded shard;
  equal weights are taken in module-name order and equal loads go to the lowest shard.

The durations file (``--shard-durations PATH``; default ``tests/durations.json`` under the
rootdir, else the current unit_results.json, else none) is a unit_results.json document
(``metrics.<id>._elapsed``) or a flat ``{node id: seconds}`` JSON object.
"""

from __future__ import annotations

import heapq
import json
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from posttrain.testing.harness import results

DURATIONS_FILE = Path("tests") / "durations.json"  # relative to the rootdir
UNKNOWN_WEIGHT_S = 1.0  # a test's weight when no test of the split has a recorded duration


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass(frozen=True)
class OtherShards:
    """What ``--shard`` deselected (read by the deselection report in ``selection``)."""

    shard: Shard
    nodeids: frozenset[str]


OTHER_SHARDS = pytest.StashKey[OtherShards]()


def parse_shard(text: str) -> Shard:
    """``"I/N"`` -> ``Shard(I, N)`` with 1 <= I <= N.

    Raises:
        pytest.UsageError: anything else (one line naming the value).
    """
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if match is None or not 1 <= int(match[1]) <= int(match[2]):
        raise pytest.UsageError(f"--shard {text}: expected I/N with 1 <= I <= N, e.g. --shard 2/3")
    return Shard(int(match[1]), int(match[2]))


def module_of(nodeid: str) -> str:
    """The module file part of a node id (``tests/unit/x.py::T::test[a]`` -> ``tests/unit/x.py``)."""
    return nodeid.split("::", 1)[0]


def weights_of(nodeids: Sequence[str], durations: Mapping[str, float]) -> dict[str, float]:
    """Seconds per node id: its recorded duration, else the median of the recorded ones among
    ``nodeids`` (``UNKNOWN_WEIGHT_S`` when none is recorded)."""
    known = [durations[n] for n in nodeids if n in durations]
    fallback = statistics.median(known) if known else UNKNOWN_WEIGHT_S
    return {n: durations.get(n, fallback) for n in nodeids}


def assign(nodeids: Sequence[str], durations: Mapping[str, float], count: int) -> list[list[str]]:
    """Split ``nodeids`` into ``count`` shards (a list per shard, each in ``nodeids``' order).

    Deterministic: the same ids and durations give the same split on every machine
    (order of ``nodeids`` included: it only orders the tests inside a shard). Shards beyond
    the number of modules stay empty.

    Raises:
        ValueError: ``count`` < 1.
    """
    if count < 1:
        raise ValueError(f"shard count must be >= 1, got {count}")
    weights = weights_of(nodeids, durations)
    groups: dict[str, list[str]] = {}
    for nodeid in nodeids:
        groups.setdefault(module_of(nodeid), []).append(nodeid)
    # fsum: exact, so the group weight cannot depend on the order of its tests
    group_weight = {module: math.fsum(weights[n] for n in ids) for module, ids in groups.items()}
    least_loaded = [(0.0, i) for i in range(count)]  # a heap of (load, shard): equal loads -> the lowest shard
    shard_of: dict[str, int] = {}
    for module in sorted(groups, key=lambda m: (-group_weight[m], m)):
        load, target = heapq.heappop(least_loaded)
        shard_of[module] = target
        heapq.heappush(least_loaded, (load + group_weight[module], target))
    shards: list[list[str]] = [[] for _ in range(count)]
    for nodeid in nodeids:
        shards[shard_of[module_of(nodeid)]].append(nodeid)
    return shards


def read_durations(path: Path) -> dict[str, float]:
    """``{node id: seconds}`` from a unit_results.json document (``results.recorded_seconds``; tests
    whose call never ran are left out) or a flat map.

    Raises:
        pytest.UsageError: unreadable, not JSON, or neither format (one line naming the file).
    """
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise pytest.UsageError(f"--shard-durations {path}: cannot read it: {e}") from None
    if isinstance(doc, dict) and isinstance(doc.get("metrics"), dict):  # unit_results.json
        doc = {n: results.recorded_seconds(m) for n, m in doc["metrics"].items()
               if results.recorded_seconds(m) is not None}
    if not isinstance(doc, dict) or not all(_is_seconds(v) for v in doc.values()):
        raise pytest.UsageError(f"--shard-durations {path}: expected a unit_results.json document or a flat "
                                "{node id: seconds} JSON object")
    return {str(n): float(v) for n, v in doc.items()}


def _is_seconds(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def default_durations_path(rootdir: Path) -> Path | None:
    """``tests/durations.json`` under ``rootdir``, else the current unit_results.json, else None."""
    for path in (rootdir / DURATIONS_FILE, results.results_dir(rootdir) / "unit_results.json"):
        if path.is_file():
            return path
    return None


def durations_from_options(config: pytest.Config) -> dict[str, float]:
    """The durations of ``--shard-durations PATH``, else of the default file, else none (``{}``).

    Raises:
        pytest.UsageError: the file cannot be read as durations (one line naming it).
    """
    given = config.getoption("shard_durations")
    path = Path(given) if given else default_durations_path(config.rootpath)
    return read_durations(path) if path is not None else {}


class Sharding:
    """pytest hooks of ``--shard``: keep this shard's tests, deselect the others'."""

    def __init__(self, config: pytest.Config, shard: Shard, durations: Mapping[str, float]):
        self.config = config
        self.shard = shard
        self.durations = durations
        self.line = ""

    @classmethod
    def from_options(cls, config: pytest.Config) -> Sharding:
        """From ``--shard`` and ``--shard-durations`` (or the default durations file).

        Raises:
            pytest.UsageError: a bad ``--shard`` value or durations file (one line).
        """
        return cls(config, parse_shard(config.getoption("shard")), durations_from_options(config))

    @pytest.hookimpl(trylast=True)  # after -m / -k deselected: every shard splits the same selection
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        nodeids = [item.nodeid for item in items]
        mine = set(assign(nodeids, self.durations, self.shard.count)[self.shard.index - 1])
        kept = [item for item in items if item.nodeid in mine]
        others = [item for item in items if item.nodeid not in mine]
        weights = weights_of(nodeids, self.durations)
        self.line = (f"shard {self.shard}: {len(kept)} of {len(items)} selected tests "
                     f"(est. {math.fsum(weights[n] for n in mine):.0f} s of {math.fsum(weights.values()):.0f} s)")
        self.config.stash[OTHER_SHARDS] = OtherShards(self.shard, frozenset(item.nodeid for item in others))
        if others:
            self.config.hook.pytest_deselected(items=others)
            items[:] = kept

    def pytest_report_collectionfinish(self) -> str:
        return self.line
