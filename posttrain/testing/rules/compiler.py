"""Parse a rule and check it against the whitelist, before anything runs.

A rule is parsed with ``ast.parse(rule, mode="eval")``; every node must be a literal, the
name ``data``, a subscript, arithmetic, a comparison, ``and``/``or``/``not``, a list or
tuple, or a call of a helper in ``helpers.HELPERS`` whose arguments bind to its
signature. Anything else is a :class:`~errors.RuleError` naming the construct.
"""

from __future__ import annotations

import ast
import inspect
import operator
from collections.abc import Callable
from typing import Any

from posttrain.testing.rules.comparisons import NODES as COMPARISON_NODES
from posttrain.testing.rules.errors import RuleError
from posttrain.testing.rules.helpers import HELPERS

# fmt: off
BIN_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: lambda a, b: float(a) ** float(b),  # float: no 10**10**10 big-int DoS
}
_ALLOWED = (
    ast.Expression, ast.Constant, ast.Name, ast.Load, ast.Subscript, ast.BinOp,
    ast.UnaryOp, ast.USub, ast.UAdd, ast.Not, ast.Compare, ast.BoolOp, ast.And,
    ast.Or, ast.Call, ast.keyword, ast.List, ast.Tuple, *BIN_OPS, *COMPARISON_NODES,
)
_NAMES = {  # what a disallowed node is called in the error message
    ast.Attribute: "attribute access", ast.Lambda: "lambda", ast.ListComp: "comprehension",
    ast.SetComp: "comprehension", ast.DictComp: "comprehension",
    ast.GeneratorExp: "generator expression", ast.JoinedStr: "f-string",
    ast.Starred: "starred argument", ast.NamedExpr: "assignment expression (:=)",
    ast.IfExp: "conditional expression", ast.Slice: "slice", ast.Await: "await",
}
# fmt: on


def _disallowed(node: ast.AST) -> str | None:
    """Why ``node`` is outside the whitelist, or None if it is allowed."""
    helpers = ", ".join(HELPERS)
    if not isinstance(node, _ALLOWED):
        what = _NAMES.get(type(node), f"{type(node).__name__} expression")
        if isinstance(node, ast.expr):
            what = f"{what} `{ast.unparse(node)}`"
        return f"{what} is not allowed"
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, (int, float, str, type(None))):
            return f"constant {node.value!r} is not allowed"
        if isinstance(node.value, str) and "__" in node.value:
            return f"dunder string {node.value!r} is not allowed"
    if isinstance(node, ast.Name) and node.id != "data":
        return f"name '{node.id}' is not allowed (only `data` and calls of {helpers})"
    if isinstance(node, ast.Call):
        if any(k.arg is None for k in node.keywords):
            return "**kwargs is not allowed"
        if not isinstance(node.func, ast.Name):
            callee = ast.unparse(node.func)
            return _disallowed(node.func) or f"call of `{callee}` is not allowed"
        if node.func.id not in HELPERS:
            return f"call of `{node.func.id}` is not allowed (helpers: {helpers})"
        try:  # wrong arity or keyword names are caught here, before anything runs
            kwargs = {k.arg: k.value for k in node.keywords if k.arg}
            inspect.signature(HELPERS[node.func.id]).bind(*node.args, **kwargs)
        except TypeError as e:
            return f"`{ast.unparse(node)}`: {e}"
    return None


def _check_tree(node: ast.AST, quoted: str) -> None:
    """Raise RuleError for the first disallowed node (a Call's ``func`` is checked by
    :func:`_disallowed`, not visited: helper names are allowed only as callees)."""
    reason = _disallowed(node)
    if reason:
        raise RuleError(f"rule {quoted}: {reason}")
    children = [*node.args, *node.keywords] if isinstance(node, ast.Call) else ast.iter_child_nodes(node)
    for child in children:
        _check_tree(child, quoted)


MAX_RULE_CHARS = 2000  # the longest real rule is ~120; the parser's memory grows with nesting
MAX_DEPTH = 64  # expression nesting the (recursive) interpreter is asked to follow


def shown(rule: str, limit: int = 100) -> str:
    """``rule`` as an error message quotes it: repr, cut to ``limit`` characters."""
    text = repr(rule)
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


def _depth(tree: ast.AST) -> int:
    """Nesting depth of ``tree``, walked without recursion."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in ast.iter_child_nodes(node))
    return deepest


def compile_rule(rule: str) -> ast.Expression:
    """Parse a rule and check every node against the whitelist.

    Args:
        rule: a Python-syntax expression over ``data``.

    Returns:
        The parsed ``ast.Expression``, for :func:`evaluate`.

    Raises:
        RuleError: a syntax error or a disallowed construct (attribute access, names
            other than ``data``/helpers, lambdas, comprehensions, f-strings, starred
            arguments, dunder strings, unknown helper keywords, ...); text that is not
            UTF-8 (bytes a shell passed through undecoded), longer than
            ``MAX_RULE_CHARS`` or nested deeper than ``MAX_DEPTH``. The message is one line
            and quotes at most the first 100 characters of the rule.
    """
    try:
        rule.encode("utf-8")
    except UnicodeEncodeError as e:
        byte = rule[e.start].encode("utf-8", "surrogateescape")
        raise RuleError(f"rule {shown(rule)}: not UTF-8 text (byte 0x{byte.hex()} at character {e.start})") from None
    if len(rule) > MAX_RULE_CHARS:
        raise RuleError(f"rule {shown(rule)}: {len(rule)} characters, more than the {MAX_RULE_CHARS} allowed")
    try:
        tree = ast.parse(rule, mode="eval")
    except SyntaxError as e:
        raise RuleError(f"rule {shown(rule)}: invalid syntax ({e.msg})") from None
    except (RecursionError, MemoryError):
        raise RuleError(f"rule {shown(rule)}: nested too deeply to parse") from None
    if _depth(tree) > MAX_DEPTH:
        raise RuleError(f"rule {shown(rule)}: nested more than {MAX_DEPTH} levels deep")
    _check_tree(tree, shown(rule))
    return tree
