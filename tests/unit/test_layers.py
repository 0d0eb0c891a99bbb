"""The package's layers: every import of a ``posttrain`` module, at the top of a file or inside a
function, points into its own folder or a lower layer, never up and never sideways, so the
folders form no import cycle and a lower room can be read, tested and reused without the ones
above it. (``docs/architecture.md`` draws the same layers.)"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "posttrain"

# From the top down; the folders (or single modules) of one layer import nothing of each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("algorithms",),                            # the loops, the GRPO step, the runtime
    ("models",),                                # policy workers, engines, model building
    ("weight_sync",),                           # the refit: sender, receiver, probe
    ("distributed",),                           # Ray, worker groups, the transport
    ("utils", "data"),                          # logger, checkpoints; problems, batches
    ("config", "environments", "rollouts"),     # schemas, the verifier, the rollout buffer
    ("testing", "ops", "errors", "config_reads"),  # the toolkit; tensor ops; the error types; key reads
)
HEIGHT = {name: len(LAYERS) - i for i, names in enumerate(LAYERS) for name in names}


def room_of(module: str) -> str | None:
    """The top-level folder (or module) of ``posttrain.a.b`` -> ``a``; None outside the package."""
    parts = module.split(".")
    return parts[1] if parts[0] == "posttrain" and len(parts) > 1 else None


def imports_that_break_the_layers(package: Path) -> list[str]:
    """``path:line: src -> dst`` for each import that climbs, runs sideways or names a folder
    no layer lists."""
    broken = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        src = rel.parts[0].removesuffix(".py")
        if src == "__init__":
            continue  # the package's face imports nothing
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = ([f"posttrain.{a.name}" for a in node.names] if node.module == "posttrain"
                           else [node.module])
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                dst = room_of(target)
                if dst is None or dst == src:
                    continue
                if src not in HEIGHT or dst not in HEIGHT or HEIGHT[dst] >= HEIGHT[src]:
                    broken.append(f"{rel}:{node.lineno}: {src} -> {dst}")
    return broken


def test_no_import_climbs_or_crosses_a_layer() -> None:
    assert imports_that_break_the_layers(PACKAGE) == []


def test_every_folder_of_the_package_has_a_layer() -> None:
    rooms = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")}
    assert rooms == set(HEIGHT)


def test_a_climbing_a_sideways_and_a_lazy_import_are_each_reported(tmp_path: Path) -> None:
    for room in ("algorithms", "models", "utils", "data"):
        (tmp_path / room).mkdir()
    (tmp_path / "models" / "a.py").write_text("from posttrain.algorithms import grpo\n")  # up
    (tmp_path / "utils" / "b.py").write_text("import posttrain.data.batch\n")  # sideways, one layer
    (tmp_path / "data" / "c.py").write_text("def f():\n    from posttrain.models import tiny\n")  # up, lazily
    (tmp_path / "algorithms" / "d.py").write_text("from posttrain.models import tiny\nfrom . import e\n")  # fine
    (tmp_path / "errors.py").write_text("from posttrain import config\n")  # up, from the package's face
    assert imports_that_break_the_layers(tmp_path) == [
        "data/c.py:2: data -> models", "errors.py:1: errors -> config", "models/a.py:1: models -> algorithms",
        "utils/b.py:1: utils -> data"]
