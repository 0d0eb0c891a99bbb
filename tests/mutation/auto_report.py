"""The per-module table of an automatic mutation run (mutmut 3), with the justified equivalent mutants.

    python tests/mutation/auto_report.py globs [MODULE ...]   # `module pattern...` lines for mutmut run
    python tests/mutation/auto_report.py report [--seconds FILE] [--survivors] [MODULE ...]
    python tests/mutation/auto_report.py unmutated [MODULE ...]   # plain copies a kept mutants/ holds

``tests/mutation/run_auto.sh`` calls all three: ``globs`` to hand ``mutmut run`` one module's
mutants, ``unmutated`` before the runs, ``report`` after them. The results come from mutmut's own
records: ``mutants/<source>.meta`` (JSON: ``exit_code_by_key``, one exit code a mutant) and, for
each survivor, the diff mutmut shows for it (``mutmut show NAME``). Run from the repository root, where ``mutants/`` is.

A survivor listed in ``tests/mutation/equivalent.toml`` is counted as "equivalent (justified)".
An entry names the function, the source line the mutant removes and the line it puts instead
(both stripped of indentation), and a one-line reason; it is matched by those texts, not by
mutmut's mutant number, which shifts whenever the function changes. An entry of a reported
module that matches no survivor is stale (its mutant is gone or now killed): the report names it
and fails, so the list never justifies more than it should.

Score of a module: (killed + timeout + equivalent) / all of its mutants. A mutant that ran out of
time is counted as caught (its tests did not pass), as mutmut's own badge counts it. Exit status
of ``report``: 0 when every module scores at least ``THRESHOLD`` and no entry is stale, 1 when
not, 2 when a module has no mutmut results (not run yet).
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EQUIVALENT_FILE = Path(__file__).resolve().with_name("equivalent.toml")
THRESHOLD = 95.0

# module key -> its sources (files, or a folder for a package), as [tool.mutmut] only_mutate lists them
MODULES: dict[str, tuple[str, ...]] = {
    "rules": ("posttrain/testing/rules",),
    "ops": ("posttrain/ops.py",),
    "loss_functions": ("posttrain/algorithms/loss_functions.py",),
    "advantages": ("posttrain/algorithms/advantages.py",),
    "batch": ("posttrain/data/batch.py",),
    "rollouts": ("posttrain/rollouts",),
    "environments": ("posttrain/environments",),
    "probe": ("posttrain/weight_sync/probe.py",),
    "chat": ("posttrain/data/chat.py",),
    "rollout_recording": ("posttrain/algorithms/rollout_recording.py",),
    "trend": ("posttrain/testing/trend.py",),
    "calibrate": ("posttrain/testing/calibrate.py",),
    # the pytest harness, file by file (its package __init__ defines no function)
    "harness_configurations": ("posttrain/testing/harness/configurations.py",),
    "harness_budget": ("posttrain/testing/harness/budget.py",),
    "harness_coverage_ray": ("posttrain/testing/harness/coverage_ray.py",),
    "harness_machine": ("posttrain/testing/harness/machine.py",),
    "harness_memory": ("posttrain/testing/harness/memory.py",),
    "harness_merge": ("posttrain/testing/harness/merge.py",),
    "harness_parallel": ("posttrain/testing/harness/parallel.py",),
    "harness_plugin": ("posttrain/testing/harness/plugin.py",),
    "harness_ray_leaks": ("posttrain/testing/harness/ray_leaks.py",),
    "harness_ray_nodes": ("posttrain/testing/harness/ray_nodes.py",),
    "harness_remote_testmon": ("posttrain/testing/harness/remote_testmon.py",),
    "harness_repeat": ("posttrain/testing/harness/repeat.py",),
    "harness_results": ("posttrain/testing/harness/results.py",),
    "harness_selection": ("posttrain/testing/harness/selection.py",),
    "harness_shards": ("posttrain/testing/harness/shards.py",),
    "harness_skips": ("posttrain/testing/harness/skips.py",),
    "harness_tracker": ("posttrain/testing/harness/tracker.py",),
}
# smallest first (by mutants), the order run_auto.sh runs them in: every row that scores >= 95%
DEFAULT_ORDER = ("harness_tracker", "harness_coverage_ray", "chat", "harness_machine", "advantages",
                 "environments", "harness_ray_leaks", "harness_results", "harness_budget", "probe", "batch",
                 "harness_shards",
                 "harness_parallel", "harness_selection", "loss_functions", "harness_memory",
                 "rollout_recording", "harness_merge", "harness_skips", "rollouts", "harness_plugin", "trend",
                 "ops", "harness_ray_nodes", "harness_repeat", "harness_configurations", "harness_remote_testmon",
                 "calibrate", "rules")
# Rows still under 95%, run by name only (run_auto.sh harness_plugin ...), so that CI's run stays a
# verdict: the harness files whose code runs mostly where mutmut cannot trace it (pytest subprocesses,
# xdist workers, Ray actors, --testmon). A row moves to DEFAULT_ORDER once it scores 95%;
# docs/testing.md ("Automatic mutation testing") says where each stands.
BELOW_THRESHOLD: tuple[str, ...] = ()
assert sorted(DEFAULT_ORDER + BELOW_THRESHOLD) == sorted(MODULES), "every row is run by default or listed as below"

# mutmut's exit codes of a mutant run, as its `results` command reads them (mutmut/stats.py):
# 1 and 3 a test failed; 0 every test passed; 33 and 5 no test calls the function; the rest below.
STATUS_BY_EXIT_CODE: dict[int | None, str] = {
    1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 2: "interrupted",
    None: "not checked", 34: "skipped", 35: "suspicious", 36: "timeout", 37: "type check",
    24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout", -11: "segfault", -9: "segfault",
}


def status_of(exit_code: int | None) -> str:
    """The status mutmut gives a mutant run that ended with ``exit_code`` (unknown codes: suspicious)."""
    return STATUS_BY_EXIT_CODE.get(exit_code, "suspicious")


def mutmut_globs(module: str) -> list[str]:
    """The ``mutmut run`` name patterns that select every mutant of ``module`` (and nothing else)."""
    globs = []
    for source in MODULES[module]:
        dotted = source.removesuffix(".py").replace("/", ".")
        globs.append(f"{dotted}.*")
    return globs


def source_files(module: str, root: Path = REPO) -> list[Path]:
    """The Python files of ``module``, relative to ``root``, sorted."""
    files: list[Path] = []
    for source in MODULES[module]:
        path = root / source
        files.extend(sorted(p.relative_to(root) for p in path.rglob("*.py")) if path.is_dir() else [Path(source)])
    return files


def unmutated_copies(modules: list[str], root: Path = REPO) -> list[Path]:
    """The files of ``modules`` that ``root/mutants`` holds as plain copies: those with no ``.meta``.

    mutmut copies a file it does not mutate with a fresh modification time, and later takes a copy
    newer than its source for one it has already mutated: a module added to ``only_mutate`` after
    ``mutants/`` was made would keep its plain copy and have no mutants. Removing these copies makes
    mutmut mutate them.
    """
    out = []
    for module in modules:
        for source in source_files(module, root):
            copy = root / "mutants" / source
            if copy.exists() and not copy.with_name(copy.name + ".meta").exists():
                out.append(copy)
    return out


def function_of(mutant: str) -> str:
    """The dotted name of the function a mutant changes: ``pkg.mod.func`` or ``pkg.mod.Class.method``.

    mutmut names a mutant ``pkg.mod.x_func__mutmut_3`` or ``pkg.mod.xǁClassǁmethod__mutmut_3``.
    """
    mangled = mutant.partition("__mutmut_")[0]
    module, _, name = mangled.rpartition(".")
    if "ǁ" in name:
        _, cls, method = name.split("ǁ")
        return f"{module}.{cls}.{method}"
    return f"{module}.{name.removeprefix('x_')}"


def changed_lines(diff: str) -> tuple[str, str]:
    """The lines a unified diff removes and the lines it adds, each stripped and joined by newlines."""
    removed, added = [], []
    for line in diff.splitlines():
        if line.startswith(("---", "+++")):
            continue
        if line.startswith("-"):
            removed.append(line[1:].strip())
        elif line.startswith("+"):
            added.append(line[1:].strip())
    return "\n".join(removed), "\n".join(added)


@dataclass(frozen=True)
class Equivalent:
    """One justified equivalent mutant of ``equivalent.toml``: where it is, what it changes, and why
    no test can tell it from the original."""

    function: str
    removed: str
    added: str
    reason: str

    def matches(self, function: str, removed: str, added: str) -> bool:
        """Whether a survivor of ``function`` with these changed lines is this mutant."""
        return (self.function, self.removed, self.added) == (function, removed, added)


def load_equivalents(path: Path = EQUIVALENT_FILE) -> list[Equivalent]:
    """The entries of ``equivalent.toml`` (none when the file is absent); each needs all four keys."""
    if not path.exists():
        return []
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("equivalent", [])
    out = []
    for i, entry in enumerate(entries):
        missing = {"function", "removed", "added", "reason"} - set(entry)
        if missing or not str(entry.get("reason", "")).strip():
            raise SystemExit(f"{path}: entry {i + 1} needs function, removed, added and a reason ({sorted(missing)})")
        out.append(Equivalent(entry["function"], entry["removed"].strip(), entry["added"].strip(), entry["reason"]))
    return out


@dataclass
class ModuleResult:
    """The tally of one module: mutmut's status counts, the survivors it justified and those it did not."""

    module: str
    counts: Counter[str] = field(default_factory=Counter)  # by mutmut status, justified survivors left out
    equivalent: list[tuple[str, Equivalent]] = field(default_factory=list)
    survivors: list[tuple[str, str]] = field(default_factory=list)  # (mutant, diff) not justified

    @property
    def total(self) -> int:
        """Every mutant of the module, whatever became of it (the justified equivalents included)."""
        return sum(self.counts.values()) + len(self.equivalent)

    @property
    def score(self) -> float:
        """Percentage caught: killed, timed out, or justified equivalent, over all mutants."""
        caught = self.counts["killed"] + self.counts["timeout"] + len(self.equivalent)
        return 100.0 * caught / self.total if self.total else 0.0


def mutant_diff(mutant: str, source: Path) -> str:
    """The diff mutmut shows for ``mutant`` of ``source`` (``mutmut show``), read from ``mutants/``."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    return get_diff_for_mutant(mutant, path=source)


def tally(module: str, equivalents: list[Equivalent], used: set[Equivalent], root: Path = REPO) -> ModuleResult | None:
    """Read ``module``'s mutmut results under ``root/mutants``; None when mutmut has not run it.

    Each entry of ``equivalents`` that justifies a survivor is added to ``used``.
    """
    result = ModuleResult(module)
    seen = False
    for source in source_files(module, root):
        meta = root / "mutants" / f"{source}.meta"
        if not meta.exists():
            continue
        exit_codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        for mutant, code in sorted(exit_codes.items()):
            seen = True
            status = status_of(code)
            if status == "survived":
                diff = mutant_diff(mutant, source)
                removed, added = changed_lines(diff)
                match = next((e for e in equivalents if e.matches(function_of(mutant), removed, added)), None)
                if match is not None:
                    used.add(match)
                    result.equivalent.append((mutant, match))
                    continue
                result.survivors.append((mutant, diff))
            result.counts[status] += 1
    return result if seen else None


def module_of_function(function: str) -> str | None:
    """The module key whose sources define ``function`` (a dotted name), if any."""
    for module, sources in MODULES.items():
        for source in sources:
            prefix = source.removesuffix(".py").replace("/", ".") + "."
            if function.startswith(prefix):
                return module
    return None


def read_seconds(path: Path | None) -> dict[str, float]:
    """``module seconds`` lines written by run_auto.sh: the wall time of each module's run."""
    if path is None or not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            name, seconds = line.split()
            out[name] = float(seconds)
    return out


def report(modules: list[str], seconds: dict[str, float], show_survivors: bool, root: Path = REPO) -> int:
    """Print the per-module table (and, if asked, each unjustified survivor's diff); return the exit status."""
    equivalents = load_equivalents()
    used: set[Equivalent] = set()
    results: list[ModuleResult] = []
    not_run = []
    for module in modules:
        result = tally(module, equivalents, used, root)
        if result is None:
            not_run.append(module)
        else:
            results.append(result)

    header = ("module", "mutants", "killed", "survived", "equivalent (justified)", "timeout", "no tests", "other",
              "score %", "seconds")
    rows = []
    for r in results:
        other = r.total - sum(r.counts[s] for s in ("killed", "survived", "timeout", "no tests")) - len(r.equivalent)
        rows.append((r.module, str(r.total), str(r.counts["killed"]), str(r.counts["survived"]), str(len(r.equivalent)),
                     str(r.counts["timeout"]), str(r.counts["no tests"]), str(other), f"{r.score:.1f}",
                     f"{seconds[r.module]:.0f}" if r.module in seconds else "-"))
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())

    status = 0
    for r in results:
        if r.score < THRESHOLD:
            print(f"\n{r.module}: {r.score:.1f}% is below {THRESHOLD:.0f}%")
            status = 1
        if show_survivors or r.score < THRESHOLD:
            for mutant, diff in r.survivors:
                print(f"\nsurvived: {mutant}\n{diff}")
    reported = {r.module for r in results}
    stale = [e for e in equivalents if e not in used and module_of_function(e.function) in reported]
    for e in stale:
        print(f"\nstale entry of {EQUIVALENT_FILE.name} (no survivor matches it): {e.function}: "
              f"{e.removed!r} -> {e.added!r}")
        status = 1
    if not_run:
        print(f"\nno mutmut results for: {', '.join(not_run)} (run tests/mutation/run_auto.sh first)")
        status = 2
    return status


def main(argv: list[str] | None = None) -> int:
    """Command line: ``globs MODULE...``, ``unmutated MODULE...`` or
    ``report [--seconds FILE] [--survivors] MODULE...``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    globs = sub.add_parser("globs", help="mutmut's name patterns of the modules")
    globs.add_argument("modules", nargs="*")
    rep = sub.add_parser("report", help="the per-module table")
    rep.add_argument("--seconds", type=Path, help="a file of `module seconds` lines (run_auto.sh writes it)")
    rep.add_argument("--survivors", action="store_true", help="print every unjustified survivor's diff")
    rep.add_argument("modules", nargs="*")
    plain = sub.add_parser("unmutated", help="the modules' files that mutants/ holds unmutated (no .meta)")
    plain.add_argument("modules", nargs="*")
    args = parser.parse_args(argv)
    modules = args.modules or list(DEFAULT_ORDER)
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; choose from {', '.join(MODULES)}")
    if args.command == "globs":
        for module in modules:
            print(module, *mutmut_globs(module))
        return 0
    if args.command == "unmutated":
        for copy in unmutated_copies(modules):
            print(copy)
        return 0
    return report(modules, read_seconds(args.seconds), args.survivors)


if __name__ == "__main__":
    sys.exit(main())
