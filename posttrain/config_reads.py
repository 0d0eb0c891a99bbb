"""Which config keys a run read: a record the config's sections carry, and copy across the Ray boundary.

``load_config`` attaches a :class:`ReadRecord` to every section of the loaded config (:func:`track_reads`);
from then on, loading a field of a section (``cfg.policy.lr``) adds its dotted key (``policy.lr``) to
the record. A worker's config (``PolicyWorkerConfig``, ``GenerationWorkerConfig``) is built from the
run's sections with the same record attached, each field standing for the run keys it copies
(the class's ``run_keys``), so a worker's read of ``cfg.lr`` records ``policy.lr``. The record travels
with the section wherever it is sent (pickled with it): a Ray actor records into its own copy, and
returns it with ``config_reads()`` (``ReadsConfig``); the driver merges what its workers return.

What is not a read: validation (the record is attached after it), ``model_dump()`` (a copy; the
worker configs copy this way, and the worker's reads of the copy count), and the record's own
bookkeeping. A section without a record (one built directly, as tests do) records nothing.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

S = TypeVar("S", bound=BaseModel)

# The key of a tracked section's _Tracker in the section's __dict__: pydantic compares and dumps the
# fields only, so a tracked section equals, dumps and hashes as an untracked one.
_TRACKER = "__config_reads__"


class ReadRecord:
    """The config keys of one run: ``set_keys`` (key -> value: the keys its YAML file and overrides set
    off their defaults), ``read`` (the dotted keys read so far) and ``moot`` (keys, or prefixes
    ending in ``.``, of a part the run chose not to start: no engine, no validation)."""

    def __init__(self, set_keys: dict[str, Any] | None = None):
        self.set_keys = dict(set_keys or {})
        self.read: set[str] = set()
        self.moot: set[str] = set()


class _Tracker:
    """One section's link to its record: ``keys[field]`` are the run keys a read of the field reads."""

    def __init__(self, record: ReadRecord, keys: dict[str, tuple[str, ...]], prefix: str):
        self.record, self.keys, self.prefix = record, keys, prefix


class Tracked(BaseModel):
    """A config model whose field reads go into its :class:`ReadRecord`, once one is attached."""

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if name[0] != "_":
            tracker = object.__getattribute__(self, "__dict__").get(_TRACKER)
            if tracker is not None and name in tracker.keys:
                tracker.record.read.update(tracker.keys[name])
        return value


def track_reads(section: BaseModel, record: ReadRecord, prefix: str = "") -> None:
    """Attach ``record`` to ``section`` and its sub-sections: a field at ``<prefix><field>`` reads
    that key, or the keys its class's ``run_keys`` name for it (a worker's copy)."""
    fields = vars(section)  # not through the tracked attribute access: attaching reads nothing
    run_keys: dict[str, tuple[str, ...]] = getattr(type(section), "run_keys", {})
    keys = {}
    for name, info in type(section).model_fields.items():
        key = prefix + (info.alias or name)
        if isinstance(fields[name], BaseModel):
            track_reads(fields[name], record, key + ".")
        else:
            keys[name] = run_keys.get(name, (key,))
    fields[_TRACKER] = _Tracker(record, keys, prefix)


def record_of(section: BaseModel) -> ReadRecord | None:
    """The record attached to ``section`` (None: it is not tracked)."""
    tracker = vars(section).get(_TRACKER)
    return tracker.record if tracker is not None else None


def track_copy(copy: BaseModel, source: BaseModel) -> None:
    """Attach ``source``'s record (if it has one) to ``copy``, a worker's config built from it: the
    fields ``copy`` shares with ``source``'s class hold ``source``'s keys."""
    tracker = vars(source).get(_TRACKER)
    if tracker is not None:
        track_reads(copy, tracker.record, tracker.prefix)


def untracked(section: S) -> S:
    """A shallow copy of ``section`` that records no reads of its own fields: what a copy into a
    worker's config reads from (the worker's reads of its copy are the reads that count)."""
    copy = section.model_copy()
    vars(copy).pop(_TRACKER, None)
    return copy


def reads_of(section: BaseModel) -> frozenset[str]:
    """The keys read so far through ``section``'s record (in this process), empty if untracked."""
    record = record_of(section)
    return frozenset(record.read) if record is not None else frozenset()


class ReadsConfig:
    """A worker holding its config as ``self.cfg`` (a policy worker, an engine, the rollout
    producer): the driver asks it which of the run's keys its copy of the config read."""

    def config_reads(self) -> frozenset[str]:
        """The run's config keys read through this worker's copy of its config (none without one)."""
        cfg = getattr(self, "cfg", None)
        return reads_of(cfg) if isinstance(cfg, BaseModel) else frozenset()
