"""The results trend tool (posttrain/testing/results_trend.py): a metric across archived runs, flags a move."""

from __future__ import annotations

import json

import pytest

from posttrain.testing import results_trend as trend_cli

KEY = "tests/unit/x.py::test_mem[a]/peak"


def archive(tmp_path, values):
    for i, value in enumerate(values):
        metrics = {} if value is None else {"tests/unit/x.py::test_mem[a]": {"peak": value, "_elapsed": 1.0}}
        doc = {"start_time": f"2026-11-2{i}T00:00:00Z", "git_commit": str(i) * 40, "metrics": metrics,
               "exit_status": 0}
        (tmp_path / f"2026112{i}T000000Z.json").write_text(json.dumps(doc))
    return tmp_path


def test_prints_every_run_and_passes_when_stable(tmp_path, capsys):
    assert trend_cli.main([KEY, "--dir", str(archive(tmp_path, [1.0, 1.1, None, 0.95]))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["2026-11-20T00:00:00Z  000000000000  1",
                     "2026-11-21T00:00:00Z  111111111111  1.1",
                     "2026-11-22T00:00:00Z  222222222222  -",
                     "2026-11-23T00:00:00Z  333333333333  0.95"]


def test_flags_a_value_off_the_median_of_earlier_runs(tmp_path, capsys):
    # median of 1.0, 1.1, 0.9 is 1.0: 1.3 is +30% (> 20%), 1.15 would be inside.
    assert trend_cli.main([KEY, "--dir", str(archive(tmp_path, [1.0, 1.1, 0.9, 1.3]))]) == 1
    out = capsys.readouterr().out
    assert "1.3  FLAGGED: +30% vs median 1 of earlier runs" in out
    assert trend_cli.main([KEY, "--tolerance", "0.35", "--dir", str(tmp_path)]) == 0


def test_usage_errors_exit_2(tmp_path, capsys):
    archive(tmp_path, [1.0])
    for argv in (["no-slash", "--dir", str(tmp_path)], [KEY + "x", "--dir", str(tmp_path)],
                 [KEY, "--dir", str(tmp_path / "missing")], [KEY, "--tolerance", "-1", "--dir", str(tmp_path)]):
        with pytest.raises(SystemExit) as exit_info:
            trend_cli.main(argv)
        assert exit_info.value.code == 2
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(SystemExit, match="2"):
        trend_cli.main([KEY, "--dir", str(tmp_path)])
    assert "broken.json: not a unit_results file" in capsys.readouterr().err
