"""Which code reads each config key, found by walking the sources' syntax trees (no model runs).

A key ``policy.lr`` is *read* where an attribute ``.lr`` is loaded on an expression whose class is
known to own that key: ``PolicyConfig`` (the class of the ``policy`` section) or a worker's copy of
it (``PolicyWorkerConfig``, whose ``run_keys`` name the keys its own fields hold). The class of an
expression comes from what the sources say and mypy checks: a parameter's or a class attribute's
annotation, ``self.x = <typed>``, ``x = <typed>``, a section's field (``cfg.policy.lora``), a
section's constructor or ``.of(...)``, ``a or b``. ``getattr(x, "lr")`` is ``x.lr``. Where the rule
cannot see a read, it reports a finding (a false alarm, never a silent pass):

- a receiver of unknown class (``cfg: Any``, no annotation) reads nothing;
- ``model_dump()`` is a copy, not a read (its copy's reads count where it is validated into a
  section again: the worker configs);
- the methods of a section class (validators, ``of``) read for checking or copying, not for
  use: they read nothing; a *property* reads what its body reads on ``self`` (``cluster.device``
  reads ``cluster.gpus_per_worker``).

Where it over-counts, a key passes that a run may still not read (the run's own check,
``posttrain/algorithms/unread_keys.py``, sees those):

- ``getattr(x, name)`` with a computed name reads every field of ``x``;
- a read counts for every run its module runs in, whatever branch it sits under (a read under
  ``if cfg.backend == "megatron":`` in shared code counts for every backend);
- a read of a key counts whatever the key's value: ``policy.lora.alpha`` is read by the hf
  backend even in a run whose ``lora.rank`` is 0.

A module runs with a backend when that backend's worker module imports it (at its top or inside a
function, directly or through other modules of the package); a module that no backend's worker
imports (the driver), or that every backend of a kind imports, runs in every run. A key is then
read in a run of policy backend p and engine e when one of its readers runs there, and *unread on
backend X* when no reader runs with X and X does not refuse the key (``refusals``: a value off
the key's default fails validation with X and passes with another backend).
"""

from __future__ import annotations

import ast
import functools
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel


@dataclass(frozen=True)
class Backend:
    """A backend of one ``kind`` ("policy" or "engine"): its ``name`` and the modules (dotted
    names) of its worker classes."""

    kind: str
    name: str
    roots: tuple[str, ...]


@dataclass
class KeyTable:
    """Every leaf key of the schemas and the ``(class name, attribute)`` reads that read it."""

    keys: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # (class, attr) -> keys
    declared: dict[str, str] = field(default_factory=dict)  # key -> "path:line (Class.attr)"
    sections: dict[str, type[BaseModel]] = field(default_factory=dict)  # class name -> class
    sub_sections: dict[tuple[str, str], str] = field(default_factory=dict)  # (class, attr) -> class
    properties: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # (class, prop) -> keys

    def reads(self, cls: str, attr: str) -> set[str]:
        """The keys a load of ``.attr`` on an instance of ``cls`` reads (none: it is no key)."""
        return self.keys.get((cls, attr), set()) | self.properties.get((cls, attr), set())

    def all_keys(self, cls: str) -> set[str]:
        """Every key a field of ``cls`` holds (``getattr`` with a computed name)."""
        return set().union(*(keys for (c, _), keys in self.keys.items() if c == cls))


def _model_class(annotation: Any) -> type[BaseModel] | None:
    for kind in (annotation, *get_args(annotation)):
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            return kind
    return None


@functools.cache
def _parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _declared_at(cls: type, attr: str, root: Path) -> str:
    """``path:line (Class.attr)`` of the field's declaration in its class's source."""
    import inspect

    owner = next(c for c in cls.__mro__ if attr in getattr(c, "__annotations__", {}))
    path = Path(inspect.getsourcefile(owner) or "")
    tree = _parsed(path)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == owner.__name__)
    line = next(s.lineno for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id == attr)
    where = path.relative_to(root) if path.is_relative_to(root) else path
    return f"{where}:{line} ({owner.__name__}.{attr})"


def key_table(schemas: Iterable[type[BaseModel]], copies: Iterable[type[BaseModel]], root: Path) -> KeyTable:
    """The keys of the run ``schemas`` (each leaf, under its place in the tree) and of the
    worker configs ``copies`` (a field in the class's ``run_keys`` holds those keys; a field it
    inherits from a run section holds that section's key).

    Raises:
        ValueError: a field of a copy that holds no key, or names a key no schema has.
    """
    table = KeyTable()

    def walk(cls: type[BaseModel], prefix: str) -> None:
        table.sections[cls.__name__] = cls
        for attr, info in cls.model_fields.items():
            key = prefix + (info.alias or attr)
            sub = _model_class(info.annotation)
            if sub is not None:
                table.sub_sections[(cls.__name__, attr)] = sub.__name__
                walk(sub, key + ".")
            else:
                table.keys.setdefault((cls.__name__, attr), set()).add(key)
                table.declared.setdefault(key, _declared_at(cls, attr, root))

    for schema in schemas:
        walk(schema, "")
    for cls in copies:
        table.sections[cls.__name__] = cls
        named: dict[str, tuple[str, ...]] = getattr(cls, "run_keys", {})
        for attr, info in cls.model_fields.items():
            sub = _model_class(info.annotation)
            inherited = next((table.keys[(base.__name__, attr)] for base in cls.__mro__[1:]
                              if (base.__name__, attr) in table.keys), None)
            if sub is not None:
                table.sub_sections[(cls.__name__, attr)] = sub.__name__
            elif attr in named:
                unknown = set(named[attr]) - set(table.declared)
                if unknown:
                    raise ValueError(f"{cls.__name__}.run_keys[{attr!r}] names no key of the schemas: {unknown}")
                table.keys[(cls.__name__, attr)] = set(named[attr])
            elif inherited is not None:
                table.keys[(cls.__name__, attr)] = set(inherited)
            else:
                raise ValueError(f"{cls.__name__}.{attr} holds no run config key: add it to {cls.__name__}.run_keys")
    for cls in table.sections.values():
        _add_properties(table, cls)
    return table


def _add_properties(table: KeyTable, cls: type) -> None:
    """A property of a section reads the fields its body loads on ``self``."""
    import inspect
    import textwrap

    for name, member in vars(cls).items():
        if isinstance(member, property) and member.fget is not None:
            body = ast.parse(textwrap.dedent(inspect.getsource(member.fget)))
            attrs = {n.attr for n in ast.walk(body) if isinstance(n, ast.Attribute)
                     and isinstance(n.value, ast.Name) and n.value.id == "self"}
            for sub in table.sections.values():
                if issubclass(sub, cls):
                    keys = set().union(*(table.keys.get((sub.__name__, a), set()) for a in attrs))
                    table.properties[(sub.__name__, name)] = keys


# --- the classes of expressions --------------------------------------------------------------
Env = dict[str, set[str]]  # a name -> the classes it may hold: a section's name, or "@Class" of the sources


@dataclass
class SourceClass:
    """A class of the sources: its bases' names, annotated attributes and ``self.x = ...``."""

    bases: list[str]
    annotated: dict[str, ast.expr] = field(default_factory=dict)
    assigned: dict[str, list[tuple[ast.expr, Env]]] = field(default_factory=dict)


def _name(node: ast.expr) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


class Typer:
    """The classes an expression may hold, from annotations and assignments (see the module doc)."""

    def __init__(self, table: KeyTable, trees: dict[str, ast.Module]):
        self.table = table
        self.classes: dict[str, SourceClass] = {}
        self._busy: set[tuple[str, str]] = set()  # attributes being typed (a cycle types as nothing)
        for tree in trees.values():
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and node.name not in table.sections:
                    self.classes[node.name] = SourceClass([b for b in map(_name, node.bases) if b])
        for tree in trees.values():
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and node.name in self.classes:
                    self._collect(node)

    def _collect(self, node: ast.ClassDef) -> None:
        info = self.classes[node.name]
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                info.annotated[stmt.target.id] = stmt.annotation
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                env = self.function_env(stmt, {}, node.name)
                for sub in ast.walk(stmt):
                    targets = (sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                               if isinstance(sub, ast.AnnAssign) and sub.value is not None else [])
                    for target in targets:
                        if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                                and target.value.id == "self"):
                            value = sub.value
                            assert value is not None
                            info.assigned.setdefault(target.attr, []).append((value, env))

    def annotation(self, node: ast.expr | None) -> set[str]:
        """The classes an annotation names (``X | None``, ``Optional[X]``, ``"X"``)."""
        if node is None:
            return set()
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return self.annotation(ast.parse(node.value, mode="eval").body)
        if isinstance(node, ast.BinOp):
            return self.annotation(node.left) | self.annotation(node.right)
        if isinstance(node, ast.Subscript) and _name(node.value) in ("Optional", "Union"):
            inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return set().union(*(self.annotation(e) for e in inner))
        name = _name(node)
        if name in self.table.sections:
            return {name}
        return {f"@{name}"} if name in self.classes else set()

    def function_env(self, fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, outer: Env,
                     cls: str | None = None) -> Env:
        """``outer`` plus the function's parameters (``self``: its class) and local assignments."""
        env = dict(outer)
        params = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
        for i, arg in enumerate(params):
            env[arg.arg] = ({f"@{cls}"} if cls and i == 0 and arg.arg in ("self", "cls")
                            else self.annotation(getattr(arg, "annotation", None)))
        body = fn.body if isinstance(fn.body, list) else []
        for _ in range(2):  # a local typed from another local assigned after it in the text
            for stmt in _own_statements(body):
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                    env[stmt.targets[0].id] = env.get(stmt.targets[0].id, set()) | self.expr(stmt.value, env)
                elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    env[stmt.target.id] = self.annotation(stmt.annotation) | (
                        self.expr(stmt.value, env) if stmt.value is not None else set())
        return env

    def expr(self, node: ast.expr, env: Env) -> set[str]:
        """The classes ``node`` may hold."""
        if isinstance(node, ast.Name):
            return env.get(node.id, set())
        if isinstance(node, ast.Attribute):
            return set().union(*(self.attribute(owner, node.attr) for owner in self.expr(node.value, env)))
        if isinstance(node, ast.BoolOp):
            return set().union(*(self.expr(v, env) for v in node.values))
        if isinstance(node, ast.IfExp):
            return self.expr(node.body, env) | self.expr(node.orelse, env)
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in self.table.sections:
                return {func.id}  # a section's constructor
            if isinstance(func, ast.Attribute) and func.attr in ("of", "model_validate", "model_copy"):
                owner = func.value
                return {owner.id} if isinstance(owner, ast.Name) and owner.id in self.table.sections \
                    else self.expr(owner, env)
        return set()

    def attribute(self, owner: str, attr: str) -> set[str]:
        """The classes ``owner.attr`` may hold: a section's sub-section, a source class's attribute."""
        if not owner.startswith("@"):
            sub = self.table.sub_sections.get((owner, attr))
            return {sub} if sub else set()
        info = self.classes.get(owner[1:])
        if info is None or (owner, attr) in self._busy:
            return set()
        self._busy.add((owner, attr))
        try:
            found = self.annotation(info.annotated.get(attr))
            for value, env in info.assigned.get(attr, []):
                found |= self.expr(value, env)
            for base in info.bases:
                found |= self.attribute(f"@{base}", attr) if base in self.classes else set()
            return found
        finally:
            self._busy.discard((owner, attr))


def _own_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a function body, into its blocks but not into nested functions or classes."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for name in ("body", "orelse", "finalbody", "handlers"):
            yield from _own_statements(getattr(stmt, name, []) or [])


# --- the reads -------------------------------------------------------------------------------


def reads_in(tree: ast.Module, typer: Typer) -> Iterator[tuple[str, int, bool]]:
    """``(key, line, by a computed name)`` of every read of a key in ``tree`` (see the module doc
    for the rule; a ``getattr`` with a computed name reads every field of its section)."""
    table = typer.table

    def visit(node: ast.AST, env: Env, cls: str | None) -> Iterator[tuple[str, int, bool]]:
        if isinstance(node, ast.ClassDef):
            if node.name in table.sections:
                return  # validators and copies (``of``): no use of a value
            for child in node.body:
                yield from visit(child, env, node.name)
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            inner = typer.function_env(node, env, cls)
            for child in (node.body if isinstance(node.body, list) else [node.body]):
                yield from visit(child, inner, None)
            return
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            for owner in typer.expr(node.value, env):
                for key in table.reads(owner, node.attr):
                    yield key, node.lineno, False
        if isinstance(node, ast.Call) and _name(node.func) == "getattr" and len(node.args) >= 2:
            name = node.args[1]
            literal = isinstance(name, ast.Constant) and isinstance(name.value, str)
            for owner in typer.expr(node.args[0], env):
                for key in table.reads(owner, name.value) if literal else table.all_keys(owner):
                    yield key, node.lineno, not literal
        for child in ast.iter_child_nodes(node):
            yield from visit(child, env, cls)

    module_env: Env = {}
    for stmt in tree.body:  # module-level names typed by their assignments
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            module_env[stmt.targets[0].id] = typer.expr(stmt.value, module_env)
    for stmt in tree.body:
        yield from visit(stmt, module_env, None)


# --- where modules run -----------------------------------------------------------------------


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(name: str, tree: ast.Module, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``name``'s module imports, anywhere in it."""
    found = set()
    package = name.split(".")[:-1]  # a relative import of level 1 starts here
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *filter(None, [base])])
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
    return found & modules


def reach(roots: Iterable[str], graph: dict[str, set[str]]) -> set[str]:
    """The modules ``roots`` import, transitively, themselves included."""
    seen: set[str] = set()
    todo = [r for r in roots if r in graph]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module] - seen)
    return seen


def runs_of(modules: set[str], graph: dict[str, set[str]], backends: list[Backend]) -> dict[str, set[Backend]]:
    """Module -> the backends it runs with; empty: it runs in every run (the driver's, or
    imported by every backend of one kind)."""
    reached = {b: reach(b.roots, graph) for b in backends}
    kinds = {b.kind for b in backends}
    runs = {}
    for module in modules:
        with_module = {b for b in backends if module in reached[b]}
        everywhere = any(all(b in with_module for b in backends if b.kind == k) for k in kinds)
        runs[module] = set() if everywhere else with_module
    return runs


# --- the check -------------------------------------------------------------------------------


def unread(table: KeyTable, reads: dict[str, set[str]], runs: dict[str, set[Backend]], backends: list[Backend],
           refused: dict[str, set[Backend]]) -> list[str]:
    """One line per key and backend with which no reader of the key runs and that does not
    refuse it: ``key: unread on <kind> backend <name> (declared at <path:line (Class.attr)>)``;
    ``unread on every backend`` for a key no code reads and no backend refuses; ``unread on
    <kind> backend <a> with <kind> backend <b>`` for a pair only. ``reads``: key -> its reading
    modules; ``runs``: module -> the backends it runs with (:func:`runs_of`); ``refused``: key ->
    the backends that refuse it."""
    kinds = dict.fromkeys(b.kind for b in backends)
    pairs = list(itertools.product(*([b for b in backends if b.kind == k] for k in kinds)))  # one backend per kind
    lines = []
    for key in sorted(table.declared):
        where = f"(declared at {table.declared[key]})"
        readers, refusing = reads.get(key, set()), refused.get(key, set())
        if not readers and not refusing:
            lines.append(f"{key}: unread on every backend {where}")
            continue
        missing = [pair for pair in pairs if not set(pair) & refusing
                   and not any(not runs[m] or runs[m] & set(pair) for m in readers)]
        whole = [b for b in backends if missing and all(pair in missing for pair in pairs if b in pair)]
        lines += [f"{key}: unread on {b.kind} backend {b.name} {where}" for b in whole]
        lines += [f"{key}: unread on {' with '.join(f'{b.kind} backend {b.name}' for b in pair)} {where}"
                  for pair in missing if not set(pair) & set(whole)]
    return lines


@dataclass
class ReadSites:
    """What :func:`read_sites` found: ``reads`` (key -> the modules that read it), ``by_name``
    (``module:line`` of each ``getattr`` by a computed name on a section: it reads every field,
    so it can hide a key no other code reads) and the parsed ``trees`` (module -> syntax tree)."""

    reads: dict[str, set[str]]
    by_name: set[str]
    trees: dict[str, ast.Module]


def read_sites(sources: dict[str, Path], table: KeyTable) -> ReadSites:
    """The reads of the keys in ``sources`` (module -> path)."""
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in sources.items()}
    typer = Typer(table, trees)
    found = ReadSites({}, set(), trees)
    for name, tree in trees.items():
        for key, line, by_name in reads_in(tree, typer):
            found.reads.setdefault(key, set()).add(name)
            if by_name:
                found.by_name.add(f"{name}:{line}")
    return found


def check(table: KeyTable, sources: dict[str, Path], backends: list[Backend],
          refused: dict[str, set[Backend]], sites: ReadSites | None = None) -> list[str]:
    """The unread keys (:func:`unread`) of ``sources`` (module -> path; ``sites``: their
    :func:`read_sites`, if found already)."""
    sites = sites or read_sites(sources, table)
    reads, trees = sites.reads, sites.trees
    modules = set(trees)
    graph = {name: imports_of(name, tree, modules) for name, tree in trees.items()}
    for b in backends:
        missing = [r for r in b.roots if r not in modules]
        if missing:
            raise ValueError(f"{b.kind} backend {b.name}: no module {missing} in the sources")
    return unread(table, reads, runs_of(modules, graph, backends), backends, refused)


# --- which backends refuse a key ---------------------------------------------------------------


def off_default(info: Any) -> list[Any]:
    """Values off a field's default to probe it with, the likeliest to be valid first: the other
    bool, the other choices of a ``Literal``, a number doubled, halved, moved by one or a half,
    a shorter or reversed list, another string."""
    default = info.get_default(call_default_factory=True)

    def candidates(kind: Any) -> list[Any]:
        origin = get_origin(kind)
        if origin is Literal:
            return list(get_args(kind))
        if origin in (Union, UnionType):
            return [v for arg in get_args(kind) for v in candidates(arg)]
        if origin is list:
            return [default[:1], default[::-1], [*default, *default[:1]]] if isinstance(default, list) else []
        if kind is bool:
            return [not default]
        if kind is int:
            base = default if isinstance(default, int) else 1
            return [base * 2, base + 1, base // 2, 2, 8]
        if kind is float:
            base = float(default) if isinstance(default, int | float) else 1.0
            return [base / 2, base + 0.5, 0.5, 2.5]
        if kind is str:
            return ["never" if default == "auto" else "probe"]
        return []

    return [v for v in candidates(info.annotation) if v != default or type(v) is not type(default)]


def refusals(fields: dict[str, Any], backends: list[Backend],
             rejects: Any) -> dict[str, set[Backend]]:
    """key -> the backends that refuse it: with the first value off its default (:func:`off_default`)
    that some backend accepts, ``rejects(backend, key, value)`` is true. A key no backend accepts
    off its default is refused by all. ``fields``: key -> its pydantic field."""
    refused = {}
    for key, info in fields.items():
        for value in off_default(info):
            rejected = {b for b in backends if rejects(b, key, value)}
            if rejected != set(backends):
                break
        refused[key] = rejected
    return refused
