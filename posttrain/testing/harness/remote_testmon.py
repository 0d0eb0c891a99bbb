"""Remote-aware testmon: re-select tests whose imported code changed, even code that only runs in actors.

pytest-testmon selects a test by the lines coverage saw it execute in the pytest process. Code that
runs only inside a ``@ray.remote`` actor (or any other process) is never seen, so editing it selects
nothing. This plugin adds a static map, built from the sources' ASTs (nothing is imported): for each
test module, the files it imports transitively (the watched packages' modules, ini
``posttrain_remote_packages``, default ``posttrain``, plus the test helpers and ``conftest.py`` files on
the way; a conftest fixture's imports count only for the modules that request it). A test testmon
deselected is put back when a file of its module's map (or the module itself) changed since the last
passing session, or its module has no map entry yet (seeding).

Two files in the rootdir, next to testmon's ``.testmondata``:

- ``.remote_map.json``: ``{test module: [files it imports transitively]}``, paths relative to the
  rootdir (absolute outside it).
- ``.remote_state.json``: ``{"hashes": {file: sha1 of its bytes}, "pending": {test module or node id:
  [changed files]}}``. Hashes, not mtimes: a checkout or ``touch`` that keeps the bytes re-selects
  nothing. ``pending`` keeps a change for the tests that did not run since it (outside this run's
  paths, deselected by ``-m``/``-k``), so a run over a subset does not make the others forget it.

Both are written only at the end of a session in which nothing failed, so a failing test and a change
not yet tested stay selected. Deleting them re-seeds (every test module known to testmon runs again).
Untracked: YAML/JSON/shell/data files, imports by string (``importlib.import_module(name)``).

How it meets testmon (2.x, ``testmon.pytest_testmon.TestmonSelect``): testmon skips whole stable files
in ``pytest_ignore_collect`` (list ``deselected_files``) and drops stable tests in a trylast
``pytest_collection_modifyitems`` (list ``deselected_tests``), reporting them as placeholder objects
that are not items. Before collection this plugin takes the files and tests to put back out of those
two lists; testmon offers no hook to add tests, and its lists are the only seam. It also drops the
remaining stable tests itself, with the real items, so ``pytest_deselected`` listeners (the harness's
deselection report reads their markers) never see the placeholders. ``-k``, ``--lf`` and manual node ids
switch testmon's selection off (all matches run); ``-m`` alone (every run_unit.sh configuration passes
one) keeps it on here, the matches being the tier rather than a choice of tests.

Under pytest-xdist (``-n``) testmon 2.x selects in every worker (each collects the whole suite; the
controller hands them its execution id) and its controller alone writes ``.testmondata``. So does this
plugin: each worker puts back and drops tests as above and ships what it collected to the controller
(``parallel.ship``); the controller hashes the files before the tests run and writes the two files once,
at the end of a session without a failure, as a serial run would.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from posttrain.testing.harness import parallel

# The node ids testmon (with this plugin's corrections) left out as unaffected by the edits;
# the harness's selection report and its "nothing ran" check read them.
UNAFFECTED = pytest.StashKey[frozenset[str]]()

MAP_FILE = ".remote_map.json"
STATE_FILE = ".remote_state.json"
SEED = "(no map entry: seeding)"  # the reason recorded for a test that has not run since its module was new
SHOWN_FILES = 8  # changed files named in the summary line; the rest are counted


def add_remote_testmon_options(parser: pytest.Parser) -> None:
    """The ini option ``posttrain_remote_packages`` and the flag ``--no-remote-map``."""
    parser.addini("posttrain_remote_packages", type="linelist", default=["posttrain"],
                  help="packages whose modules the --testmon import map follows (remote-aware testmon)")
    parser.getgroup("posttrain harness").addoption(
        "--no-remote-map", action="store_true",
        help="with --testmon: testmon's own selection only (no import map, .remote_*.json neither read nor written)")


def testmon_asked(config: pytest.Config) -> bool:
    """Whether testmon was asked for (``--testmon`` or its select variants), in a single process or under xdist."""
    asked = any(config.getoption(name, default=False) for name in ("testmon", "testmon_forceselect"))
    return asked and not config.getoption("no-testmon", default=False)


def relpath(path: Path, rootdir: Path) -> str:
    """``path`` relative to ``rootdir`` in posix form (how testmon and pytest name files), absolute outside it."""
    try:
        return path.resolve().relative_to(rootdir).as_posix()
    except ValueError:
        return path.resolve().as_posix()


def file_hash(path: Path) -> str | None:
    """sha1 of the file's bytes; None when it does not exist (a deletion is a change too)."""
    try:
        return hashlib.sha1(path.read_bytes()).hexdigest()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def import_root(path: Path) -> Path:
    """The directory pytest's default import mode (prepend) puts on ``sys.path`` for a test module or conftest:
    the first ancestor that is not a package (no ``__init__.py``)."""
    directory = path.parent
    while (directory / "__init__.py").is_file():
        directory = directory.parent
    return directory


def fixture_name(node: ast.AST) -> str | None:
    """The fixture a function definition declares (``@pytest.fixture``, ``@fixture(name=...)``), else None."""
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if (isinstance(target, ast.Attribute) and target.attr == "fixture") or (
                isinstance(target, ast.Name) and target.id == "fixture"):
            for keyword in decorator.keywords if isinstance(decorator, ast.Call) else []:
                if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                    return str(keyword.value.value)
            return node.name
    return None


class ImportMap:
    """Static closure of a test module's imports, read from the ASTs (no module is imported or executed).

    Every ``import x`` / ``from x import y`` anywhere in a file counts (tests import lazily, inside
    functions and fixtures), conditional and ``TYPE_CHECKING`` ones included: an over-approximation
    re-runs a test too many, never one too few. One exception keeps a shared conftest from mapping every
    test to everything: in a conftest, the body of a fixture the test module does not request is
    skipped (when the requested fixtures are known). Names resolve against the roots pytest puts on
    ``sys.path`` (the test's import root, the ini ``pythonpath``, the rootdir) and the watched packages'
    locations; anything else (stdlib, site-packages) is not followed.

    Args:
        rootdir: pytest's rootdir; local files must lie under it.
        packages: top-level names of the watched packages (``posttrain``).
        pythonpath: the ini ``pythonpath`` entries (absolute).
    """

    def __init__(self, rootdir: Path, packages: Sequence[str], pythonpath: Sequence[Path]):
        self.rootdir = rootdir.resolve()
        self.roots = [p.resolve() for p in pythonpath] + [self.rootdir]
        self.packages = {name: self._package_root(name) for name in packages}
        self._imports: dict[tuple[Path, frozenset[str] | None], list[tuple[int, str]]] = {}

    def _package_root(self, name: str) -> Path | None:
        """The directory holding package ``name``: a local root first (a checkout), else where Python finds it."""
        for root in self.roots:
            if (root / name / "__init__.py").is_file() or (root / f"{name}.py").is_file():
                return root
        spec = find_spec(name)  # a top-level name: finding it imports nothing
        if spec is not None and spec.submodule_search_locations:
            return Path(next(iter(spec.submodule_search_locations))).resolve().parent
        if spec is not None and spec.origin:
            return Path(spec.origin).resolve().parent
        return None

    def imports(self, path: Path, fixtures: frozenset[str] | None = None) -> list[tuple[int, str]]:
        """``(level, dotted name)`` of every import in the file (level > 0: relative); [] when it does not parse.

        ``fixtures``: the fixtures a test module requests, for a conftest: the bodies of its other fixtures
        are skipped (their lazy imports run only for the tests that request them). None: every body counts.
        """
        key = (path, fixtures)
        if key not in self._imports:
            try:
                tree: ast.AST | None = ast.parse(path.read_bytes(), filename=str(path))
            except (OSError, SyntaxError, ValueError):
                tree = None
            found: list[tuple[int, str]] = []
            todo = [tree] if tree is not None else []
            while todo:
                node = todo.pop()
                if fixtures is not None and fixture_name(node) not in (None, *fixtures):
                    continue
                todo.extend(ast.iter_child_nodes(node))
                if isinstance(node, ast.Import):
                    found.extend((0, alias.name) for alias in node.names)
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    # ``from a import b`` may load submodule a.b; resolving "a.b" also yields a's own files.
                    found.extend((node.level, f"{base}.{alias.name}" if base else alias.name)
                                 for alias in node.names if alias.name != "*")
                    if base:
                        found.append((node.level, base))
            self._imports[key] = found
        return self._imports[key]

    @staticmethod
    def _walk(root: Path, parts: Sequence[str]) -> list[Path]:
        """The files that importing ``parts`` from ``root`` executes (package ``__init__``s, then the module);
        stops at the first part that is not a module (an attribute of the one before)."""
        files: list[Path] = []
        directory = root
        for part in parts:
            package, module = directory / part, directory / f"{part}.py"
            if (package / "__init__.py").is_file():
                files.append(package / "__init__.py")
                directory = package
            elif module.is_file():
                files.append(module)
                break
            elif package.is_dir():  # namespace package (tests/unit, tests/harness have no __init__.py)
                directory = package
            else:
                break
        return files

    def _resolve(self, importer: Path, level: int, name: str, extra_roots: Sequence[Path]) -> list[Path]:
        parts = [p for p in name.split(".") if p]
        if level:
            base = importer.parent
            for _ in range(level - 1):
                base = base.parent
            return self._walk(base, parts)
        if not parts:
            return []
        if parts[0] in self.packages:
            root = self.packages[parts[0]]
            return self._walk(root, parts) if root is not None else []
        for root in [*extra_roots, *self.roots]:
            files = self._walk(root, parts)
            if files:
                return [f for f in files if f.is_relative_to(self.rootdir)]
        return []

    def conftests(self, test_module: Path) -> list[Path]:
        """``conftest.py`` files that apply to the module: its directory's and its parents' up to the rootdir."""
        found = []
        for directory in [test_module.parent, *test_module.parent.parents]:
            if (directory / "conftest.py").is_file():
                found.append(directory / "conftest.py")
            if directory == self.rootdir or not directory.is_relative_to(self.rootdir):
                break
        return found

    def closure(self, test_module: Path, fixtures: Iterable[str] | None = None) -> set[Path]:
        """Every local file the test module imports transitively (itself and its conftests included).

        Every file resolves bare names against the import roots of the test module and its conftests too
        (``refit_helpers`` next to the test, and what that helper imports by bare name from there): pytest
        puts them on ``sys.path`` for the session. ``fixtures``: the fixtures the module's tests request
        (``item.fixturenames``), None when unknown (all count).
        """
        test_module = test_module.resolve()
        conftests = self.conftests(test_module)
        requested = frozenset(fixtures) if fixtures is not None else None
        starts = [test_module, *conftests]
        seen: set[Path] = set(starts)
        todo = list(starts)
        extra_roots = list(dict.fromkeys(import_root(start) for start in starts))
        while todo:
            current = todo.pop()
            for level, name in self.imports(current, requested if current in conftests else None):
                for dep in self._resolve(current, level, name, extra_roots):
                    dep = dep.resolve()
                    if dep not in seen:
                        seen.add(dep)
                        todo.append(dep)
        return seen

    def entry(self, test_module: Path, fixtures: Iterable[str] | None = None) -> list[str]:
        """The map entry: the closure without the module itself, as sorted rootdir-relative paths."""
        module = relpath(test_module, self.rootdir)
        return sorted({relpath(p, self.rootdir) for p in self.closure(test_module, fixtures)} - {module})


@dataclass
class RemoteState:
    """The contents of ``.remote_map.json`` and ``.remote_state.json`` (see the module doc)."""

    map: dict[str, list[str]] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)
    pending: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def load(cls, rootdir: Path) -> RemoteState:
        """Both files from the rootdir; a missing or unreadable one counts as empty (the next run seeds)."""
        def read(name: str) -> dict[str, Any]:
            try:
                doc = json.loads((rootdir / name).read_text())
            except (OSError, ValueError):
                return {}
            return doc if isinstance(doc, dict) else {}
        state = read(STATE_FILE)
        return cls(read(MAP_FILE), dict(state.get("hashes", {})), dict(state.get("pending", {})))

    def save(self, rootdir: Path) -> None:
        """Write both files (each replaced atomically: an interrupted write leaves the old one)."""
        for name, doc in ((MAP_FILE, self.map), (STATE_FILE, {"hashes": self.hashes, "pending": self.pending})):
            tmp = rootdir / f"{name}.tmp"
            tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, rootdir / name)


def home_file(nodeid: str) -> str:
    """The module part of a node id (``tests/a.py::T::t[1]`` -> ``tests/a.py``)."""
    return nodeid.split("::", 1)[0]


def only_markexpr_blocks_selection(config: pytest.Config) -> bool:
    """True when testmon switched its selection off for ``-m`` alone (its other reasons: ``-k``, ``--lf``,
    ``--testmon-noselect``, node ids on the command line), mirroring ``testmon.configure``'s list."""
    opt = config.option
    manual = any(".py::" in str(arg) for arg in getattr(opt, "file_or_dir", None) or [])
    return bool(getattr(opt, "markexpr", "")) and not (
        getattr(opt, "keyword", "") or getattr(opt, "lf", False) or getattr(opt, "testmon_noselect", False) or manual)


class RemoteTestmon:
    """The pytest hooks; registered by the harness's ``pytest_configure`` when testmon is asked for.

    Args:
        config: the session's config; ``--no-remote-map`` keeps only the real-item deselection.
    """

    def __init__(self, config: pytest.Config):
        self.config = config
        self.rootdir = config.rootpath.resolve()
        self.use_map = not config.getoption("no_remote_map")
        self.state = RemoteState()
        self.hashes: dict[str, str | None] = {}  # this session's hashes, taken once before collection
        self.reasons: dict[str, set[str]] = {}  # test module -> changed files that put its tests back
        self.test_reasons: dict[str, set[str]] = {}  # node id -> pending changed files (it did not run since)
        self.put_back: set[str] = set()  # node ids testmon would have deselected and this plugin kept
        self.testmon_drops: set[str] = set()  # node ids this plugin deselects on testmon's behalf
        self.collected: list[pytest.Item] = []
        self.ran: set[str] = set()
        self.role = parallel.role(config)
        self.shipped: dict[str, Any] = {"by_module": {}, "fixtures": {}, "ran": set()}  # controller: from workers

    def _testmon_select(self) -> Any:
        """testmon's selecting plugin when it is registered and selecting, else None."""
        plugin = self.config.pluginmanager.get_plugin("TestmonSelect")
        tm_conf = getattr(self.config, "testmon_config", None)
        return plugin if plugin is not None and tm_conf is not None and tm_conf.select else None

    def _hash(self, name: str) -> str | None:
        if name not in self.hashes:
            self.hashes[name] = file_hash(self.rootdir / name)
        return self.hashes[name]

    @pytest.hookimpl(tryfirst=True)  # before the terminal reporter prints testmon's header (trylast)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        tm_conf = getattr(self.config, "testmon_config", None)
        if (tm_conf is not None and not tm_conf.select and self.config.pluginmanager.has_plugin("TestmonSelect")
                and only_markexpr_blocks_selection(self.config)):
            tm_conf.select = True
            tm_conf.message = "testmon: selection kept on under -m (the tier's marker filter), "

    @pytest.hookimpl(tryfirst=True)  # before collection asks testmon's pytest_ignore_collect
    def pytest_collection(self, session: pytest.Session) -> None:
        if self.role == "controller":  # the workers collect and select; hash the files before the tests run
            if self.use_map:
                self._decide(None)
            return
        select = self._testmon_select()
        if self.use_map:
            self._decide(select)
        if select is not None:
            self.testmon_drops = set(select.deselected_tests)
        # what testmon leaves out, whole files included (those are never collected)
        self.config.stash[UNAFFECTED] = frozenset(self.testmon_drops)

    def _decide(self, select: Any) -> None:
        """Which test modules and tests go back, and take them out of testmon's deselection lists."""
        self.state = RemoteState.load(self.rootdir)
        testmon_data = getattr(self.config, "testmon_data", None)
        known = set(self.state.map) | {home_file(n) for n in (testmon_data.all_tests if testmon_data else ())}
        for module in sorted(known):
            if self._hash(module) is None:
                continue  # a deleted test module: testmon forgets its tests
            if module not in self.state.map:
                self.reasons[module] = {SEED}
                continue
            changed = {f for f in [module, *self.state.map[module]] if self._hash(f) != self.state.hashes.get(f)}
            changed |= set(self.state.pending.get(module, []))
            if changed:
                self.reasons[module] = changed
        self.test_reasons = {n: set(r) for n, r in self.state.pending.items() if "::" in n}
        if select is None:
            return
        files = set(self.reasons) | {home_file(n) for n in self.test_reasons}
        self.put_back = {n for n in select.deselected_tests if home_file(n) in self.reasons or n in self.test_reasons}
        select.deselected_files = [f for f in select.deselected_files if f not in files]
        select.deselected_tests = [n for n in select.deselected_tests if n not in self.put_back]

    @pytest.hookimpl(tryfirst=True)  # testmon's own is trylast: what is left for it to drop is nothing
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        self.collected = list(items)
        if not self.testmon_drops or self._testmon_select() is None:
            return
        dropped = [item for item in items if item.nodeid in self.testmon_drops]
        if dropped:
            items[:] = [item for item in items if item.nodeid not in self.testmon_drops]
            config.hook.pytest_deselected(items=dropped)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.ran = {item.nodeid for item in session.items}  # they count as run only if the session passes

    def pytest_report_collectionfinish(self, items: Sequence[pytest.Item]) -> str | None:
        """The summary line, about the tests that will run (a change whose tests ``-m`` drops is not news)."""
        if not self.use_map:
            return None
        n = sum(item.nodeid in self.put_back for item in items)
        # a module without a map entry seeds here even when testmon runs it anyway (new to it too)
        reasons = [self.reasons.get(home_file(item.nodeid), set()) | self.test_reasons.get(item.nodeid, set())
                   | ({SEED} if home_file(item.nodeid) not in self.state.map else set()) for item in items]
        changed = sorted({f for r in reasons for f in r} - {SEED})
        seeded = len({home_file(item.nodeid) for item, r in zip(items, reasons, strict=True) if SEED in r})
        if not changed and not seeded:
            return "remote-aware testmon: nothing changed"
        shown = ", ".join(changed[:SHOWN_FILES]) + (f" and {len(changed) - SHOWN_FILES} more"
                                                    if len(changed) > SHOWN_FILES else "")
        line = f"remote-aware testmon: +{n} tests re-selected" + (f" for changed files: {shown}" if shown else "")
        return line + (f"; {seeded} test modules seeded (no map entry)" if seeded else "")

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """Controller: a worker's collection (they all collect alike; the union guards a partial one)."""
        shipped = parallel.received(node, "remote_testmon")
        if shipped is None:
            return
        for module, nodeids in shipped["by_module"].items():
            self.shipped["by_module"].setdefault(module, set()).update(nodeids)
            self.shipped["fixtures"].setdefault(module, set()).update(shipped["fixtures"][module])
        self.shipped["ran"].update(shipped["ran"])
        self.config.stash[UNAFFECTED] = self.config.stash.get(UNAFFECTED, frozenset()) | set(shipped["unaffected"])

    @pytest.hookimpl(trylast=True)  # after the harness's and testmon's exit status adjustments
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.role == "worker":  # the controller records, once, for the whole session
            by_module, fixtures = self._collected_modules()
            parallel.ship(self.config, "remote_testmon", {
                "by_module": by_module, "fixtures": {m: sorted(f) for m, f in fixtures.items()},
                "ran": sorted(self.ran), "unaffected": sorted(self.testmon_drops)})
            return
        passed = session.testsfailed == 0 and session.exitstatus in (pytest.ExitCode.OK,
                                                                     pytest.ExitCode.NO_TESTS_COLLECTED)
        if self.use_map and passed and not self.config.getoption("collectonly"):
            if self.role == "single":
                self._record(*self._collected_modules(), self.ran)
            elif self.shipped["by_module"] or self.shipped["ran"]:  # no worker reported: nothing to record
                self._record({m: sorted(ids) for m, ids in self.shipped["by_module"].items()},
                             self.shipped["fixtures"], self.shipped["ran"])

    def _collected_modules(self) -> tuple[dict[str, list[str]], dict[str, set[str]]]:
        """This process's collection: test module -> its node ids, and -> the fixtures its tests request."""
        by_module: dict[str, list[str]] = {}
        fixtures: dict[str, set[str]] = {}
        for item in self.collected:
            if item.path.suffix == ".py":
                module = relpath(item.path, self.rootdir)
                by_module.setdefault(module, []).append(item.nodeid)
                fixtures.setdefault(module, set()).update(getattr(item, "fixturenames", ()))
        return by_module, fixtures

    def _partial_modules(self) -> set[str]:
        """Test modules named with ``::`` on the command line: their other tests were not collected."""
        partial = set()
        for arg in self.config.args:
            if "::" in arg:
                path = (self.config.invocation_params.dir / home_file(arg)).resolve()
                partial.add(relpath(path, self.rootdir))
        return partial

    def _record(self, by_module: dict[str, list[str]], fixtures: dict[str, set[str]], ran: set[str]) -> None:
        """The new map and state after a passing session: tests that ran are up to date; a changed file is
        kept pending for every test of its modules that did not run.

        Args:
            by_module: test module (relative path) -> the node ids collected from it.
            fixtures: test module -> the fixtures its collected tests request.
            ran: the node ids that ran (counted as run: the session passed).
        """
        builder = ImportMap(self.rootdir, self.config.getini("posttrain_remote_packages"),
                            self.config.getini("pythonpath"))
        old = self.state
        partial = self._partial_modules()
        new_map = {m: files for m, files in old.map.items() if self._hash(m) is not None}
        for module in by_module:  # a partly collected module's other tests may request other fixtures
            new_map[module] = builder.entry(self.rootdir / module, None if module in partial else fixtures[module])
        files = set(new_map) | {f for entry in new_map.values() for f in entry}
        changed = {f for f in files if self._hash(f) != old.hashes.get(f)}
        pending = {k: set(v) for k, v in old.pending.items() if self._hash(home_file(k)) is not None}
        for module, entry in new_map.items():
            reasons = (changed & {module, *entry, *old.map.get(module, [])}) | pending.pop(module, set())
            if module not in old.map:
                reasons.add(SEED)
            if module not in by_module or module in partial:
                if reasons:  # tests not collected this time: the whole module keeps the change
                    pending[module] = reasons
                if module not in by_module:
                    continue
            collected = set(by_module[module])
            if module not in partial:  # all its tests were collected: a pending one that was not is gone
                for nodeid in [k for k in pending if "::" in k and home_file(k) == module and k not in collected]:
                    del pending[nodeid]
            for nodeid in collected:
                test_reasons = pending.pop(nodeid, set()) | reasons
                if nodeid not in ran and test_reasons:
                    pending[nodeid] = test_reasons
        self.state = RemoteState(new_map, {f: h for f in sorted(files) if (h := self._hash(f)) is not None},
                                 {k: sorted(v) for k, v in sorted(pending.items())})
        self.state.save(self.rootdir)

