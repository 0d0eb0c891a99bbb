"""The content-keyed directory cache: built once, verified on every use, rebuilt when not trustworthy."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import pytest

from posttrain.utils.artifact_cache import (
    MANIFEST,
    CacheError,
    fingerprint,
    get_or_build,
    source_digest,
    verify,
)


class Builder:
    """Writes two files and counts its calls."""

    def __init__(self, payload: bytes = b"weights"):
        self.calls = 0
        self.payload = payload

    def __call__(self, directory: Path) -> dict:
        self.calls += 1
        (directory / "model").mkdir()
        (directory / "model" / "weights.bin").write_bytes(self.payload)
        (directory / "config.json").write_text('{"layers": 4}')
        return {"steps": 340}


def test_an_entry_is_built_once_and_then_reused(tmp_path: Path) -> None:
    build, lines = Builder(), []
    first = get_or_build(tmp_path, "k1", build, lines.append)
    second = get_or_build(tmp_path, "k1", build, lines.append)
    assert (first.built, second.built, build.calls) == (True, False, 1)
    assert first.path == second.path == tmp_path / "k1"
    assert second.info == {"steps": 340}
    assert (second.path / "model" / "weights.bin").read_bytes() == b"weights"
    assert lines == []  # nothing to say about a healthy entry
    assert not list(tmp_path.glob(".build-*"))  # no temporary left behind


def corrupt(entry: Path) -> None:
    (entry / "model" / "weights.bin").write_bytes(b"weightz")


def partial(entry: Path) -> None:
    (entry / MANIFEST).unlink()


def missing(entry: Path) -> None:
    (entry / "config.json").unlink()


def added(entry: Path) -> None:
    (entry / "stray.txt").write_text("left by someone")


def stale(entry: Path) -> None:
    manifest = json.loads((entry / MANIFEST).read_text())
    manifest["key"] = "an-older-key"
    (entry / MANIFEST).write_text(json.dumps(manifest))


def garbled(entry: Path) -> None:
    (entry / MANIFEST).write_text("{not json")


@pytest.mark.parametrize(("damage", "reason"), [
    (corrupt, "model/weights.bin changed"), (partial, "no manifest (a partial build)"),
    (missing, "config.json is missing"), (added, "stray.txt is not in the manifest"),
    (stale, "manifest is for key 'an-older-key'"), (garbled, "unreadable manifest"),
])
def test_an_entry_that_does_not_verify_is_rebuilt_never_trusted(tmp_path: Path, damage, reason) -> None:
    build, lines = Builder(), []
    entry = get_or_build(tmp_path, "k1", build, lines.append).path
    damage(entry)
    assert reason in (verify(entry, "k1") or "")
    again = get_or_build(tmp_path, "k1", build, lines.append)
    assert (again.built, build.calls) == (True, 2)
    assert verify(again.path, "k1") is None
    assert (again.path / "model" / "weights.bin").read_bytes() == b"weights"
    assert len(lines) == 1 and reason in lines[0] and "rebuilding" in lines[0]


def test_a_failing_build_caches_nothing(tmp_path: Path) -> None:
    def broken(directory: Path) -> dict:
        (directory / "half.bin").write_bytes(b"x")
        raise RuntimeError("SFT diverged")

    with pytest.raises(RuntimeError, match="SFT diverged"):
        get_or_build(tmp_path, "k1", broken)
    assert not (tmp_path / "k1").exists()
    assert not list(tmp_path.glob(".build-*"))
    assert get_or_build(tmp_path, "k1", Builder()).built  # the next call builds it


def test_a_builder_that_writes_nothing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CacheError, match="wrote no file"):
        get_or_build(tmp_path, "k1", lambda directory: {})
    assert not (tmp_path / "k1").exists()


def _build_in_process(root: str, counter: str) -> None:
    def build(directory: Path) -> dict:
        with open(counter, "a") as f:
            f.write("built\n")
        time.sleep(2)  # long enough that the three processes overlap
        (directory / "w.bin").write_bytes(b"w")
        return {}

    get_or_build(Path(root), "shared", build)


def test_concurrent_users_build_once(tmp_path: Path) -> None:
    """xdist workers asking for one key at the same time: one builds, the others reuse it."""
    counter = tmp_path / "builds.txt"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_build_in_process, args=(str(tmp_path / "cache"), str(counter))) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert counter.read_text() == "built\n"


def test_fingerprint_is_canonical_and_sensitive() -> None:
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})
    with pytest.raises(TypeError):
        fingerprint({"a": object()})


def test_source_digest_sees_every_edit_outside_the_excluded_folders(tmp_path: Path) -> None:
    (tmp_path / "algorithms").mkdir()
    (tmp_path / "testing").mkdir()
    (tmp_path / "algorithms" / "sft.py").write_text("x = 1\n")
    (tmp_path / "testing" / "rules.py").write_text("y = 1\n")
    before = source_digest(tmp_path, exclude=["testing"])
    (tmp_path / "testing" / "rules.py").write_text("y = 2\n")
    assert source_digest(tmp_path, exclude=["testing"]) == before  # the toolkit trains nothing
    (tmp_path / "algorithms" / "sft.py").write_text("x = 1  # a comment is an edit\n")
    assert source_digest(tmp_path, exclude=["testing"]) != before
    renamed = source_digest(tmp_path, exclude=["testing"])
    (tmp_path / "algorithms" / "sft.py").rename(tmp_path / "algorithms" / "grpo.py")
    assert source_digest(tmp_path, exclude=["testing"]) != renamed
