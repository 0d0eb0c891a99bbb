"""The toolkit as its own distribution: ``toolkit/`` builds ``posttrain-testing``, which installs
into a fresh virtual environment without torch, Ray or transformers, and there judges a NeMo-RL
style metrics file from the ``check-metrics`` command and from its Python API alike.

A user of another RL stack (NeMo-RL, verl) takes only this. The test builds and installs the
real wheel with ``uv`` (from its cache, or from the package index), so what a user gets is what
is tested: the entry points, the namespace package, and the dependencies it does not bring.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TOOLKIT = REPO / "toolkit"
HEAVY = ("torch", "ray", "transformers", "vllm")

# A metrics file as NeMo-RL's json_dump_tb_logs.py writes one: metric -> {step: value}.
NEMO_RL_RUN = {
    "train/loss": {str(s): 1.0 / s for s in range(1, 11)},
    "train/reward": {str(s): 0.1 * s for s in range(1, 11)},
}
RULES = [
    'std(data["train/loss"]) >= 0',  # true of every run: VACUOUS, a failure
    'mean(data["train/reward"], -3) > mean(data["train/reward"], 1, 4)',  # a real check that passes
]

PROBE = """
import importlib.util, json, sys, time
start = time.perf_counter()
from posttrain.testing.rules import check_rules
seconds = time.perf_counter() - start
data = json.load(open(sys.argv[1]))
results = check_rules(data, json.loads(sys.argv[2]))
print(json.dumps({"statuses": [r.status for r in results], "import_s": seconds,
                  "heavy": [m for m in json.loads(sys.argv[3]) if importlib.util.find_spec(m) is not None]}))
"""


def _isolated_env() -> dict[str, str]:
    """This environment without what would let the venv import from elsewhere: ``PYTHONPATH``
    (run_mutants.py and the GPU device put a checkout there), ``PYTHONHOME``, ``VIRTUAL_ENV``."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _run(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, env=_isolated_env())
    if check and result.returncode != 0:
        raise AssertionError(f"{cmd[:3]} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def toolkit_venv(tmp_path_factory) -> Path:
    """A fresh venv with ``uv pip install ./toolkit`` in it; its ``bin`` directory."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("needs uv on PATH (the README's commands run under uv)")
    root = tmp_path_factory.mktemp("toolkit")
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    _run([uv, "venv", "-q", "-p", py, str(root / "venv")], cwd=root)
    python = root / "venv" / "bin" / "python"
    # the toolkit's metadata keeps ranges (it joins other stacks' environments); the test resolves
    # to this environment's versions, so its verdict does not move with a new release of rich
    pins = root / "constraints.txt"
    versions: dict[str, str] = {}
    # this environment's installed packages only: an imported setuptools puts its vendored copies
    # (packaging 24.2, ...) on sys.path, and pinning those too left no solution
    site = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    for dist in importlib.metadata.distributions(path=[str(p) for p in site]):
        name = (dist.metadata["Name"] or "").lower()
        if name and name != "posttrain":
            versions.setdefault(name, dist.version)
    pins.write_text("".join(f"{name}=={version}\n" for name, version in versions.items()))
    # --refresh-package: uv reuses a local directory's build until its pyproject.toml changes, and the
    # sources here are ../posttrain/testing: without it an edited toolkit would be tested stale
    installed = _run([uv, "pip", "install", "-q", "-p", str(python), "-c", str(pins),
                      "--refresh-package", "posttrain-testing", str(TOOLKIT)], cwd=root, check=False)
    offline = ("error sending request", "Failed to fetch", "dns error", "Network is unreachable", "offline")
    if installed.returncode != 0 and any(cause in installed.stderr + installed.stdout for cause in offline):
        pytest.skip("no package index reachable and uv's cache lacks rich/pytest/hatchling: "
                    f"{installed.stderr.strip().splitlines()[-1]}")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return root / "venv" / "bin"


def test_the_toolkit_installs_alone_and_its_command_and_api_refuse_a_vacuous_rule(toolkit_venv, tmp_path, tracker):
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps(NEMO_RL_RUN))
    report = tmp_path / "report.json"
    # cwd: an empty directory, so no repository checkout or /tmp/ray shadows the installed packages
    command = _run([str(toolkit_venv / "check-metrics"), str(metrics), *RULES, "--output-json", str(report)],
                   cwd=tmp_path, check=False)
    assert command.returncode == 1, command.stdout + command.stderr  # the vacuous rule fails the run
    cli = [row["status"] for row in json.loads(report.read_text())]
    assert cli == ["VACUOUS", "PASS"], command.stdout
    probe = _run([str(toolkit_venv / "python"), "-I", "-c", PROBE, str(metrics), json.dumps(RULES),
                  json.dumps(HEAVY)], cwd=tmp_path)
    api = json.loads(probe.stdout)
    assert api["statuses"] == cli  # the Python API judges as the command does
    assert api["heavy"] == []  # none of torch, Ray, transformers, vLLM came with it
    site = next((toolkit_venv.parent / "lib").glob("python*/site-packages"))
    size_mib = sum(f.stat().st_size for f in site.rglob("*") if f.is_file()) / 2**20
    tracker.track("install_mib", round(size_mib, 1))
    tracker.track("import_s", round(api["import_s"], 3))


def test_the_toolkit_wheel_holds_the_librarys_own_toolkit_sources(toolkit_venv):
    """One copy of the sources: the wheel's files are the repository's ``posttrain/testing``."""
    site = next((toolkit_venv.parent / "lib").glob("python*/site-packages"))
    installed = {p.relative_to(site / "posttrain" / "testing").as_posix()
                 for p in (site / "posttrain" / "testing").rglob("*.py")}
    sources = {p.relative_to(REPO / "posttrain" / "testing").as_posix()
               for p in (REPO / "posttrain" / "testing").rglob("*.py")}
    assert installed == sources
    assert not (site / "posttrain" / "__init__.py").exists()  # a namespace portion: it installs alone
    help_text = _run([str(toolkit_venv / "check-metrics"), "--help"], cwd=site).stdout
    assert "usage:" in help_text


def test_the_toolkit_without_its_report_extra_refuses_report_in_one_line(toolkit_venv, tmp_path):
    """``--report`` needs matplotlib (the ``report`` extra), which the plain install does not bring."""
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps(NEMO_RL_RUN))
    command = _run([str(toolkit_venv / "check-metrics"), str(metrics), RULES[1], "--report", str(tmp_path / "plots")],
                   cwd=tmp_path, check=False)
    assert command.returncode == 2, command.stdout + command.stderr
    assert command.stderr.count("\n") == 1 and "--report needs matplotlib" in command.stderr
    assert command.stdout == "" and not (tmp_path / "plots").exists()
