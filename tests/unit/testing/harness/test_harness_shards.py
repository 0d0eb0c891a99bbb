"""``--shard I/N`` (posttrain.testing.harness.shards) and the merge of the shards' results
(posttrain.testing.harness.merge): every test runs in exactly one shard, a module's tests stay
together, the split is balanced and the same on every machine, and the merged file holds the
union of the shards' tests."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.testing.harness import merge, shards
from posttrain.testing.harness.shards import (
    Shard,
    assign,
    default_durations_path,
    module_of,
    parse_shard,
    read_durations,
    weights_of,
)

REPO = Path(__file__).resolve().parents[4]

# A made-up suite: 6 modules, uneven sizes and durations, some tests without a record.
MODULES = {"tests/unit/a.py": [30.0, 1.0, 1.0], "tests/unit/b.py": [12.0, 12.0], "tests/unit/c.py": [0.5] * 8,
           "tests/unit/d/e.py": [7.0, None, None], "tests/unit/f.py": [None], "tests/unit/g.py": [2.0, 2.5]}
NODEIDS = [f"{m}::test_{i}" for m, ds in MODULES.items() for i in range(len(ds))]
DURATIONS = {f"{m}::test_{i}": d for m, ds in MODULES.items() for i, d in enumerate(ds) if d is not None}


def loads(shards: list[list[str]], durations: dict[str, float]) -> list[float]:
    weights = weights_of([n for s in shards for n in s], durations)
    return [sum(weights[n] for n in s) for s in shards]


# ---------------------------------------------------------------- the split (pure)

@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 6, 9])  # 9 > 6 modules: some shards stay empty
def test_every_test_is_in_exactly_one_shard(count):
    shards = assign(NODEIDS, DURATIONS, count)
    assert len(shards) == count
    assert sorted(n for s in shards for n in s) == sorted(NODEIDS)
    for shard in shards:  # the collection order is kept inside a shard
        assert shard == [n for n in NODEIDS if n in shard]


@pytest.mark.parametrize("count", [2, 3, 4, 5])
def test_a_modules_tests_stay_in_one_shard(count):
    shards = assign(NODEIDS, DURATIONS, count)
    for module in MODULES:
        assert sum(any(module_of(n) == module for n in s) for s in shards) == 1, module


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5])
def test_the_split_does_not_depend_on_collection_order_or_the_machine(count):
    expected = [set(s) for s in assign(NODEIDS, DURATIONS, count)]
    shuffled = NODEIDS[:]
    for seed in range(5):
        random.Random(seed).shuffle(shuffled)
        assert [set(s) for s in assign(shuffled, dict(reversed(DURATIONS.items())), count)] == expected


def test_equal_weights_go_by_module_name_onto_the_lowest_shard():
    # LPT over a=3, b=3, c=2, d=2: a->1, b->2, then c onto the tie (3, 3) -> 1, d -> 2.
    ids = ["d.py::t", "c.py::t", "b.py::t", "a.py::t"]
    durations = {"a.py::t": 3.0, "b.py::t": 3.0, "c.py::t": 2.0, "d.py::t": 2.0}
    assert assign(ids, durations, 2) == [["c.py::t", "a.py::t"], ["d.py::t", "b.py::t"]]


@pytest.mark.parametrize("count", [2, 3, 4, 5])
def test_the_heaviest_shard_is_within_the_largest_module_of_the_mean(count):
    # Many light modules after one heavy one: only a least-loaded choice keeps the bound.
    ids = ["heavy.py::t"] + [f"m{i:02}.py::t" for i in range(40)]
    durations = {"heavy.py::t": 20.0, **{f"m{i:02}.py::t": 1.0 + (i % 7) for i in range(40)}}
    for nodeids, known in ((ids, durations), (NODEIDS, DURATIONS)):
        per_shard = loads(assign(nodeids, known, count), known)
        weights = weights_of(nodeids, known)
        largest = max(sum(w for n, w in weights.items() if module_of(n) == m) for m in {module_of(n) for n in nodeids})
        assert max(per_shard) <= sum(per_shard) / count + largest, per_shard
        # greedy onto the least-loaded shard: the heaviest shard's last (= lightest) module went
        # onto what was then the lightest shard, so without it the shard is no heavier than any
        shards = assign(nodeids, known, count)
        heaviest = shards[per_shard.index(max(per_shard))]
        lightest_module = min(sum(weights[n] for n in heaviest if module_of(n) == m)
                              for m in {module_of(n) for n in heaviest})
        assert max(per_shard) - lightest_module <= min(per_shard) + 1e-9, per_shard


def test_a_test_without_a_record_weighs_the_median_of_the_recorded_ones():
    weights = weights_of(["x.py::a", "x.py::b", "x.py::c", "y.py::new"], {"x.py::a": 1.0, "x.py::b": 2.0,
                                                                          "x.py::c": 30.0, "elsewhere.py::t": 99.0})
    assert weights == {"x.py::a": 1.0, "x.py::b": 2.0, "x.py::c": 30.0, "y.py::new": 2.0}  # not the mean, 11
    assert weights_of(["x.py::a", "x.py::b"], {}) == {"x.py::a": 1.0, "x.py::b": 1.0}
    # 16 records, eight of them 0.5 s: the median is between 0.5 and the next one, 1.0
    assert weights_of(NODEIDS, DURATIONS)["tests/unit/f.py::test_0"] == 0.75


@pytest.mark.parametrize(("text", "shard"), [("1/1", Shard(1, 1)), ("2/3", Shard(2, 3)), ("3/3", Shard(3, 3))])
def test_parse_shard(text, shard):
    assert parse_shard(text) == shard
    assert str(shard) == text


@pytest.mark.parametrize("text", ["0/2", "3/2", "a/b", "1/0", "2", "1/2/3", "-1/2", ""])
def test_bad_shard_values_are_a_usage_error_naming_the_value(text):
    with pytest.raises(pytest.UsageError, match=rf"^--shard {re.escape(text)}: expected I/N with 1 <= I <= N"):
        parse_shard(text)


def test_durations_come_from_unit_results_or_a_flat_map(tmp_path):
    doc = {"exit_status": 0, "metrics": {"a.py::t": {"_elapsed": 2.5, "peak": 1.0}, "b.py::t": {"peak": 3.0}}}
    (tmp_path / "unit_results.json").write_text(json.dumps(doc))
    assert read_durations(tmp_path / "unit_results.json") == {"a.py::t": 2.5}
    (tmp_path / "flat.json").write_text(json.dumps({"a.py::t": 2, "b.py::t": 0.25}))
    assert read_durations(tmp_path / "flat.json") == {"a.py::t": 2.0, "b.py::t": 0.25}
    for name, text in (("list.json", "[1, 2]"), ("text.json", '{"a.py::t": "slow"}'), ("neg.json", '{"a.py::t": -1}'),
                       ("broken.json", "{"), ("missing.json", None)):
        if text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(pytest.UsageError, match=rf"^--shard-durations {re.escape(str(tmp_path / name))}: "):
            read_durations(tmp_path / name)


def test_the_default_durations_file(tmp_path, monkeypatch):
    results = tmp_path / "results"
    monkeypatch.setenv("POSTTRAIN_UNIT_RESULTS_DIR", str(results))
    assert default_durations_path(tmp_path) is None
    results.mkdir()
    (results / "unit_results.json").write_text("{}")
    assert default_durations_path(tmp_path) == results / "unit_results.json"
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "durations.json").write_text("{}")
    assert default_durations_path(tmp_path) == tmp_path / "tests" / "durations.json"


def test_a_zero_duration_is_a_duration_and_a_bad_file_names_both_formats(tmp_path):
    (tmp_path / "flat.json").write_text(json.dumps({"a.py::t": 0}))
    assert read_durations(tmp_path / "flat.json") == {"a.py::t": 0.0}
    (tmp_path / "bad.json").write_text("[1]")
    with pytest.raises(pytest.UsageError) as err:
        read_durations(tmp_path / "bad.json")
    assert str(err.value) == (f"--shard-durations {tmp_path / 'bad.json'}: expected a unit_results.json document "
                              "or a flat {node id: seconds} JSON object")


def test_without_the_environment_the_default_is_the_unit_results_under_tests_unit(tmp_path, monkeypatch):
    monkeypatch.delenv("POSTTRAIN_UNIT_RESULTS_DIR", raising=False)
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "unit_results.json").write_text("{}")
    assert default_durations_path(tmp_path) == tmp_path / "tests" / "unit" / "unit_results.json"


def test_a_class_s_tests_stay_in_their_module_s_shard():
    ids = ["a.py::T::t0", "a.py::T::t1", "a.py::u", "b.py::t"]
    shards = assign(ids, {"a.py::T::t0": 5.0, "b.py::t": 1.0}, 2)
    assert shards == [["a.py::T::t0", "a.py::T::t1", "a.py::u"], ["b.py::t"]]


def test_no_shard_count_below_one():
    with pytest.raises(ValueError, match=r"^shard count must be >= 1, got 0$"):
        assign(["a.py::t"], {}, 0)


# ---------------------------------------------------------------- pytest runs (pytester)

TREE_DURATIONS = {"test_alpha.py::test_0": 5.0, "test_alpha.py::test_1": 5.0, "test_beta.py::test_0": 8.0,
                  "test_gamma.py::test_2": 0.5, "test_delta.py::test_0": 3.0, "test_epsilon.py::test_1": 4.0}


@pytest.fixture
def tree(pytester, monkeypatch):
    """Five modules of trivial passing tests (3, 2, 4, 1, 2 tests) and a durations file."""
    monkeypatch.setenv("POSTTRAIN_UNIT_RESULTS_DIR", str(pytester.path / "results"))
    monkeypatch.setenv("POSTTRAIN_NUM_GPUS", "0")
    for name, n in (("alpha", 3), ("beta", 2), ("gamma", 4), ("delta", 1), ("epsilon", 2)):
        body = "import pytest\n" + "".join(
            f"\n{'@pytest.mark.slow' if name == 'gamma' and i == 0 else ''}\ndef test_{i}():\n    pass\n"
            for i in range(n))
        pytester.makepyfile(**{f"test_{name}": body})
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    (pytester.path / "durations.json").write_text(json.dumps(TREE_DURATIONS))
    return pytester


def passed(pytester, *args: str) -> tuple[list[str], pytest.RunResult]:
    result = pytester.runpytest_inprocess("-o", "posttrain_harness=true", "-p", "no:cacheprovider", "-v", *args)
    return re.findall(r"^(test_\w+\.py::test_\d+) PASSED", result.stdout.str(), re.MULTILINE), result


def all_ids(pytester, *args: str) -> list[str]:
    ids, result = passed(pytester, *args)
    assert result.ret == 0, result.stdout.str()
    return ids


def test_the_shards_run_every_test_exactly_once(tree):
    everything = all_ids(tree, "--no-unit-results")
    assert len(everything) == 12
    runs = [passed(tree, "--shard", f"{i}/3", "--shard-durations", "durations.json") for i in (1, 2, 3)]
    shards = [ids for ids, _ in runs]
    assert sorted(n for s in shards for n in s) == sorted(everything)  # all of them, none twice
    for i, j in ((0, 1), (0, 2), (1, 2)):
        assert not set(shards[i]) & set(shards[j])
    assert [set(s) for s in shards] == [set(s) for s in assign(everything, TREE_DURATIONS, 3)]
    for i, (ids, result) in enumerate(runs, 1):
        assert result.ret == 0
        result.stdout.fnmatch_lines([f"shard {i}/3: {len(ids)} of 12 selected tests (est. * s of * s)"])
    # each shard's unit_results.json holds its own tests (the merge input)
    assert set(json.loads((tree.path / "results" / "unit_results.json").read_text())["metrics"]) == set(shards[2])


def test_k_and_m_deselect_before_the_split(tree):
    chosen = all_ids(tree, "--no-unit-results", "-k", "alpha or gamma or delta", "-m", "not slow")
    assert len(chosen) == 7
    shards = []
    for i in (1, 2, 3):
        ids, result = passed(tree, "--no-unit-results", "-k", "alpha or gamma or delta", "-m", "not slow",
                             "--shard", f"{i}/3", "--shard-durations", "durations.json")
        assert result.ret == 0
        result.stdout.fnmatch_lines([f"shard {i}/3: {len(ids)} of 7 selected tests*"])
        shards.append(ids)
    # the split of the 7 selected tests, not of all 12 (that one puts beta alone in a shard)
    assert [set(s) for s in shards] == [set(s) for s in assign(chosen, TREE_DURATIONS, 3)]
    assert [set(s) for s in shards] != [set(s) & set(chosen) for s in assign(all_ids(tree), TREE_DURATIONS, 3)]


def test_durations_default_to_tests_durations_json(tree):
    everything = all_ids(tree, "--no-unit-results")
    durations = {n: 50.0 if n == "test_gamma.py::test_0" else 1.0 for n in everything}  # gamma alone in shard 1
    assert assign(everything, durations, 2) != assign(everything, {}, 2)
    (tree.path / "tests").mkdir()
    (tree.path / "tests" / "durations.json").write_text(json.dumps(durations))
    ids, _ = passed(tree, "--no-unit-results", "--shard", "1/2")
    assert set(ids) == set(assign(everything, durations, 2)[0]) == {f"test_gamma.py::test_{i}" for i in range(4)}


def test_other_shards_are_one_line_of_the_deselection_report(tree):
    ids, result = passed(tree, "--no-unit-results", "-m", "not slow", "--shard", "2/3", "--shard-durations",
                         "durations.json")
    others = 11 - len(ids)
    result.stdout.fnmatch_lines(["*deselected by the configuration*", "1 deselected: other (your -m / -k)",
                                 f"{others} deselected: in other shards (--shard 2/3)"])
    assert f"{others + 1} deselected: other" not in result.stdout.str()


def test_without_any_durations_file_the_tests_weigh_alike(tree, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_UNIT_RESULTS_DIR", str(tree.path / "no_results_here"))
    everything = all_ids(tree, "--no-unit-results")
    ids, result = passed(tree, "--no-unit-results", "--shard", "1/2")  # no --shard-durations, no default file
    assert set(ids) == set(assign(everything, {}, 2)[0])
    result.stdout.fnmatch_lines([f"shard 1/2: {len(ids)} of {len(everything)} selected tests (est. {len(ids)} s of "
                                 f"{len(everything)} s)"])


@pytest.mark.parametrize("value", ["0/2", "3/2", "a/b"])
def test_a_bad_shard_value_exits_with_a_usage_error(tree, value):
    result = tree.runpytest_inprocess("-o", "posttrain_harness=true", "-p", "no:cacheprovider", "--no-unit-results",
                                      "--shard", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --shard {value}: expected I/N with 1 <= I <= N, e.g. --shard 2/3"])


def test_a_bad_durations_file_exits_with_a_usage_error(tree):
    (tree.path / "broken.json").write_text("{")
    result = tree.runpytest_inprocess("-o", "posttrain_harness=true", "-p", "no:cacheprovider", "--shard", "1/2",
                                      "--shard-durations", "broken.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --shard-durations broken.json: cannot read it*"])


@pytest.mark.slow(reason="run_unit.sh as a real process")
def test_run_unit_sh_accepts_shard(tmp_path):
    """run_unit.sh refuses flags pytest does not know: --shard must be a real pytest option."""
    env = {**os.environ, "POSTTRAIN_NUM_GPUS": "0", "POSTTRAIN_UNIT_RESULTS_DIR": str(tmp_path / "results"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "tests/run_unit.sh", "--shard", "1/2", "-o", "python_files=case_*.py", "-p",
                           "no:cacheprovider", "tests/unit/testing/harness/fixture_tree/case_markers.py"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^shard 1/2: 5 of 5 selected tests \(est\. \d+ s of \d+ s\)$", proc.stdout, re.MULTILINE), \
        proc.stdout


# ---------------------------------------------------------------- merge

def shard_doc(metrics: dict, exit_status: int = 0, start: str = "2026-11-23T10:00:00Z", commit: str = "abc",
              cpu: str = "cpu A") -> dict:
    return {"exit_status": exit_status, "git_commit": commit, "start_time": start, "metrics": metrics,
            "gpu_types": [], "cpu_model": cpu, "coverage": "n/a (run without --cov)"}


def write(path: Path, doc) -> str:
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return str(path)


def test_merge_takes_the_union_of_the_shards(tmp_path, capsys):
    a = write(tmp_path / "a.json", shard_doc({"x.py::t": {"_elapsed": 1.5, "peak": 2.0}}, start="2026-11-23T10:05:00Z"))
    b = write(tmp_path / "b.json", shard_doc({"y.py::t": {"_elapsed": 3.25}, "y.py::u": {"_elapsed": 0.1}},
                                             start="2026-11-23T10:00:00Z", cpu="cpu B"))
    assert merge.main([str(tmp_path / "out.json"), a, b, "--write-durations", str(tmp_path / "d.json")]) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert out == {"exit_status": 0, "git_commit": "abc", "start_time": "2026-11-23T10:00:00Z", "gpu_types": [],
                   "cpu_model": "cpu A", "coverage": "n/a (run without --cov)",
                   "metrics": {"x.py::t": {"_elapsed": 1.5, "peak": 2.0}, "y.py::t": {"_elapsed": 3.25},
                               "y.py::u": {"_elapsed": 0.1}}}
    durations = json.loads((tmp_path / "d.json").read_text())
    assert durations == {"x.py::t": 1.5, "y.py::t": 3.25, "y.py::u": 0.1}
    assert read_durations(tmp_path / "d.json") == durations  # what --shard reads back
    assert "merged 2 shard(s), 3 tests, exit_status 0" in capsys.readouterr().out


@pytest.mark.parametrize(("statuses", "expected"), [((0, 0, 0), 0), ((0, 1, 0), 1), ((0, 5, 1), 5), ((2, 1, 0), 2)])
def test_merge_keeps_the_first_failing_exit_status(tmp_path, statuses, expected):
    paths = [write(tmp_path / f"{i}.json", shard_doc({f"m{i}.py::t": {"_elapsed": 1}}, exit_status=s))
             for i, s in enumerate(statuses)]
    assert merge.main([str(tmp_path / "out.json"), *paths]) == 0
    assert json.loads((tmp_path / "out.json").read_text())["exit_status"] == expected


@pytest.mark.parametrize(("second", "message"), [
    (shard_doc({"x.py::t": {"_elapsed": 2}}), "merge: x.py::t ran in two shards (*a.json and *b.json)"),
    (shard_doc({"y.py::t": {}}, commit="def"), "merge: *b.json: git_commit def differs from *a.json's abc*"),
    ("{not json", "merge: *b.json: cannot read it as JSON: *"),
    ({"metrics": {}}, "merge: *b.json: not a unit_results.json document (missing exit_status, git_commit, start_time)"),
    (None, "merge: *b.json: cannot read it as JSON: *No such file*"),
])
def test_merge_refuses_inputs_that_are_not_shards_of_one_run(tmp_path, capsys, second, message):
    a = write(tmp_path / "a.json", shard_doc({"x.py::t": {"_elapsed": 1}}))
    b = write(tmp_path / "b.json", second) if second is not None else str(tmp_path / "b.json")
    assert merge.main([str(tmp_path / "out.json"), a, b]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert re.fullmatch(re.escape(message).replace(r"\*", ".*"), err.strip()), err
    assert not (tmp_path / "out.json").exists()


def test_merge_combines_coverage_data(tmp_path, monkeypatch, capsys):
    """Two shards' data files of one 4-statement module: each covers 3 lines, together all 4."""
    coverage = pytest.importorskip("coverage")
    monkeypatch.chdir(tmp_path)
    module = tmp_path / "mod.py"
    module.write_text("def f(x):\n    if x:\n        return 1\n    return 2\n")
    data = []
    for name, lines in (("a", [1, 2, 3]), ("b", [1, 2, 4])):
        cov_data = coverage.CoverageData(basename=str(tmp_path / f"{name}.coverage"))
        cov_data.add_lines({str(module): lines})
        cov_data.write()
        data.append(str(tmp_path / f"{name}.coverage"))
    a = write(tmp_path / "a.json", shard_doc({"x.py::t": {"_elapsed": 1}}))
    b = write(tmp_path / "b.json", shard_doc({"y.py::t": {"_elapsed": 1}}))
    assert merge.main(["out.json", a, b, "--coverage-data", *data]) == 0
    assert json.loads((tmp_path / "out.json").read_text())["coverage"] == 100.0
    assert merge.main(["out.json", a, "--coverage-data", data[0]]) == 0
    assert json.loads((tmp_path / "out.json").read_text())["coverage"] == 75.0
    (tmp_path / "junk.coverage").write_text("junk")
    capsys.readouterr()
    assert merge.main(["out.json", a, b, "--coverage-data", data[0], "junk.coverage"]) == 2
    assert capsys.readouterr().err.startswith("merge: junk.coverage: not coverage data")


def coverage_files(tmp_path: Path, runs: dict[str, list[int]]) -> list[str]:
    """Coverage data files of ``mod.py`` (``def f(x)``: 4 statements), one per shard: the lines it ran."""
    coverage = pytest.importorskip("coverage")
    module = tmp_path / "mod.py"
    module.write_text("def f(x):\n    if x:\n        return 1\n    return 2\n")
    paths = []
    for name, lines in runs.items():
        data = coverage.CoverageData(basename=str(tmp_path / f"{name}.coverage"))
        data.add_lines({str(module): lines})
        data.write()
        paths.append(str(tmp_path / f"{name}.coverage"))
    return paths


def test_merged_coverage_is_rounded_to_2_places_and_no_table_or_data_file_is_left_behind(tmp_path, monkeypatch,
                                                                                          capsys):
    monkeypatch.chdir(tmp_path)
    data = coverage_files(tmp_path, {"a": [1, 2, 3, 7], "cwd": [1, 2, 3, 4, 7, 8]})
    # a data file of the working directory's own (a run's .coverage) is not one of the shards': left out
    os.replace(data.pop(), tmp_path / ".coverage")
    shard = write(tmp_path / "a.json", shard_doc({"x.py::t": {"_elapsed": 1}}))
    # 6 statements (lines 1, 2, 3, 4, 7, 8), 4 of them run: 66.666...%
    (tmp_path / "mod.py").write_text("def f(x):\n    if x:\n        return 1\n    return 2\n\n\n"
                                     "def g():\n    return 3\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    own = (tmp_path / ".coverage").read_bytes()
    assert merge.main(["out.json", shard, "--coverage-data", *data]) == 0
    assert json.loads((tmp_path / "out.json").read_text())["coverage"] == 66.67
    assert capsys.readouterr().out == "merged 1 shard(s), 1 tests, exit_status 0, coverage 66.67: out.json\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "out.json"])
    assert (tmp_path / ".coverage").read_bytes() == own  # neither read nor overwritten


@pytest.mark.parametrize(("setup", "message"), [
    (lambda tmp, data: os.remove(data[0]), "merge: {a}: no such coverage data file"),
    (lambda tmp, data: os.remove(tmp / "mod.py"), "merge: coverage data {a}, {b}: No source for code: '{mod}'."),
])
def test_coverage_data_that_cannot_be_combined_is_one_line_naming_the_files(tmp_path, monkeypatch, capsys, setup,
                                                                            message):
    monkeypatch.chdir(tmp_path)
    data = coverage_files(tmp_path, {"a": [1, 2], "b": [1, 4]})
    setup(tmp_path, data)
    shard = write(tmp_path / "s.json", shard_doc({"x.py::t": {"_elapsed": 1}}))
    assert merge.main(["out.json", shard, "--coverage-data", *data]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0].startswith(message.format(a=data[0], b=data[1], mod=tmp_path / "mod.py"))
    assert err.count("\n") == 1


def test_the_machine_is_the_first_shards_and_empty_when_it_does_not_say(tmp_path):
    a = shard_doc({"x.py::t": {"_elapsed": 1}})
    del a["gpu_types"], a["cpu_model"]
    b = shard_doc({"y.py::t": {"_elapsed": 1}}) | {"gpu_types": ["H100"]}
    merged = merge.merge([("a", a), ("b", b)])
    assert (merged["gpu_types"], merged["cpu_model"]) == ([], "")
    merged = merge.merge([("b", b), ("a", a)])
    assert (merged["gpu_types"], merged["cpu_model"]) == (["H100"], "cpu A")


def test_nothing_to_merge_is_an_error():
    with pytest.raises(merge.MergeError, match=r"^nothing to merge: give at least one unit_results.json$"):
        merge.merge([])


def test_a_json_that_is_not_an_object_with_metrics_is_refused_naming_it(tmp_path, capsys):
    bad = write(tmp_path / "b.json", "[1, 2]")
    assert merge.main([str(tmp_path / "out.json"), bad]) == 2
    assert capsys.readouterr().err == f"merge: {bad}: not a unit_results.json document (no metrics object)\n"


def test_only_tests_with_a_recorded_time_have_a_duration_and_it_is_the_whole_tests(tmp_path):
    doc = shard_doc({"b.py::t": {"_elapsed": 2}, "a.py::t": {"_elapsed": 0.5}, "c.py::t": {"peak": 1.0},
                     "d.py::t": {"_elapsed": "1"}, "e.py::t": 3.0, "f.py::t": {"_elapsed": 1, "_total": 4.5},
                     "g.py::t": {"_total": 0.25}})  # g: its set-up failed, its call never ran
    assert list(merge.durations(doc).items()) == [("a.py::t", 0.5), ("b.py::t", 2.0), ("f.py::t", 4.5)]
    path = tmp_path / "results.json"
    for malformed in ("d.py::t", "e.py::t"):  # --shard refuses them; merge leaves them out
        del doc["metrics"][malformed]
    path.write_text(json.dumps(doc))
    assert shards.read_durations(path) == {"a.py::t": 0.5, "b.py::t": 2.0, "f.py::t": 4.5}


def test_the_outputs_are_sorted_indented_json_in_directories_made_for_them(tmp_path):
    a = write(tmp_path / "a.json", shard_doc({"y.py::t": {"_elapsed": 1}, "x.py::t": {"_elapsed": 2}}))
    out, durations = tmp_path / "new" / "dir" / "out.json", tmp_path / "other" / "durations.json"
    assert merge.main([str(out), a, "--write-durations", str(durations)]) == 0
    for path in (out, durations):
        doc = json.loads(path.read_text())
        assert path.read_text() == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    assert list(json.loads(durations.read_text())) == ["x.py::t", "y.py::t"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.json"]  # no temporary file left


MERGE_HELP = """usage: python -m posttrain.testing.harness.merge [-h] [--coverage-data FILE [FILE ...]]
[--write-durations PATH] out inputs [inputs ...]
Merge the unit_results.json files of --shard runs.
positional arguments:
out merged unit_results.json to write
inputs the shards' unit_results.json files
options:
-h, --help show this help message and exit
--coverage-data FILE [FILE ...] the shards' coverage data files (.coverage) to combine into the total
--write-durations PATH also write {nodeid: seconds} here (for tests/durations.json)"""


def test_the_merge_help_names_its_arguments(capsys):
    with pytest.raises(SystemExit) as exited:
        merge.main(["--help"])
    assert exited.value.code == 0
    assert "".join(capsys.readouterr().out.split()) == "".join(MERGE_HELP.split())  # however argparse wraps it
