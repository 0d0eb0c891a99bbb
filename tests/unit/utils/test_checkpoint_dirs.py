"""Checkpoint directories survive a SIGKILL mid-save, and an incomplete one is never resumed
from nor deleted (``posttrain.utils.checkpoint``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from posttrain.errors import ConfigError
from posttrain.utils.checkpoint import COMPLETE, check_written_by, latest_complete, save_step

ROOT = Path(__file__).resolve().parents[3]


def write_files(*names: str):
    def write(tmp: Path) -> None:
        for name in names:
            (tmp / name).write_text(name)
    return write


def test_sigkill_between_two_files_leaves_the_previous_checkpoint_intact_and_resumable(tmp_path) -> None:
    save_step(tmp_path, 2, write_files("weights", "optimizer"), keep_last=2)
    # A process that is killed (SIGKILL: no cleanup runs) after the first file of step 4.
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from posttrain.utils.checkpoint import save_step
        def write(tmp):
            (tmp / "weights").write_text("half")
            os.kill(os.getpid(), signal.SIGKILL)
            (tmp / "optimizer").write_text("never")
        save_step(Path({str(tmp_path)!r}), 4, write, keep_last=1)
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=120)
    assert result.returncode == -9
    assert latest_complete(tmp_path) == tmp_path / "step_2"
    assert (tmp_path / "step_2" / "optimizer").read_text() == "optimizer"
    assert not (tmp_path / "step_4").exists()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".step_4.tmp-")]
    assert len(leftovers) == 1  # the half-written temporary, under a name nothing resumes from
    # The next save works and prunes only complete checkpoints.
    save_step(tmp_path, 6, write_files("weights", "optimizer"), keep_last=1)
    assert latest_complete(tmp_path) == tmp_path / "step_6" and not (tmp_path / "step_2").exists()


def test_an_incomplete_checkpoint_is_skipped_with_a_warning_and_never_deleted(tmp_path, capsys) -> None:
    save_step(tmp_path, 2, write_files("weights"), keep_last=5)
    save_step(tmp_path, 4, write_files("weights"), keep_last=5)
    (tmp_path / "step_4" / COMPLETE).unlink()  # e.g. copied by hand without its marker
    assert latest_complete(tmp_path) == tmp_path / "step_2"
    assert f"ignoring incomplete checkpoint {tmp_path / 'step_4'}" in capsys.readouterr().err
    save_step(tmp_path, 6, write_files("weights"), keep_last=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_4", "step_6"]


def test_no_directory_and_no_checkpoint_mean_a_fresh_start(tmp_path) -> None:
    assert latest_complete(tmp_path / "missing") is None
    (tmp_path / "step_x").mkdir()
    (tmp_path / "notes.txt").write_text("")
    assert latest_complete(tmp_path) is None


@pytest.mark.parametrize(("saved", "current"), [(2, 1), (1, 2), (4, 2), (2, 4), (0, 1)])
def test_a_checkpoint_written_by_more_or_fewer_ranks_than_the_run_has_is_refused_in_one_line(saved, current) -> None:
    check_written_by("ckpt/step_4", "policy.data_parallel_size", current, current)  # the same count resumes
    with pytest.raises(ConfigError, match=rf"^checkpoint 'ckpt/step_4' was written with policy.data_parallel_size="
                                          rf"{saved}; this run has {current} \(resume with the same size\)$"):
        check_written_by("ckpt/step_4", "policy.data_parallel_size", saved, current)
