"""Every config key has a reader in the code of every backend that accepts it, or that backend
refuses it: checked on the sources' syntax trees (``harness/config_readers.py``), no model runs.

The backends are derived from the code: the policy backends are ``PolicyConfig.backend``'s
choices, each worker in ``posttrain/models/policy/<backend>_policy_worker.py``; the engines are
the rows of ``models/generation/backends.py`` (their worker and in-place modules). A backend
refuses a key when a value off the key's default fails with it and passes with another: the
policy's in ``PolicyConfig``'s validators (``BACKEND_KEYS``), an engine's in its row's
``refuses`` (``check_engine_keys``). The run's own check of the keys it read is
``posttrain/algorithms/unread_keys.py`` (tests/integration/test_unread_keys.py).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, ClassVar, get_args

import pytest
from harness import config_readers as cr
from pydantic import ValidationError

from posttrain.algorithms.grpo_config import GRPOMasterConfig
from posttrain.algorithms.sft import SFTMasterConfig
from posttrain.config import (
    GenerationConfig,
    GenerationWorkerConfig,
    PolicyConfig,
    PolicyWorkerConfig,
    Section,
    leaf_fields,
)
from posttrain.errors import ConfigError
from posttrain.models.generation.backends import BACKENDS, check_engine_keys

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = (GRPOMasterConfig, SFTMasterConfig)
SELECTORS = ("policy.backend", "generation.backend")  # the keys that pick the backends: read by the driver


def project_backends() -> list[cr.Backend]:
    """The policy backends (``PolicyConfig.backend``'s choices) and the engine table's rows."""
    policy = [cr.Backend("policy", name, (f"posttrain.models.policy.{name}_policy_worker",))
              for name in get_args(PolicyConfig.model_fields["backend"].annotation)]
    engines = [cr.Backend("engine", row.name, tuple(cls.partition(":")[0] for cls in (row.worker, row.in_place)
                                                    if isinstance(cls, str)))
               for row in BACKENDS.values()]
    return policy + engines


def nested(key: str, value: Any, into: dict | None = None) -> dict:
    """``{"a": {"b": value}}`` for ``a.b``, merged into ``into``."""
    out = into if into is not None else {}
    *path, last = key.split(".")
    node = out
    for part in path:
        node = node.setdefault(part, {})
    node[last] = value
    return out


def rejects(backend: cr.Backend, key: str, value: Any) -> bool:
    """Does ``backend`` refuse ``key=value``: the policy's validators, an engine's ``check_engine_keys``?"""
    if key in SELECTORS:
        return False
    if backend.kind == "policy":
        schema = next(s for s in SCHEMAS if key in dict(leaf_fields(s)))
        try:
            schema.model_validate(nested(key, value, nested("policy.backend", backend.name)))
        except ValidationError:
            return True
        return False
    name = key.removeprefix("generation.")
    if not key.startswith("generation.") or "." in name:
        return False  # an engine refuses only generation's own keys
    try:
        check_engine_keys(GenerationConfig.model_validate({name: value}), backend.name)
    except (ValidationError, ConfigError):
        return True
    return False


@pytest.fixture(scope="module")
def project() -> tuple[cr.KeyTable, dict[str, Path], list[cr.Backend], cr.ReadSites]:
    table = cr.key_table(SCHEMAS, (PolicyWorkerConfig, GenerationWorkerConfig), ROOT)
    sources = {cr.module_name(p, ROOT): p for folder in ("posttrain", "examples")
               for p in sorted((ROOT / folder).rglob("*.py"))}
    return table, sources, project_backends(), cr.read_sites(sources, table)


def test_every_config_key_is_read_or_refused_on_every_backend(project) -> None:
    table, sources, backends, sites = project
    fields = {key: info for schema in SCHEMAS for key, info in leaf_fields(schema)}
    refused: dict[str, set[cr.Backend]] = {key: set() for key in fields}
    for kind in ("policy", "engine"):
        for key, by in cr.refusals(fields, [b for b in backends if b.kind == kind], rejects).items():
            refused[key] |= by
    unread = cr.check(table, sources, backends, refused, sites)
    assert unread == [], "config keys no code of a backend reads, and the backend accepts:\n" + "\n".join(unread)


def test_only_the_tiny_models_fingerprint_reads_a_section_by_computed_names(project) -> None:
    """A ``getattr`` by a computed name counts as a read of every field of its section: outside the
    fingerprint (which hashes every field: a cached build is one of them all) it could hide a key
    no code uses. A check that reads keys to refuse them reads a copy (``model_dump()``)."""
    assert {site.split(":")[0] for site in project[3].by_name} == {"posttrain.models.tiny"}


# --- the checker on a planted schema and planted code ---------------------------------------------


class Opt(Section):
    lr: float = 0.1
    only_a: int = 0
    planted: int = 0

    @property
    def doubled(self) -> float:
        return 2 * self.lr


class Run(Section):
    opt: Opt = Opt()


class OptCopy(Opt):
    """A worker's copy: ``t`` holds ``opt.lr``; the rest are ``Opt``'s."""

    run_keys: ClassVar[dict[str, tuple[str, ...]]] = {"t": ("opt.lr",)}
    t: float = 0.1


A, B = cr.Backend("policy", "a", ("pkg.a_worker",)), cr.Backend("policy", "b", ("pkg.b_worker",))
WORKERS = {
    "pkg.driver": "def train(cfg: Run) -> float:\n    return cfg.opt.lr\n",
    "pkg.a_worker": ("class AWorker:\n    def __init__(self, cfg: Opt):\n        self.cfg = cfg\n\n"
                     "    def step(self) -> int:\n        from pkg import a_only\n\n"
                     "        return a_only.read(self.cfg)\n"),
    "pkg.a_only": "def read(cfg: Opt) -> int:\n    return cfg.only_a\n",
    "pkg.b_worker": "from pkg import shared\n",
    "pkg.shared": "",
}


def write(tmp_path: Path, modules: dict[str, str]) -> dict[str, Path]:
    paths = {}
    for name, text in modules.items():
        path = tmp_path / f"{name.replace('.', '/')}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        paths[name] = path
    return paths


def declared(attr: str) -> str:
    lines = Path(__file__).read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if text == f"    {attr}: int = 0")
    return f"tests/unit/test_config_readers.py:{line} (Opt.{attr})"


def planted_check(tmp_path: Path, refused: dict[str, set[cr.Backend]] | None = None,
                  modules: dict[str, str] = WORKERS) -> list[str]:
    table = cr.key_table([Run], [OptCopy], ROOT)
    return cr.check(table, write(tmp_path, modules), [A, B], refused or {})


def test_a_planted_key_no_code_reads_is_one_line_naming_it_and_where_it_is_declared(tmp_path) -> None:
    lines = planted_check(tmp_path)
    assert f"opt.planted: unread on every backend (declared at {declared('planted')})" in lines


def test_a_key_only_one_backends_modules_read_is_unread_on_the_other_unless_it_refuses_it(tmp_path) -> None:
    # a_only.py runs only with backend a: a_worker imports it (inside a function)
    assert planted_check(tmp_path, {"opt.planted": {A, B}}) == [
        f"opt.only_a: unread on policy backend b (declared at {declared('only_a')})"]
    assert planted_check(tmp_path, {"opt.planted": {A, B}, "opt.only_a": {B}}) == []


def test_a_key_one_policy_backend_and_one_engine_read_is_unread_on_the_pair_of_the_others(tmp_path) -> None:
    x, y = cr.Backend("engine", "x", ("pkg.x_engine",)), cr.Backend("engine", "y", ("pkg.y_engine",))
    modules = {**WORKERS, "pkg.x_engine": "def read(cfg: Opt) -> int:\n    return cfg.only_a\n", "pkg.y_engine": ""}
    table = cr.key_table([Run], [OptCopy], ROOT)
    assert cr.check(table, write(tmp_path, modules), [A, B, x, y], {"opt.planted": {A, B}}) == [
        f"opt.only_a: unread on policy backend b with engine backend y (declared at {declared('only_a')})"]


def test_a_module_every_backend_imports_runs_in_every_run(tmp_path) -> None:
    modules = {**WORKERS, "pkg.a_worker": "from pkg import shared\n",
               "pkg.shared": "def read(cfg: Opt) -> int:\n    return cfg.only_a\n"}
    assert planted_check(tmp_path, {"opt.planted": {A, B}}, modules) == []


@pytest.mark.parametrize(("code", "read"), [
    ("def f(cfg: Opt):\n    return cfg.lr", {"opt.lr"}),
    ("def f(cfg: 'Opt | None'):\n    return cfg.lr", {"opt.lr"}),
    ("def f(cfg: Run):\n    opt = cfg.opt\n    return opt.lr", {"opt.lr"}),
    ("def f(cfg: Opt):\n    return getattr(cfg, 'lr')", {"opt.lr"}),
    ("def f(cfg: Opt, name: str):\n    return getattr(cfg, name)", {"opt.lr", "opt.only_a", "opt.planted"}),
    ("def f(cfg: Opt):\n    return cfg.doubled", {"opt.lr"}),  # a property reads what its body reads
    ("def f(cfg: OptCopy):\n    return cfg.t, cfg.only_a", {"opt.lr", "opt.only_a"}),  # a worker's copy
    ("class W:\n    cfg: Opt\n\n    def f(self):\n        return self.cfg.lr", {"opt.lr"}),
    ("class W:\n    def __init__(self, c: Opt | None = None):\n        self.cfg = c or Opt()\n\n"
     "    def f(self):\n        return self.cfg.lr", {"opt.lr"}),
    ("def f(cfg: Opt):\n    return (lambda: cfg.lr)()", {"opt.lr"}),
    # not reads: a receiver of unknown class, a copy, a section's own methods (validators, of)
    ("def f(cfg):\n    return cfg.lr", set()),
    ("def f(cfg: Opt):\n    return cfg.model_dump()['lr']", set()),
    ("class Opt:\n    def check(self):\n        return self.lr", set()),
])
def test_what_counts_as_a_read(tmp_path, code: str, read: set[str]) -> None:
    table = cr.key_table([Run], [OptCopy], ROOT)
    assert set(cr.read_sites(write(tmp_path, {"pkg.m": code}), table).reads) == read
