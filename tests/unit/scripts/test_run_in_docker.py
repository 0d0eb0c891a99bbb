"""tests/run_unit_in_docker.sh and tests/run_functional_in_docker.sh against a stub engine.

A stub `docker` / `podman` on PATH records its argv (one argument per line) and exits with
$STUB_EXIT; a stub `nvidia-smi` lists a GPU or fails. Nothing here starts a container.
"""

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
UNIT = REPO / "tests" / "run_unit_in_docker.sh"
FUNCTIONAL = REPO / "tests" / "run_functional_in_docker.sh"

STUB_ENGINE = """#!/usr/bin/env bash
printf '%s\\n' "$(basename "$0")" "$@" > "$STUB_ARGV"
exit "${STUB_EXIT:-0}"
"""
GPU_PRESENT = "#!/usr/bin/env bash\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n"
GPU_ABSENT = "#!/usr/bin/env bash\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n"


def _write_exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def stub_bin(tmp_path: Path) -> Path:
    """A bin dir with stub docker/podman (recording argv) and a GPU-less nvidia-smi."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for engine in ("docker", "podman"):
        _write_exe(bin_dir / engine, STUB_ENGINE)
    _write_exe(bin_dir / "nvidia-smi", GPU_ABSENT)
    return bin_dir


def run(
    script: Path, args: list[str], stub_bin: Path, tmp_path: Path, tty: bool = False, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Runs `script args` with the stubs first on PATH; returns the result and the engine's argv."""
    argv_file = tmp_path / "argv.txt"
    full_env = {
        "PATH": f"{stub_bin}:{os.environ['PATH']}",
        "HOME": str(tmp_path / "home"),
        "STUB_ARGV": str(argv_file),
        "CONTAINER": "posttrain:test",
        **env,
    }
    full_env = {k: v for k, v in full_env.items() if v is not None}
    command = ["bash", str(script), *args]
    if tty:  # `script` gives the command a pseudo-terminal, as an interactive shell has
        command = ["script", "-qec", " ".join(f"'{c}'" for c in command), "/dev/null"]
    result = subprocess.run(command, env=full_env, capture_output=True, text=True, timeout=60)
    argv = argv_file.read_text().splitlines() if argv_file.exists() else []
    return result, argv


def test_missing_container_is_a_usage_error(stub_bin, tmp_path):
    for script in (UNIT, FUNCTIONAL):
        result, argv = run(script, ["tests/functional/sft.sh"], stub_bin, tmp_path, CONTAINER="")
        assert result.returncode == 2, result.stderr
        assert "set CONTAINER" in result.stderr
        assert argv == []


def test_unknown_engine_is_a_usage_error(stub_bin, tmp_path):
    result, argv = run(UNIT, [], stub_bin, tmp_path, CONTAINER_ENGINE="lxc")
    assert result.returncode == 2
    assert "CONTAINER_ENGINE='lxc'" in result.stderr
    assert argv == []


def test_docker_is_the_default_engine_and_runs_run_unit(stub_bin, tmp_path):
    result, argv = run(UNIT, [], stub_bin, tmp_path)
    assert result.returncode == 0, result.stderr
    assert argv[:2] == ["docker", "run"]
    assert argv[-3:] == ["posttrain:test", "bash", "tests/run_unit.sh"]
    assert f"--user={os.getuid()}:{os.getgid()}" in argv


def test_arguments_pass_through_unchanged(stub_bin, tmp_path):
    args = ["--vllm-only", "-k", "refit and not slow", "tests/unit/x.py::test_a b"]
    result, argv = run(UNIT, args, stub_bin, tmp_path)
    assert result.returncode == 0, result.stderr
    assert argv[-len(args) - 3 :] == ["posttrain:test", "bash", "tests/run_unit.sh", *args]


@pytest.mark.parametrize("code", [0, 1, 5, 137])
def test_exit_code_is_the_containers(stub_bin, tmp_path, code):
    for script, args in ((UNIT, []), (FUNCTIONAL, ["tests/functional/sft.sh"])):
        result, _ = run(script, args, stub_bin, tmp_path, STUB_EXIT=str(code))
        assert result.returncode == code, (script.name, result.stderr)


def test_mounts_repo_and_caches(stub_bin, tmp_path):
    hub, uv_cache = tmp_path / "hub", tmp_path / "uv"
    result, argv = run(UNIT, [], stub_bin, tmp_path, HF_HOME=str(hub), UV_CACHE_DIR=str(uv_cache))
    assert result.returncode == 0, result.stderr
    assert f"--volume={REPO}:/opt/posttrain" in argv
    assert f"--volume={hub}:/cache/huggingface" in argv
    assert f"--volume={uv_cache}:/cache/uv" in argv
    assert f"--volume={tmp_path / 'home' / '.cache' / 'posttrain'}:/cache/posttrain" in argv
    assert "--workdir=/opt/posttrain" in argv


def gpu_flags(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith(("--gpus", "--device"))]


def test_no_mount_outside_the_repository_and_its_caches(stub_bin, tmp_path):
    """GSM8K ships in the repository (data/gsm8k): nothing beside the checkout is mounted."""
    _, argv = run(UNIT, [], stub_bin, tmp_path, HF_HOME=str(tmp_path / "hub"), UV_CACHE_DIR=str(tmp_path / "uv"))
    targets = sorted(a.split(":")[1] for a in argv if a.startswith("--volume="))
    assert targets == ["/cache/huggingface", "/cache/posttrain", "/cache/uv", "/opt/posttrain"], argv


@pytest.mark.parametrize("engine, gpu_flag", [("docker", "--gpus=all"), ("podman", "--device=nvidia.com/gpu=all")])
def test_gpu_flags_only_when_the_host_has_gpus(stub_bin, tmp_path, engine, gpu_flag):
    _, argv = run(UNIT, [], stub_bin, tmp_path, CONTAINER_ENGINE=engine)
    assert argv[0] == engine
    assert gpu_flags(argv) == [], argv
    _write_exe(stub_bin / "nvidia-smi", GPU_PRESENT)
    _, argv = run(UNIT, [], stub_bin, tmp_path, CONTAINER_ENGINE=engine)
    assert argv[0] == engine
    assert gpu_flag in argv
    assert gpu_flags(argv) == [gpu_flag]


@pytest.mark.skipif(shutil.which("script") is None, reason="needs util-linux `script` for a pseudo-terminal")
def test_terminal_gets_it_but_not_under_ci(stub_bin, tmp_path):
    result, argv = run(UNIT, [], stub_bin, tmp_path, tty=True, CI="")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "-it" in argv
    _, argv = run(UNIT, [], stub_bin, tmp_path, tty=True, CI="true")
    assert "-it" not in argv
    assert "--env=CI=true" in argv
    _, argv = run(UNIT, [], stub_bin, tmp_path, tty=False, CI="")
    assert "-it" not in argv  # no terminal to attach either (a pipe, a cron job)


def test_podman_engine_and_its_options(stub_bin, tmp_path):
    result, argv = run(
        UNIT,
        ["-x"],
        stub_bin,
        tmp_path,
        CONTAINER_ENGINE="podman",
        CONTAINER_ENGINE_ARGS="--runtime runc",
        CONTAINER_RUN_ARGS="--pull=never --network host",
    )
    assert result.returncode == 0, result.stderr
    assert argv[:4] == ["podman", "--runtime", "runc", "run"]
    image = argv.index("posttrain:test")
    assert argv[image - 3 : image] == ["--pull=never", "--network", "host"]
    assert argv[image:] == ["posttrain:test", "bash", "tests/run_unit.sh", "-x"]
    # rootful podman (uid 0) runs as the caller; rootless maps the caller with keep-id
    assert ("--userns=keep-id" in argv) == (os.getuid() != 0)
    assert f"--user={os.getuid()}:{os.getgid()}" in argv


def test_functional_runs_the_script_with_its_overrides(stub_bin, tmp_path):
    result, argv = run(FUNCTIONAL, ["tests/functional/sft.sh", "sft.num_steps=5", "SEED=1"], stub_bin, tmp_path)
    assert result.returncode == 0, result.stderr
    assert argv[-4:] == ["bash", "tests/functional/sft.sh", "sft.num_steps=5", "SEED=1"]


def test_functional_rejects_missing_or_foreign_scripts(stub_bin, tmp_path):
    for args, message in (
        ([], "usage"),
        (["tests/functional/nope.sh"], "does not exist"),
        (["tests/run_unit.sh"], "not a script under tests/functional/"),
    ):
        result, argv = run(FUNCTIONAL, args, stub_bin, tmp_path)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr
        assert argv == []
