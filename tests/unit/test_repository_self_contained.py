"""A user's clone is all there is: nothing may point outside the repository.

Developers of this project have notes and data beside their checkouts; a user has none. A
path into such a folder, or a reference to a design document that is not in the repository,
works on the developer's machine and fails (or misleads) everywhere else.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from posttrain.config import DataConfig

ROOT = Path(__file__).resolve().parents[2]
# Spelled in pieces so that this file does not match itself.
OUTSIDE = ("../" + "shared", "/work/" + "shared", "DESIGN" + ".md")


def repository_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (the container image holds no .git)")
    return [ROOT / name for name in out.split("\0") if name and (ROOT / name).is_file()]


def test_no_file_refers_to_a_folder_beside_the_repository_or_a_missing_design_document() -> None:
    hits = []
    for path in repository_files():
        if path.suffix in {".safetensors", ".pt", ".png", ".gz"} or path.stat().st_size > 5_000_000:
            continue
        text = path.read_text(errors="replace")
        hits += [f"{path.relative_to(ROOT)}: {needle}" for needle in OUTSIDE if needle in text]
    assert hits == []


def test_the_data_defaults_lie_inside_the_repository() -> None:
    cfg = DataConfig()
    for value in (cfg.gsm8k_train_path, cfg.gsm8k_val_path):
        path = Path(value).resolve()
        assert path.is_relative_to(ROOT) and path.is_file(), value
    assert (Path(cfg.gsm8k_train_path).parent / "LICENSE").is_file()


def test_every_package_folder_ships_in_a_built_wheel():
    """pyproject.toml finds packages with setuptools' ``packages.find``, which skips a folder
    without an ``__init__.py``: an editable install (uv run) still imports it, a built wheel (the
    container's install) silently lacks it. Every source folder of ``posttrain`` must be found."""
    from setuptools import find_packages

    root = Path(__file__).resolve().parents[2]
    folders = {p.parent.relative_to(root).as_posix().replace("/", ".")
               for p in (root / "posttrain").rglob("*.py") if "__pycache__" not in p.parts}
    missing = folders - set(find_packages(str(root), include=["posttrain*"]))
    assert not missing, f"no __init__.py, so not in a built wheel: {sorted(missing)}"
