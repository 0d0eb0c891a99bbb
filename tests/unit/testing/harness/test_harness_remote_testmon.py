"""Remote-aware testmon (posttrain.testing.harness.remote_testmon): with ``--testmon``, a test whose
imported code changed runs again even when that code only runs in another process (a Ray actor in
posttrain; a subprocess here), where testmon's coverage cannot see it.

The inner runs are real pytest sessions with real testmon, in this process (``runpytest_inprocess``:
a fraction of a second each, and mutmut sees the plugin's calls), on a small tree: package ``mypkg``
with a driver module and a worker module whose function body only ever runs in a subprocess. Which
tests ran is read from the harness's unit_results.json (one entry per test whose call phase ran).
"""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from posttrain.testing.harness import remote_testmon  # its testmon_asked would be collected as a test
from posttrain.testing.harness.remote_testmon import (
    MAP_FILE,
    STATE_FILE,
    ImportMap,
    RemoteState,
    file_hash,
    fixture_name,
    home_file,
    import_root,
    only_markexpr_blocks_selection,
    relpath,
)

REPO_TABLE = Path(__file__).resolve().parents[4] / "tests" / "configurations.toml"

TREE = {
    "mypkg/__init__.py": "",
    "mypkg/driver.py": "def double(x):\n    return 2 * x\n",
    # Only its module level runs in the test process (imported by remote.py); work()'s body runs in a child.
    "mypkg/worker.py": "def work(x):\n    return x + 1\n",
    "mypkg/remote.py": '''
import subprocess
import sys
from pathlib import Path

from mypkg import worker  # noqa: F401 (the actor class would be defined here, its methods run elsewhere)

ROOT = Path(__file__).resolve().parent.parent


def run_remote(x):
    code = f"from mypkg.worker import work; print(work({x}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return int(out.stdout)
''',
    "test_driver.py": '''
from mypkg.driver import double

def test_double():
    assert double(2) == 4

def test_double_zero():
    assert double(0) == 0
''',
    "test_worker.py": '''
def test_work():
    from mypkg.remote import run_remote  # imported lazily, as posttrain's tests do
    assert run_remote(2) == 3
''',
    "test_plain.py": "def test_plain():\n    assert True\n",
}
ALL = ["test_driver.py::test_double", "test_driver.py::test_double_zero", "test_plain.py::test_plain",
       "test_worker.py::test_work"]
DRIVER_TESTS = ["test_driver.py::test_double", "test_driver.py::test_double_zero"]
WORKER_TESTS = ["test_worker.py::test_work"]


class Tree:
    """The pytester directory holding TREE, and inner ``pytest --testmon`` runs in it."""

    def __init__(self, pytester: pytest.Pytester):
        self.pytester = pytester
        self.path = pytester.path
        for name, text in TREE.items():
            (self.path / name).parent.mkdir(parents=True, exist_ok=True)
            (self.path / name).write_text(text)
        pytester.makeini("[pytest]\n")  # pins the rootdir to the tree

    def edit(self, name: str, old: str, new: str) -> None:
        path = self.path / name
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new))

    def run(self, *args: str, ret: int = 0) -> pytest.RunResult:
        """One inner run, in this process; its exit status must be ``ret`` (an INTERNALERROR after the tests
        ran is 3). pytester restores ``sys.modules`` after it, so each run imports the tree anew; testmon's
        coverage nests under an outer one (``--cov``, an outer ``--testmon``)."""
        # The repository's configuration table makes the harness's deselection report read the markers
        # of every deselected item, as in a real run (testmon's own placeholders have none).
        result = self.pytester.runpytest_inprocess(
            "-o", "posttrain_harness=true", "-o", "posttrain_remote_packages=mypkg",
            "-o", f"posttrain_configurations={REPO_TABLE}", "--testmon", *args)
        assert result.ret == ret, result.stdout.str() + result.stderr.str()
        return result

    def ran(self) -> list[str]:
        """Node ids whose call phase ran in the latest inner run."""
        doc = json.loads((self.path / "results" / "unit_results.json").read_text())
        return sorted(doc["metrics"])

    def seed(self) -> None:
        self.run()
        assert self.ran() == ALL


@pytest.fixture
def tree(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Tree:
    monkeypatch.setenv("POSTTRAIN_UNIT_RESULTS_DIR", str(pytester.path / "results"))
    monkeypatch.setenv("POSTTRAIN_NUM_GPUS", "0")
    monkeypatch.delenv("TESTMON_DATAFILE", raising=False)  # an outer --testmon run must not lend its data file
    return Tree(pytester)


def test_the_first_run_seeds_and_runs_everything(tree):
    result = tree.run()
    assert tree.ran() == ALL
    result.stdout.fnmatch_lines(["remote-aware testmon: +0 tests re-selected; 3 test modules seeded (no map entry)"])
    mapping = json.loads((tree.path / MAP_FILE).read_text())
    # the lazy import inside test_work reaches worker.py through remote.py
    assert mapping == {"test_driver.py": ["mypkg/__init__.py", "mypkg/driver.py"], "test_plain.py": [],
                       "test_worker.py": ["mypkg/__init__.py", "mypkg/remote.py", "mypkg/worker.py"]}
    state = json.loads((tree.path / STATE_FILE).read_text())
    assert set(state["hashes"]) == {"mypkg/__init__.py", "mypkg/driver.py", "mypkg/remote.py", "mypkg/worker.py",
                                    "test_driver.py", "test_plain.py", "test_worker.py"}
    assert state["pending"] == {}


def test_a_second_run_without_edits_deselects_everything(tree):
    tree.seed()
    # exit 0 even with run_unit.sh's --fail-on-nothing-ran: nothing affected is not "nothing tested"
    result = tree.run("--fail-on-nothing-ran")
    assert tree.ran() == []
    result.stdout.fnmatch_lines(["*4 deselected: unaffected by your edits (--testmon)",
                                 "nothing to re-run: no selected test is affected by your edits*"])


def test_editing_driver_code_narrows_to_the_tests_that_use_it(tree):
    tree.seed()
    tree.edit("mypkg/driver.py", "2 * x", "x * 2")
    result = tree.run()
    assert tree.ran() == DRIVER_TESTS
    # testmon saw this change itself: nothing to add, the changed file is still named
    result.stdout.fnmatch_lines(["remote-aware testmon: +0 tests re-selected for changed files: mypkg/driver.py"])


def test_editing_code_that_runs_only_in_a_worker_reselects_the_tests_that_drive_it(tree):
    tree.seed()
    tree.edit("mypkg/worker.py", "x + 1", "1 + x")

    tree.run("--no-remote-map")  # testmon on its own: the worker's body never ran under its coverage
    assert tree.ran() == []

    result = tree.run()
    assert tree.ran() == WORKER_TESTS
    result.stdout.fnmatch_lines(["remote-aware testmon: +1 tests re-selected for changed files: mypkg/worker.py"])
    tree.run()
    assert tree.ran() == []


def test_k_matches_run_even_when_nothing_changed(tree):
    tree.seed()
    tree.run("-k", "double or plain")
    assert tree.ran() == [*DRIVER_TESTS, "test_plain.py::test_plain"]


def test_a_change_stays_pending_for_the_tests_a_run_left_out(tree):
    tree.seed()
    tree.edit("mypkg/worker.py", "x + 1", "1 + x")
    tree.run("-k", "plain")  # passes, but test_work did not run
    assert tree.ran() == ["test_plain.py::test_plain"]
    tree.run()
    assert tree.ran() == WORKER_TESTS
    tree.run()
    assert tree.ran() == []


def test_the_tiers_marker_filter_keeps_the_selection_on(tree):
    # run_unit.sh always passes -m (the configuration's marker filter); testmon alone stops selecting then
    tree.seed()
    tree.edit("mypkg/worker.py", "x + 1", "1 + x")
    result = tree.run("-m", "not slow")
    assert tree.ran() == WORKER_TESTS
    result.stdout.fnmatch_lines(["testmon: selection kept on under -m (the tier's marker filter), changed files: 0,*"])


def test_a_session_with_a_failure_records_nothing(tree):
    tree.seed()
    tree.edit("mypkg/worker.py", "x + 1", "1 + x")
    tree.edit("test_driver.py", "double(0) == 0", "double(0) == 1")
    tree.run(ret=1)
    assert tree.ran() == [*DRIVER_TESTS, *WORKER_TESTS]
    tree.edit("test_driver.py", "double(0) == 1", "double(0) == 0")
    result = tree.run()  # the worker change was not recorded: its test runs again, with the one fixed
    assert tree.ran() == ["test_driver.py::test_double_zero", *WORKER_TESTS]
    # test_double, stable, is deselected as an item: the harness's deselection report reads it without a crash
    result.stdout.fnmatch_lines(["*2 passed, 1 deselected*"])


def test_deleting_the_two_files_rebuilds_them(tree):
    tree.seed()
    (tree.path / MAP_FILE).unlink()
    (tree.path / STATE_FILE).unlink()
    result = tree.run()
    assert tree.ran() == ALL  # testmon alone would run nothing: it has seen no change
    result.stdout.fnmatch_lines(["remote-aware testmon: +4 tests re-selected; 3 test modules seeded (no map entry)"])
    assert (tree.path / MAP_FILE).is_file() and (tree.path / STATE_FILE).is_file()
    tree.run()
    assert tree.ran() == []


def test_the_import_map_follows_lazy_imports_conftests_helpers_and_the_package(tmp_path):
    files = {
        "pyproject.toml": "",
        "pkg/__init__.py": "",
        "pkg/a.py": "from . import b\n",  # package importing package, relative
        "pkg/b.py": "import os\nfrom pkg import NAME\n",  # a name, not a module: pkg/__init__.py only
        "pkg/c.py": "from pkg.sub import deep\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/deep.py": "from ..leaf import x\n",  # two levels up: pkg/leaf.py
        "pkg/leaf.py": "",
        "pkg/unused.py": "",
        "tests/conftest.py": (  # applies to every test; a fixture's lazy imports only to the tests requesting it
            "import pytest\n\n"
            "def pytest_configure(config):\n    import pkg.c\n\n"
            "@pytest.fixture\ndef used():\n    import pkg.sub\n\n"
            "@pytest.fixture(name='renamed')\ndef _renamed():\n    import pkg.unused\n"),
        "tests/harness/backends.py": "from pkg import a\n",  # on the ini pythonpath (tests)
        "tests/unit/sub/refit_helpers.py": "import json\nimport neighbor\n",  # next to the test (its import root)
        "tests/unit/sub/neighbor.py": "",  # a helper's bare import from the test's import root (on sys.path)
        "tests/unit/sub/test_x.py": (  # its own fixtures' bodies count whoever requests them
            "import pytest\n\n"
            "def test_x():\n    from harness.backends import make\n    from refit_helpers import r\n\n"
            "@pytest.fixture\ndef own():\n    import pkg.own\n"),
        "pkg/own.py": "",
        "tests/other/conftest.py": "import pkg.unused\n",  # another directory's: does not apply
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    builder = ImportMap(tmp_path, ["pkg"], [tmp_path / "tests"])
    test_x = tmp_path / "tests/unit/sub/test_x.py"
    expected = ["pkg/__init__.py", "pkg/a.py", "pkg/b.py", "pkg/c.py", "pkg/leaf.py", "pkg/own.py",
                "pkg/sub/__init__.py", "pkg/sub/deep.py", "tests/conftest.py", "tests/harness/backends.py",
                "tests/unit/sub/neighbor.py", "tests/unit/sub/refit_helpers.py"]
    assert builder.entry(test_x, fixtures=["used"]) == expected
    assert builder.entry(test_x, fixtures=["used", "renamed"]) == sorted([*expected, "pkg/unused.py"])
    assert builder.entry(test_x) == sorted([*expected, "pkg/unused.py"])  # fixtures unknown: every body counts


@pytest.mark.slow(reason="inner pytest --testmon runs under xdist as real processes")
def test_under_xdist_workers_select_and_the_controller_records_after_a_passing_session(tree):
    """``--testmon -n 2``: testmon selects in each worker; the map and state are written by the controller,
    from what the workers collected, and only when nothing failed."""
    n2 = ("-n", "2", "--dist", "loadfile")
    result = tree.run(*n2)
    assert tree.ran() == ALL
    result.stdout.fnmatch_lines(["remote-aware testmon: +0 tests re-selected; 3 test modules seeded (no map entry)"])
    assert json.loads((tree.path / MAP_FILE).read_text())["test_worker.py"] == [
        "mypkg/__init__.py", "mypkg/remote.py", "mypkg/worker.py"]

    tree.edit("mypkg/worker.py", "x + 1", "1 + x")
    tree.edit("test_driver.py", "double(0) == 0", "double(0) == 1")
    tree.run(*n2, "-m", "not slow", ret=1)  # -m: the tier's filter keeps the selection on in the workers too
    assert tree.ran() == [*DRIVER_TESTS, *WORKER_TESTS]
    tree.edit("test_driver.py", "double(0) == 1", "double(0) == 0")
    result = tree.run(*n2)  # the failing session recorded nothing: the worker change is still pending
    assert tree.ran() == ["test_driver.py::test_double_zero", *WORKER_TESTS]
    result.stdout.fnmatch_lines(["remote-aware testmon: +1 tests re-selected for changed files: *mypkg/worker.py*"])
    result = tree.run(*n2, "--fail-on-nothing-ran")
    assert tree.ran() == []
    result.stdout.fnmatch_lines(["*4 deselected: unaffected by your edits (--testmon)",
                                 "nothing to re-run: no selected test is affected by your edits*"])


def test_a_watched_package_outside_the_rootdir_is_followed_where_python_finds_it(tmp_path):
    """An installed package (here the stdlib's ``json``, a package, and ``textwrap``, one file) maps by
    absolute path; a watched name Python cannot find maps to nothing; a conftest above the rootdir does
    not apply; a file that does not parse is kept but not followed."""
    import json as json_package
    import textwrap

    root = tmp_path / "root"
    (root / "pkg").mkdir(parents=True)
    (tmp_path / "conftest.py").write_text("import pkg.above\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "broken.py").write_text("import pkg.after\ndef (:\n")
    (root / "pkg" / "after.py").write_text("")
    (root / "pkg" / "above.py").write_text("")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "helper_out.py").write_text("")  # on the pythonpath, outside the rootdir: not mapped
    (root / "test_a.py").write_text("import json.decoder\nimport textwrap\nimport nosuchpkg_xyz.a\nimport pkg.broken\n"
                                    "import helper_out\n")
    builder = ImportMap(root, ["json", "textwrap", "nosuchpkg_xyz", "pkg"], [tmp_path / "outside"])
    stdlib_json = Path(json_package.__file__).resolve().parent
    assert builder.entry(root / "test_a.py") == sorted(
        [*(f"{stdlib_json}/{name}.py" for name in ("__init__", "decoder", "encoder", "scanner")),
         Path(textwrap.__file__).resolve().as_posix(), "pkg/__init__.py", "pkg/broken.py"])
    assert builder.imports(root / "pkg" / "broken.py") == []


def test_the_watched_packages_are_posttrain_by_default_and_one_per_line_in_the_ini(tree):
    (tree.path / "test_uses_posttrain.py").write_text(
        "def test_it():\n    import json.scanner\n    import posttrain.testing.harness.budget\n")
    tree.pytester.runpytest_inprocess("--testmon", "-o", "posttrain_harness=true", "test_uses_posttrain.py")
    entry = json.loads((tree.path / MAP_FILE).read_text())["test_uses_posttrain.py"]
    ends = ("/posttrain/__init__.py", "/posttrain/testing/harness/budget.py")
    assert [end for end in ends if any(f.endswith(end) for f in entry)] == list(ends)
    assert not any("/json/" in f for f in entry)  # the stdlib is not watched

    tree.pytester.makeini("[pytest]\nposttrain_remote_packages =\n    mypkg\n    json\n")
    tree.pytester.runpytest_inprocess("--testmon", "-o", "posttrain_harness=true", "test_uses_posttrain.py")
    entry = json.loads((tree.path / MAP_FILE).read_text())["test_uses_posttrain.py"]
    assert [f.rsplit("/", 2)[-2:] for f in entry] == [
        ["json", "__init__.py"], ["json", "decoder.py"], ["json", "encoder.py"], ["json", "scanner.py"]]


def test_help_names_the_ini_option_and_the_flag(pytester):
    result = pytester.runpytest_inprocess("-o", "posttrain_harness=true", "--help")
    text = " ".join(result.stdout.str().split())  # the terminal's width wraps the lines
    # the flag is listed in the harness's group: the last group heading above it is "posttrain harness:"
    lines = result.stdout.lines
    above = lines[:next(i for i, line in enumerate(lines) if line.lstrip().startswith("--no-remote-map"))]
    assert [line for line in above if line.endswith(":") and not line.startswith(" ")][-1] == "posttrain harness:"
    assert ("--no-remote-map with --testmon: testmon's own selection only (no import map, .remote_*.json "
            "neither read nor written)") in text
    assert ("posttrain_remote_packages (linelist): packages whose modules the --testmon import map follows "
            "(remote-aware testmon)") in text

# ---------------------------------------------------------------- the pieces, in this process


def test_the_state_files_round_trip_and_a_missing_or_unreadable_one_is_empty(tmp_path):
    assert RemoteState.load(tmp_path) == RemoteState()
    state = RemoteState({"t.py": ["b.py", "a.py"], "s.py": []}, {"a.py": "1"}, {"a.py": ["t.py"]})
    state.save(tmp_path)
    assert RemoteState.load(tmp_path) == state
    assert (tmp_path / STATE_FILE).read_text() == (
        '{\n "hashes": {\n  "a.py": "1"\n },\n "pending": {\n  "a.py": [\n   "t.py"\n  ]\n }\n}\n')
    assert (tmp_path / MAP_FILE).read_text() == '{\n "s.py": [],\n "t.py": [\n  "b.py",\n  "a.py"\n ]\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([MAP_FILE, STATE_FILE])  # no .tmp left
    (tmp_path / MAP_FILE).write_text("{not json")
    (tmp_path / STATE_FILE).write_text("[1, 2]")  # JSON, not an object
    assert RemoteState.load(tmp_path) == RemoteState()


def test_file_names_hashes_and_import_roots(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    module = tmp_path / "pkg" / "sub" / "m.py"
    module.write_bytes(b"x = 1\n")
    assert file_hash(module) == hashlib.sha1(b"x = 1\n").hexdigest()
    assert [file_hash(p) for p in (tmp_path / "gone.py", tmp_path / "pkg", module / "below")] == [None] * 3
    assert import_root(module) == tmp_path  # the first ancestor without an __init__.py
    assert import_root(tmp_path / "test_top.py") == tmp_path
    assert relpath(module, tmp_path) == "pkg/sub/m.py"
    assert relpath(tmp_path / "pkg" / ".." / "pkg" / "sub" / "m.py", tmp_path) == "pkg/sub/m.py"
    assert relpath(tmp_path, tmp_path / "pkg") == tmp_path.as_posix()  # outside the rootdir: absolute
    assert home_file("tests/a.py::T::t[1::2]") == "tests/a.py"
    assert home_file("tests/a.py") == "tests/a.py"


@pytest.mark.parametrize(("source", "name"), [
    ("@pytest.fixture\ndef f(): pass", "f"),
    ("@pytest.fixture(scope='module')\ndef f(): pass", "f"),
    ("@fixture\ndef f(): pass", "f"),
    ("@fixture(name='renamed')\ndef f(): pass", "renamed"),
    ("@pytest.fixture(name='renamed')\nasync def f(): pass", "renamed"),
    ("@pytest.fixture(name=NAME)\ndef f(): pass", "f"),  # not a literal: the function's name
    ("@pytest.mark.slow\ndef f(): pass", None),
    ("@other\ndef f(): pass", None),
    ("def f(): pass", None),
    ("class fixture: pass", None),
    ("x = 1", None),
])  # fmt: skip
def test_a_fixture_is_a_function_decorated_with_fixture_by_its_name_argument_or_its_own(source, name):
    assert fixture_name(ast.parse(source).body[0]) == name


def options(**values) -> SimpleNamespace:
    """A pytest config whose options are ``values`` (getoption as pytest's, default when absent)."""
    return SimpleNamespace(option=SimpleNamespace(**values),
                           getoption=lambda name, default=None: values.get(name, default))


@pytest.mark.parametrize(("values", "asked"), [
    ({"testmon": True}, True),
    ({"testmon_forceselect": True}, True),
    ({"testmon": True, "no-testmon": True}, False),
    ({}, False),
    ({"testmon": False, "testmon_forceselect": False}, False),
])  # fmt: skip
def test_testmon_counts_as_asked_for_by_either_select_flag_unless_switched_off(values, asked):
    assert remote_testmon.testmon_asked(options(**values)) is asked


@pytest.mark.parametrize(("values", "blocks"), [
    ({"markexpr": "not slow"}, True),
    ({"markexpr": "not slow", "file_or_dir": ["tests/unit", "tests/a.py"]}, True),
    ({"markexpr": ""}, False),
    ({}, False),
    ({"markexpr": "not slow", "keyword": "refit"}, False),
    ({"markexpr": "not slow", "lf": True}, False),
    ({"markexpr": "not slow", "testmon_noselect": True}, False),
    ({"markexpr": "not slow", "file_or_dir": ["tests/a.py::test_x"]}, False),
])  # fmt: skip
def test_only_m_alone_is_the_reason_testmon_stops_selecting_that_the_harness_undoes(values, blocks):
    assert only_markexpr_blocks_selection(options(**values)) is blocks


# ---------------------------------------------------------------- what the state files hold, run by run


def state(tree: Tree) -> dict:
    return json.loads((tree.path / STATE_FILE).read_text())


def test_a_test_a_run_left_out_keeps_the_change_by_its_node_id(tree):
    tree.seed()
    tree.edit("mypkg/worker.py", "x + 1", "1 + x")
    tree.run("-k", "plain or double")  # -k: testmon runs every match; test_work is not one
    assert state(tree)["pending"] == {"test_worker.py::test_work": ["mypkg/worker.py"]}
    assert state(tree)["hashes"]["mypkg/worker.py"] == file_hash(tree.path / "mypkg/worker.py")
    tree.run("-k", "plain")  # still not run: still pending, though the file's hash is recorded
    assert state(tree)["pending"] == {"test_worker.py::test_work": ["mypkg/worker.py"]}
    result = tree.run()
    assert tree.ran() == WORKER_TESTS
    result.stdout.fnmatch_lines(["remote-aware testmon: +1 tests re-selected for changed files: mypkg/worker.py"])
    assert state(tree)["pending"] == {}


def test_a_pending_test_that_is_gone_is_dropped(tree):
    tree.seed()
    tree.edit("mypkg/worker.py", "x + 1", "1 + x")
    tree.run("-k", "plain or double")
    tree.edit("test_worker.py", "def test_work", "def test_work_renamed")
    tree.run()
    assert tree.ran() == ["test_worker.py::test_work_renamed"]
    assert state(tree)["pending"] == {}


def test_a_module_that_stopped_importing_a_changed_file_keeps_it_among_its_reasons(tree):
    tree.seed()
    tree.edit("mypkg/__init__.py", "", "# edited\n")
    tree.edit("test_worker.py", "assert run_remote(2) == 3", "assert True")
    tree.edit("test_worker.py", "from mypkg.remote import run_remote  # imported lazily, as posttrain's tests do", "")
    tree.run("-k", "plain")
    assert state(tree)["pending"] == {
        "test_driver.py::test_double": ["mypkg/__init__.py"], "test_driver.py::test_double_zero": ["mypkg/__init__.py"],
        "test_worker.py::test_work": ["mypkg/__init__.py", "test_worker.py"]}


def test_a_run_of_node_ids_keeps_the_change_for_the_whole_module(tree):
    # the module's other tests were not collected: which of them import the change is unknown
    with (tree.path / "test_worker.py").open("a") as module:
        module.write("\ndef test_work_again():\n    from mypkg.remote import run_remote\n"
                     "    assert run_remote(0) == 1\n")
    tree.run()
    tree.edit("mypkg/worker.py", "x + 1", "1 + x")
    tree.run("test_worker.py::test_work")
    assert tree.ran() == WORKER_TESTS
    assert state(tree)["pending"] == {"test_worker.py": ["mypkg/worker.py"]}
    result = tree.run()
    assert tree.ran() == ["test_worker.py::test_work", "test_worker.py::test_work_again"]
    result.stdout.fnmatch_lines(["remote-aware testmon: +2 tests re-selected for changed files: mypkg/worker.py"])
    assert state(tree)["pending"] == {}


def test_a_node_id_given_from_a_subdirectory_names_its_module_from_there(tree, monkeypatch):
    (tree.path / "sub").mkdir()
    (tree.path / "sub" / "test_s.py").write_text(
        "def test_s1():\n    import mypkg.remote\n\ndef test_s2():\n    import mypkg.remote\n")
    tree.pytester.makeini("[pytest]\npythonpath = .\n")  # mypkg importable from sub/
    tree.run()
    tree.edit("mypkg/worker.py", "x + 1", "1 + x")
    monkeypatch.chdir(tree.path / "sub")
    tree.run("test_s.py::test_s1")
    assert tree.ran() == ["sub/test_s.py::test_s1"]
    # test_worker.py was not collected: its module keeps the change too
    assert state(tree)["pending"] == {"sub/test_s.py": ["mypkg/worker.py"], "test_worker.py": ["mypkg/worker.py"]}
    monkeypatch.chdir(tree.path)
    tree.run()
    assert tree.ran() == ["sub/test_s.py::test_s1", "sub/test_s.py::test_s2", *WORKER_TESTS]


def test_with_testmon_neither_selecting_nor_collecting_every_match_runs(tree):
    # -k switches testmon's selection off and --testmon-nocollect its collection: it has no data at all
    tree.seed()
    tree.run("--testmon-nocollect", "-k", "plain")
    assert tree.ran() == ["test_plain.py::test_plain"]


def test_without_testmon_loaded_the_harness_runs_every_test(tree):
    result = tree.pytester.runpytest_inprocess("-p", "no:pytest-testmon", "-o", "posttrain_harness=true")
    assert result.ret == 0, result.stdout.str()
    assert tree.ran() == ALL


def test_a_conftest_fixtures_imports_map_to_the_modules_whose_tests_request_it(tree):
    (tree.path / "conftest.py").write_text(
        "import pytest\n\n@pytest.fixture\ndef remote():\n    from mypkg.remote import run_remote\n"
        "    return run_remote\n")
    (tree.path / "test_fixture.py").write_text(
        "def test_alone():\n    pass\n\ndef test_uses(remote):\n    assert remote(1) == 2\n")
    remote_files = ["conftest.py", "mypkg/__init__.py", "mypkg/remote.py", "mypkg/worker.py"]
    tree.run("test_fixture.py::test_alone")  # its module's other tests, not collected, may request any fixture
    assert json.loads((tree.path / MAP_FILE).read_text())["test_fixture.py"] == remote_files
    tree.run()
    mapping = json.loads((tree.path / MAP_FILE).read_text())
    assert mapping["test_fixture.py"] == remote_files
    assert mapping["test_plain.py"] == ["conftest.py"]
    tree.edit("mypkg/worker.py", "x + 1", "1 + x")
    tree.run()
    assert tree.ran() == ["test_fixture.py::test_alone", "test_fixture.py::test_uses", *WORKER_TESTS]


def test_a_plugins_item_without_fixtures_from_a_test_module_is_recorded_with_it(tree):
    # as pytest-mypy's items: collected from a .py file, not a test function, no fixturenames
    (tree.path / "conftest.py").write_text(
        "import pytest\n\n"
        "class Lint(pytest.Item):\n    def runtest(self):\n        pass\n\n"
        "class LintFile(pytest.File):\n    def collect(self):\n        yield Lint.from_parent(self, name='lint')\n\n"
        "def pytest_collect_file(file_path, parent):\n"
        "    if file_path.name == 'test_plain.py':\n        return LintFile.from_parent(parent, path=file_path)\n")
    tree.run()
    assert "test_plain.py::lint" in tree.ran()
    assert json.loads((tree.path / MAP_FILE).read_text())["test_plain.py"] == ["conftest.py"]


def test_a_node_id_run_of_a_new_module_leaves_it_seeding(tree):
    tree.run("test_worker.py::test_work")
    # new to the state: every file of its map is a change too
    assert state(tree)["pending"] == {"test_worker.py": [remote_testmon.SEED, "mypkg/__init__.py", "mypkg/remote.py",
                                                         "mypkg/worker.py", "test_worker.py"]}
    assert sorted(json.loads((tree.path / MAP_FILE).read_text())) == ["test_worker.py"]
    tree.run()
    assert tree.ran() == ALL
    assert state(tree)["pending"] == {}


def test_a_deleted_test_module_is_forgotten(tree):
    tree.seed()
    tree.edit("test_plain.py", "assert True", "assert 1")
    tree.run("-k", "double or work")
    assert state(tree)["pending"] == {"test_plain.py::test_plain": ["test_plain.py"]}
    (tree.path / "test_plain.py").unlink()
    tree.edit("mypkg/worker.py", "x + 1", "1 + x")
    tree.run()
    assert tree.ran() == WORKER_TESTS
    assert sorted(json.loads((tree.path / MAP_FILE).read_text())) == ["test_driver.py", "test_worker.py"]
    assert "test_plain.py" not in state(tree)["hashes"]
    assert state(tree)["pending"] == {}


def test_a_deleted_package_module_is_a_change(tree):
    tree.seed()
    (tree.path / "mypkg/worker.py").unlink()
    tree.edit("mypkg/remote.py", "from mypkg import worker  # noqa: F401 (the actor class would be defined here, "
              "its methods run elsewhere)", "")
    tree.edit("test_worker.py", "assert run_remote(2) == 3", "assert run_remote")
    result = tree.run()
    assert tree.ran() == WORKER_TESTS
    result.stdout.fnmatch_lines(["remote-aware testmon: +0 tests re-selected for changed files: "
                                 "mypkg/remote.py, mypkg/worker.py, test_worker.py"])
    assert "mypkg/worker.py" not in state(tree)["hashes"]


def test_the_summary_names_eight_changed_files_and_counts_the_rest(tree):
    names = [f"m{i}" for i in range(10)]
    for name in names:  # function bodies that never run: testmon cannot see an edit to them
        (tree.path / "mypkg" / f"{name}.py").write_text("def f():\n    return 0\n")
    (tree.path / "test_many.py").write_text("import mypkg." + ", mypkg.".join(names) + "\n\n"
                                            "def test_many():\n    pass\n")
    tree.run()
    shown = ", ".join(f"mypkg/m{i}.py" for i in range(8))
    for name in names[:8]:
        tree.edit(f"mypkg/{name}.py", "return 0", "return 1")
    result = tree.run()
    assert tree.ran() == ["test_many.py::test_many"]
    result.stdout.fnmatch_lines([f"remote-aware testmon: +1 tests re-selected for changed files: {shown}"])
    for name in names:
        tree.edit(f"mypkg/{name}.py", "return ", "return 1 + ")
    result = tree.run()
    result.stdout.fnmatch_lines([f"remote-aware testmon: +1 tests re-selected for changed files: {shown} and 2 more"])


def test_a_change_whose_tests_m_drops_is_not_news(tree):
    tree.seed()
    tree.edit("test_worker.py", "def test_work", "import pytest\n\n@pytest.mark.slow(reason='x')\ndef test_work")
    tree.edit("mypkg/worker.py", "x + 1", "1 + x")
    result = tree.run("-m", "not slow")
    result.stdout.fnmatch_lines(["remote-aware testmon: nothing changed"])


def test_collect_only_and_no_remote_map_record_nothing(tree):
    tree.run("--collect-only")
    assert not (tree.path / MAP_FILE).exists() and not (tree.path / STATE_FILE).exists()
    result = tree.run("--no-remote-map")
    assert tree.ran() == ALL
    assert "remote-aware testmon" not in result.stdout.str()
    assert not (tree.path / MAP_FILE).exists() and not (tree.path / STATE_FILE).exists()
