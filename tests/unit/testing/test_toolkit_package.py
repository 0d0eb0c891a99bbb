"""The toolkit as a package: its console scripts resolve, and nothing in it shadows a builtin."""

from __future__ import annotations

import builtins
import importlib
import pkgutil
import tomllib
from pathlib import Path

import pytest

import posttrain.testing

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_the_toolkit_commands_are_declared() -> None:
    assert {"check-metrics", "tb-to-json", "unit-results-trend"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_each_console_script_points_at_a_main_that_prints_its_help(name, capsys) -> None:
    module, _, attr = SCRIPTS[name].partition(":")
    main = getattr(importlib.import_module(module), attr)
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_no_toolkit_module_defines_or_imports_a_builtin_name() -> None:
    """``from helpers import min`` once made every later ``min(...)`` in a module the rule helper."""
    shadowing = []
    for info in pkgutil.walk_packages(posttrain.testing.__path__, "posttrain.testing."):
        module = importlib.import_module(info.name)
        shadowing += [f"{info.name}.{n}" for n in vars(module) if n in vars(builtins) and not n.startswith("__")]
    assert shadowing == []
